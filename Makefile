# Two commands do all setup on a fresh machine: `make demo` and `make test`.
# Both create .venv, install the CPU build of torch where no torch is importable, and install stepgap.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU ?= torch==2.13.0

.PHONY: install demo test bench clean

install: $(VENV)/.installed

# A GPU machine that already has torch in its system python keeps it (the venv sees system packages).
$(VENV)/.installed: pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	    $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q $(TORCH_CPU); \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

demo: install
	$(PY) -m stepgap demo

test: install
	$(PY) -m pytest -q -m "not slow"

bench: install
	$(PY) -m pytest -q -m slow
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
