# `make train` and `make test` create .venv with the pinned requirements on
# first use. WORKDIR and CONFIG choose the run; MNIST_MANUAL_DIR (if set)
# names the directory of the original MNIST files for offline preparation.
# requirements.txt pins every package, dependencies included: see its header
# for why pip installs it with --no-deps.
PYTHON ?= python3
VENV := .venv
WORKDIR ?= $(HOME)/mnist
CONFIG ?= configs/default.py

$(VENV)/installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet --no-deps -r requirements.txt
	touch $@

.PHONY: venv train test format-check
venv: $(VENV)/installed

train: venv
	$(VENV)/bin/python main.py --workdir=$(WORKDIR) --config=$(CONFIG)

test: venv
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile

# The formatting of the Flax examples (pyink; settings in pyproject.toml).
format-check: venv
	$(VENV)/bin/pyink --check .
