"""The engine loop's shortcuts give the results of the long way round, exactly.

* An uncut decode run is one plain timeout (`Batcher.fast_decode_runs`, on by default) instead of
  a timer and a wake-up: runs with it on and off give the same per-request table, trace rows,
  metrics and engine counters, on synthetic workloads (roofline step cost, several batching modes,
  block reservation on and off, memory tight enough to preempt) and on the transformers profile
  (fitted step cost, async scheduling, its preemption rule).
* The roofline step cost from plain-int sums (`iteration_us_ints`) is the float that the array
  path gives.
* Operation count, not time: the shortcut schedules fewer SimPy events per request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.components.step_cost import RooflineStepCost
from cachepilot_sim.config import BatcherConfig, BatchMode, SimConfig
from cachepilot_sim.cost import compute_fit
from cachepilot_sim.sim import build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.ground_truth import GroundTruth
from cachepilot_sim.validation.replay import workload_from_ground_truth
from tests.conftest import make_sim_config, make_workload


def _run(cfg: SimConfig, fast: bool, replay: Any = None) -> dict[str, Any]:
    """One run; its outputs and the number of SimPy events it processed."""
    sim = build(cfg, None, replay)
    sim.batcher.fast_decode_runs = fast
    events = [0]

    def count(num_events: int) -> None:
        events[0] = num_events

    result = sim.run(on_progress=count, every_events=1)
    return {
        "requests": result.requests,
        "trace": result.trace,
        "metrics": result.metrics,
        "stats": sim.batcher.stats,
        "events": events[0],
        "now": sim.env.now,
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["requests"].equals(b["requests"], null_equal=True)
    assert a["trace"].equals(b["trace"], null_equal=True)
    assert a["metrics"] == b["metrics"]
    sa, sb = a["stats"], b["stats"]
    assert (sa.iterations, sa.busy_us, sa.tokens_decoded, sa.kv_peak_bytes) == (
        sb.iterations,
        sb.busy_us,
        sb.tokens_decoded,
        sb.kv_peak_bytes,
    )
    assert sa.itl_gaps == sb.itl_gaps
    assert a["now"] == b["now"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(list(BatchMode)),
    max_run=st.sampled_from([1, 7, 64, 256]),
    reserve=st.booleans(),
    vram_gb=st.sampled_from([9.5, 10.0, 16.0]),
    rate=st.sampled_from([0.2, 2.0]),
)
def test_plain_timeout_runs_give_the_timer_and_wake_results(
    seed: int, mode: BatchMode, max_run: int, reserve: bool, vram_gb: float, rate: float
) -> None:
    cfg = make_sim_config(
        seed=seed,
        vram_gb=vram_gb,
        workload=make_workload(num_requests=40, session_rate_per_s=rate),
        batcher=BatcherConfig(mode=mode, max_decode_run=max_run, reserve_run_blocks=reserve),
    )
    fast, slow = _run(cfg, True), _run(cfg, False)
    _assert_same(fast, slow)
    assert fast["events"] <= slow["events"]


def _pressure_replay() -> GroundTruth:
    """Long replies into a small pool, sent 40 ms apart: decodes preempt under the hf_cb rules."""
    n = 24
    frame = pl.DataFrame(
        {
            "request_id": [f"r{i:03d}" for i in range(n)],
            "send_us": [i * 40_000 for i in range(n)],
            "prompt_tokens": [300 + 37 * (i % 7) for i in range(n)],
            "output_tokens": [200 + 53 * (i % 5) for i in range(n)],
            "first_token_us": [0] * n,
            "end_us": [0] * n,
            "status": ["finished"] * n,
        }
    )
    return GroundTruth(Path("synthetic"), frame, None, {})


def test_the_transformers_profile_gives_the_same_results_either_way() -> None:
    run_cfg = sim_config("hf_cb", ["trace.enabled=true", "trace.iteration_every=1"])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, _ = workload_from_ground_truth(_pressure_replay(), cfg.replay.hash_block_tokens)
    fast, slow = _run(cfg, True, workload), _run(cfg, False, workload)
    _assert_same(fast, slow)
    assert fast["events"] <= slow["events"]


def test_an_uncut_decode_run_takes_fewer_events() -> None:
    """Sessions far apart: most runs end before the next arrival, and each such run saves the
    wake-up event (two events become one)."""
    cfg = make_sim_config(workload=make_workload(num_requests=30, session_rate_per_s=0.05))
    fast, slow = _run(cfg, True), _run(cfg, False)
    _assert_same(fast, slow)
    assert fast["events"] < slow["events"]
    # Each finished request had at least one uncut run in a workload this sparse.
    assert slow["events"] - fast["events"] >= len(fast["requests"]) // 2


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 8192), st.integers(0, 131_072), st.sampled_from([65536, 131072])),
        min_size=1,
        max_size=64,
    )
)
def test_int_sums_give_the_array_paths_float(rows: list[tuple[int, int, int]]) -> None:
    cfg = make_sim_config()
    cost = RooflineStepCost(compute_fit(cfg.hardware), [float(cfg.models[0].weight_bytes)])
    new, ctx, tok = (list(col) for col in zip(*rows, strict=True))
    arrays = cost.iteration_us(
        np.array(new, dtype=np.float64),
        np.array(ctx, dtype=np.int64),
        np.array(tok, dtype=np.int64),
        np.zeros(len(rows), dtype=np.int64),
    )
    assert cost.iteration_us_ints(new, ctx, tok) == arrays


def test_int_sums_step_aside_where_floats_would_round() -> None:
    cfg = make_sim_config()
    cost = RooflineStepCost(compute_fit(cfg.hardware), [float(cfg.models[0].weight_bytes)])
    assert cost.iteration_us_ints([1], [2**40], [2**14]) is None  # 2^54 KV bytes
    two = RooflineStepCost(compute_fit(cfg.hardware), [1.0, 2.0])
    assert two.iteration_us_ints([1], [10], [10]) is None  # several models: the array path
