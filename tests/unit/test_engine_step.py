"""The fitted engine step cost (cost/engine_step.py) and the hf_cb profile's committed fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.cost.engine_step import FEATURES, EngineStepFit, decode_run_us, engine_step_us
from cachepilot_sim.tools.fit_engine import fit_steps, load_micro_steps

ROOT = Path(__file__).resolve().parents[2]
MICRO = ROOT / "experiments/validation/hf_cb/2026-12-01/microbench/steps.parquet"


def make_fit(**overrides: float) -> EngineStepFit:
    values = dict.fromkeys(FEATURES, 1.0) | overrides
    return EngineStepFit(**values)  # type: ignore[arg-type]


def test_empty_step_costs_nothing() -> None:
    assert engine_step_us(make_fit(), np.zeros(0), np.zeros(0)) == 0.0


@given(st.lists(st.integers(0, 4000), min_size=1, max_size=40), st.integers(1, 50))
def test_decode_run_equals_step_by_step(ctx: list[int], k: int) -> None:
    fit = make_fit()
    c = np.asarray(ctx, dtype=np.int64)
    run = decode_run_us(fit, c, k)
    for j in range(k):
        one = engine_step_us(fit, np.ones(c.size), c + j)
        assert np.isclose(run[j], one)


@given(st.lists(st.integers(0, 4000), min_size=1, max_size=40))
def test_step_cost_grows_with_context(ctx: list[int]) -> None:
    fit = make_fit()
    c = np.asarray(ctx, dtype=np.int64)
    assert engine_step_us(fit, np.ones(c.size), c + 1) >= engine_step_us(fit, np.ones(c.size), c)


def test_committed_profile_matches_a_fresh_fit_of_the_micro_runs() -> None:
    fit, resid = fit_steps(load_micro_steps(MICRO), 256)
    text = (CONF_DIR / "engine" / "hf_cb.yaml").read_text()
    engine = yaml.safe_load(text)["engine"]
    for name in FEATURES:
        assert np.isclose(engine[name], getattr(fit, name), rtol=1e-9), name
    assert np.median(np.abs(resid)) < 0.02  # stated in README: median |residual| 1.3 %
