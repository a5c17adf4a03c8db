"""The fitted engine step cost (cost/engine_step.py) and the hf_cb profile's committed fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config.base import ConfigError
from cachepilot_sim.config.engine_profile import EngineConfig
from cachepilot_sim.cost.engine_step import (
    FEATURES,
    EngineStepFit,
    decode_run_us,
    engine_step_us,
    fit_engine_step,
    step_features,
)
from cachepilot_sim.tools.fit_engine import fit_steps, load_micro_steps

ROOT = Path(__file__).resolve().parents[2]
MICRO = [
    ROOT / "experiments/validation/hf_cb" / folder / "steps.parquet"
    for folder in (
        "2026-12-01/microbench",
        "2026-12-01/microbench_mixed",
        "2026-12-02-small/microbench_small",
    )
]
SHAPES = 8  # the engine's 2048-token budget over its 256-token query padding


def make_fit(**overrides: float) -> EngineStepFit:
    values = dict.fromkeys(FEATURES, 1.0) | overrides
    return EngineStepFit(**values)  # type: ignore[arg-type]


def make_shape_fit() -> EngineStepFit:
    values = dict.fromkeys(FEATURES, 1.0) | {"const_us": 0.0, "q_padded_token_us": 0.0}
    return EngineStepFit(**values, q_shape_us=(100.0, 180.0, 250.0))  # type: ignore[arg-type]


def test_shape_table_prices_the_padded_query_shape() -> None:
    fit = make_shape_fit()
    base = make_fit(const_us=0.0, q_padded_token_us=0.0)
    ctx = np.array([10, 20])
    for q, expected in ((1, 100.0), (256, 100.0), (257, 180.0), (700, 250.0), (5000, 250.0)):
        new = np.array([1, q - 1]) if q > 1 else np.array([1])
        c = ctx[: new.size]
        assert np.isclose(engine_step_us(fit, new, c) - engine_step_us(base, new, c), expected)


def test_shape_fit_recovers_a_table_it_was_generated_from() -> None:
    rng = np.random.default_rng(3)
    n = 400
    q = rng.integers(1, 2049, n)
    kv = rng.integers(0, 50_000, n)
    seqlen = rng.integers(1, 4000, n)
    prefill = np.where(rng.random(n) < 0.5, q, 0)
    reqs = rng.integers(1, 64, n)
    x = step_features(q, kv, seqlen, prefill, reqs, 256, SHAPES)
    truth = np.array([*np.linspace(12_000, 75_000, SHAPES), 0.2, 0.1, 0.8, 0.5, 0.9, 50.0])
    fit, resid = fit_engine_step(x, x @ truth, 256, SHAPES)
    assert np.allclose(fit.q_shape_us, truth[:SHAPES], rtol=1e-6)
    assert np.allclose(fit.coefficients(), truth, rtol=1e-6)
    assert np.abs(resid).max() < 1e-9


def test_nonpositive_shape_time_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.q_shape_us"):
        EngineConfig(q_shape_us=[100.0, 0.0])


def test_empty_step_costs_nothing() -> None:
    assert engine_step_us(make_fit(), np.zeros(0), np.zeros(0)) == 0.0


@given(
    st.lists(st.integers(0, 4000), min_size=1, max_size=300),
    st.integers(1, 50),
    st.booleans(),
)
def test_decode_run_equals_step_by_step(ctx: list[int], k: int, table: bool) -> None:
    fit = make_shape_fit() if table else make_fit()
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
    fit, resid = fit_steps(load_micro_steps(*MICRO), 256, SHAPES)
    text = (CONF_DIR / "engine" / "hf_cb.yaml").read_text()
    engine = yaml.safe_load(text)["engine"]
    for name in FEATURES:
        assert np.isclose(engine[name], getattr(fit, name), rtol=1e-9), name
    assert np.allclose(engine["q_shape_us"], fit.q_shape_us, rtol=1e-9)
    assert np.median(np.abs(resid)) < 0.02  # stated in README: median |residual| 1.1 %
