# Two commands: `make demo` (train + sample on the embedded corpus) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CHROMIUM ?= /usr/bin/chromium

.PHONY: demo test install bench clean browser fonts docs docs-serve

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build on local disk (a bare `torch` pulls a multi-GB CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# About 3 minutes of training on the embedded corpus; ends with validation bits per character
# beside gzip -9 and xz -9e on the same held-out text, then a sample.
demo: $(STAMP)
	$(VENV)/bin/qkv train --preset demo --out runs/demo --overwrite --sample-tokens 0
	$(VENV)/bin/qkv sample --run runs/demo --prompt "def " --max-new-tokens 300 --temperature 0.8 --seed 0

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
