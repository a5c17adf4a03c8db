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

BENCH_OUT ?= outputs/gpu
.PHONY: bench-gpu
bench-gpu:  ## on a GPU host (python3 with torch, cupy, triton): check + time all kernels, then calibrate
	python3 -m cachepilot_sim.kernels.bench --out $(BENCH_OUT)/bench
	python3 -m cachepilot_sim.calibrate --out $(BENCH_OUT)/calibration
