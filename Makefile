# Two commands: `make demo` (train + sample on the embedded corpus) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build on local disk (a bare `torch` pulls a multi-GB CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/qkv train --preset demo --out runs/demo --overwrite
	$(VENV)/bin/qkv sample --run runs/demo --prompt "def " --max-new-tokens 300

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
