# Two commands on a fresh machine: `make run` and `make test`. Every install step lives here.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# `make run`: the seed scenario on the validated engine model (EXPERIMENT=mixed_spike: the same
# scenario on the idealised, unvalidated default engine)
EXPERIMENT ?= mixed_spike_hf_cb

.PHONY: run test test-fuzz install install-dev lint bench clean install-vllm-policy test-vllm \
	bench-vllm-evictor

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

install: $(PY)
	$(PY) -m pip install -e .

# dev tools plus torch/triton for the kernel tests (pyproject's `triton` extra).
install-dev: $(PY)
	$(PY) -m pip install -e '.[dev,triton]'

run: install
	$(PY) -m cachepilot_sim +experiment=$(EXPERIMENT)

# Two pytest-xdist workers (CI has 2 cores); tests sharing a module- or session-scoped fixture
# run on one worker, and `exclusive` tests alone (tests/conftest.py).
TEST_WORKERS ?= 2
test: install-dev
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

# Nightly-size fuzzing: 10^6 state-machine steps per KV manager (CI runs 5 x 10^4 each).
test-fuzz: install-dev
	CACHEPILOT_FUZZ_STEPS=1000000 $(PY) -m pytest tests/property/test_kv_state_machine.py
	CACHEPILOT_FUZZ_EXAMPLES=2000 $(PY) -m pytest tests/property/test_entry_fuzz.py

lint: install-dev
	$(VENV)/bin/ruff check cachepilot_sim tests experiments
	$(VENV)/bin/mypy

bench: install
	$(PY) experiments/bench_sim_speed.py

# vLLM 0.33 next to the dev torch (2.13.0 CPU): the wheel without its dependencies, plus the few
# packages its KV-offload policy modules import. Runs the tests that the default suite skips.
install-vllm-policy: install-dev
	$(PY) -m pip install --no-deps 'vllm==0.33.*'
	$(PY) -m pip install -e '.[vllm-policy]'

test-vllm: install-vllm-policy
	$(PY) -m pytest tests/unit/test_vllm_real.py

# The two tables of experiments/vllm_evictor/README.md (PERC, reuse_forecast, vLLM's LRU and ARC).
bench-vllm-evictor: install-vllm-policy
	for n in 1000 4000; do $(PY) -m cachepilot_sim.integrations.vllm.evictor_bench \
		--decisions $$n --repeats 3 --out experiments/vllm_evictor/decisions_$$n || exit 1; done

clean:
	rm -rf outputs multirun .pytest_cache .hypothesis

BENCH_OUT ?= outputs/gpu
.PHONY: bench-gpu
bench-gpu:  ## on a GPU host (python3 with torch, cupy, triton): check + time all kernels, then calibrate
	python3 -m cachepilot_sim.kernels.bench --out $(BENCH_OUT)/bench
	python3 -m cachepilot_sim.tools.calibrate --out $(BENCH_OUT)/calibration
