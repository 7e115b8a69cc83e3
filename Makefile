# `make train` and `make test` create .venv from uv.lock on first use, and
# again when it changes. uv comes from the PATH, or is installed from PyPI
# into .uv/: a fresh machine needs nothing but python3. WORKDIR and CONFIG
# choose the run; MNIST_MANUAL_DIR (if set) names the directory of the
# original MNIST files for offline preparation.
PYTHON ?= python3
VENV := .venv
WORKDIR ?= $(HOME)/mnist
CONFIG ?= configs/default.py
UV_VERSION := 0.13.9
UV := $(or $(shell command -v uv 2>/dev/null),.uv/bin/uv)
# The interpreter itself, not a shim (pyenv's), which uv would not take: uv
# then looks for one to download. It downloads none.
PYTHON_EXE = $(shell $(PYTHON) -c 'import sys; print(sys.executable)')
export UV_PYTHON_DOWNLOADS := never
# What the tests need beside the core: the hf source, the notebook's runner.
EXTRAS := --extra hf --extra notebook

define REQUIREMENTS_HEADER
# Exported from uv.lock by `make requirements.txt`: do not edit (CI checks
# it). Every package that `make test` installs, for pip users:
#   pip install --no-deps -r requirements.txt
# --no-deps: tensorflow-serving-api declares `tensorflow`, which pip would
# install in full beside tensorflow-cpu; uv.lock overrides that away.
endef
export REQUIREMENTS_HEADER
EXPORT = $(UV) export --locked --no-hashes --no-header $(EXTRAS)

.uv/bin/uv:
	$(PYTHON) -m venv .uv
	.uv/bin/pip install --quiet uv==$(UV_VERSION)

# Bytecode compiled at install, as pip does: otherwise the tests' many
# processes compile JAX and TensorFlow's modules on first import.
$(VENV)/installed: uv.lock pyproject.toml | $(UV)
	$(UV) sync --locked --compile-bytecode $(EXTRAS) --python $(PYTHON_EXE)
	touch $@

.PHONY: venv train test quick format-check lock requirements-check smoke
venv: $(VENV)/installed

train: venv
	$(VENV)/bin/python main.py --workdir=$(WORKDIR) --config=$(CONFIG)

test: venv
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile

# The quick tier, for the inner loop: no training run, server, browser or
# process that starts TensorFlow (pytest.ini's `slow` marker).
quick: venv
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile -m "not slow"

# The formatting of the Flax examples (pyink; settings in pyproject.toml).
format-check: venv
	$(VENV)/bin/pyink --check .

# After a change of pyproject.toml's dependencies.
lock: | $(UV)
	$(UV) lock
	$(MAKE) requirements.txt

requirements.txt: uv.lock | $(UV)
	{ echo "$$REQUIREMENTS_HEADER"; $(EXPORT); } > $@

requirements-check: | $(UV)
	{ echo "$$REQUIREMENTS_HEADER"; $(EXPORT); } | diff -u requirements.txt -

# Another Python (make smoke PYTHON=python3.12): its own environment from the
# lock, then a short run, the export and predict.py (tools/smoke.sh).
smoke: | $(UV)
	UV_PROJECT_ENVIRONMENT=.venv-$(PYTHON) $(UV) sync --locked --compile-bytecode --python $(PYTHON_EXE) --no-dev
	bash tools/smoke.sh .venv-$(PYTHON)/bin/python
