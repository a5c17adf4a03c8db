"""The fidelity issue's extrapolation test on real data: the physical step cost fitted on the H100's
cost micro-runs of at most 2048 queries (experiments/validation/hf_cb/2026-12-06-h100/
microbench_8k) prices that engine's 2112-8192-query steps, which it never saw, within 5 %."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from cachepilot_sim.cost.step_physical import physical_terms
from cachepilot_sim.tools.fit_physical import (
    NUM_LAYERS,
    fit_and_predict,
    load_physical_steps,
    profile_for,
    recorded_shapes,
)

H100 = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-06-h100"


def test_micro_runs_up_to_2048_queries_price_4096_to_8192_query_steps_within_5_percent() -> None:
    steps = load_physical_steps([H100 / "microbench_8k" / "steps.parquet"])
    inside = steps.filter(pl.col("q_tokens") <= 2048)
    beyond = steps.filter(pl.col("q_tokens") > 2048)
    assert beyond["q_tokens_padded"].max() == 8192 and beyond.height >= 50
    fit, report = fit_and_predict(
        profile_for(str(H100 / "gpu_profile.json")), inside, {"b": beyond}
    )
    assert report["b"]["abs_mean"] < 0.05 and abs(report["b"]["signed_mean"]) < 0.05
    big = beyond.filter(pl.col("q_tokens_padded") == 8192)
    y = big["gpu_us"].to_numpy().astype(np.float64)
    x = physical_terms(
        profile_for(str(H100 / "gpu_profile.json")), NUM_LAYERS, recorded_shapes(big)
    )
    assert abs(np.median((x @ fit.coefficients() - y) / y)) < 0.05  # the whole 8192-token budget
