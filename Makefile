# Two commands on a fresh machine: `make run` and `make test`. Every install step lives here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXPERIMENT ?= mixed_spike

.PHONY: run test install install-dev lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

install: $(PY)
	$(PY) -m pip install -e .

install-dev: $(PY)
	$(PY) -m pip install -e '.[dev]'

run: install
	$(PY) -m cachepilot_sim +experiment=$(EXPERIMENT)

test: install-dev
	$(PY) -m pytest

lint: install-dev
	$(VENV)/bin/ruff check cachepilot_sim tests experiments
	$(VENV)/bin/mypy

bench: install
	$(PY) experiments/bench_sim_speed.py

clean:
	rm -rf outputs multirun .pytest_cache .hypothesis
