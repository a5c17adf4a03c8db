"""The engine loop's shortcuts, and what they must keep.

* A decode run is one timeout; a wake-up during it (an arrival, a landed copy) ends it at the end of
  the step in progress when a request waits to be admitted, and leaves it alone otherwise: an
  arrival is admitted at the first step boundary after it, as the engine admits.
* The roofline step cost from plain-int sums (`iteration_us_ints`) is the float that the array
  path gives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.components.step_cost import RooflineStepCost
from cachepilot_sim.cost import compute_fit
from cachepilot_sim.sim import Simulation, build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.ground_truth import GroundTruth
from cachepilot_sim.validation.replay import workload_from_ground_truth
from tests.conftest import make_sim_config


def _replay(sends_us: list[int], prompts: list[int], outputs: list[int]) -> GroundTruth:
    n = len(sends_us)
    frame = pl.DataFrame(
        {
            "request_id": [f"r{i:03d}" for i in range(n)],
            "send_us": sends_us,
            "prompt_tokens": prompts,
            "output_tokens": outputs,
            "first_token_us": [0] * n,
            "end_us": [0] * n,
            "status": ["finished"] * n,
        }
    )
    return GroundTruth(Path("synthetic"), frame, None, {})


def _hf_cb_sim(truth: GroundTruth) -> Simulation:
    run_cfg = sim_config("hf_cb", ["trace.enabled=true", "trace.iteration_every=1"])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, _ = workload_from_ground_truth(truth, cfg.replay.hash_block_tokens)
    return build(cfg, None, workload)


def _run_until_decoding(sim: Simulation) -> tuple[int, list[int]]:
    """Step the simulation until its engine is inside a decode run; the run's start and step
    ends (µs after the start)."""
    env, batcher = sim.env, sim.batcher
    while batcher._run is None:
        env.step()
    start, ends, _timer = batcher._run
    return start, ends


@settings(max_examples=10, deadline=None)
@given(offset=st.floats(0.05, 0.95), step=st.integers(2, 40))
def test_an_arrival_joins_at_the_end_of_the_step_in_progress(offset: float, step: int) -> None:
    """A decodes alone; B arrives inside step `step` of A's run (at `offset` of it): B is
    admitted exactly at that step's end, not at the run's planned end nor at its arrival."""
    probe = _hf_cb_sim(_replay([0], [200], [600]))
    start, ends = _run_until_decoding(probe)
    assert len(ends) > step
    before = ends[step - 1]
    send = start + before + max(1, int(offset * (ends[step] - before)))
    assert send < start + ends[step]
    sim = _hf_cb_sim(_replay([0, send], [200, 100], [600, 20]))
    requests = sim.run().requests.sort("request")
    assert requests["outcome"].to_list() == ["completed", "completed"]
    assert requests["arrival_us"][1] == send
    assert requests["admitted_us"][1] == start + ends[step]
    assert requests["first_token_us"][1] > start + ends[step]  # its prefill: a later step


def test_a_wake_up_with_nothing_queued_leaves_the_run_alone() -> None:
    """A landed copy (or any notify) with no request queued does not end a decode run: the
    engine still waits on the run's own timeout, and resumes at its planned end."""
    sim = _hf_cb_sim(_replay([0], [200], [600]))
    start, ends = _run_until_decoding(sim)
    batcher, env = sim.batcher, sim.env
    assert batcher._run is not None
    timer = batcher._run[2]
    env.run(until=start + ends[0] + 1)  # inside the run's second step
    batcher.wake.notify()
    assert batcher._run is not None and batcher._process.target is timer
    env.run(until=start + ends[-1])
    assert batcher._run is not None and batcher._run[2] is timer  # not resumed before its end
    while batcher._run is not None and batcher._run[2] is timer:
        env.step()
    assert env.now == start + ends[-1]  # it ended as planned
    assert batcher.stats.tokens_decoded >= len(ends)


def test_a_run_cut_by_an_arrival_keeps_every_request_accounted() -> None:
    """Replies long enough to preempt under the hf_cb rules, requests 40 ms apart: every
    request completes, and the same run twice gives the same table and trace."""
    n = 24
    truth = _replay(
        [i * 40_000 for i in range(n)],
        [300 + 37 * (i % 7) for i in range(n)],
        [200 + 53 * (i % 5) for i in range(n)],
    )
    a, b = _hf_cb_sim(truth).run(), _hf_cb_sim(truth).run()
    assert a.requests.equals(b.requests, null_equal=True)
    assert a.trace.equals(b.trace, null_equal=True)
    assert a.metrics["completed"] == n


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
