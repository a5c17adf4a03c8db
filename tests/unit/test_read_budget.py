"""transformers CB's per-step KV read cap (`cache_budget = num_pages`, engine.kv_read_cap):
the rule on its own, and on the policy A/B capture where it decides the slowest first tokens,
against its opposite (no cap)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.components.read_budget import fit_reads
from cachepilot_sim.sim import build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.ground_truth import load_ground_truth
from cachepilot_sim.validation.replay import engine_overrides, workload_from_ground_truth
from tests.engine_runs import ground_truth

AB_LRU = Path(__file__).resolve().parents[2] / (
    "experiments/validation/hf_cb/2026-12-06-h100-policy_ab/lru/ab_sessions/run1"
)
STUCK = "ab_sessions-s002-t2"  # its 1,536-token prefix hit waits behind ~15,100 decode reads


def test_a_candidate_that_does_not_fit_is_passed_over_and_the_loop_ends_when_nothing_is_left() -> (
    None
):
    assert fit_reads([6, 5, 3, 1], 10) == [True, False, True, True]  # 6, skip 5, 3, 1: 0 left
    assert fit_reads([10, 0, 0], 10) == [True, False, False]  # nothing left: even 0 stops
    assert fit_reads([], 10) == []
    assert fit_reads([0, 0], 0) == [False, False]


def _ttft_ms(overrides: list[str]) -> dict[str, float]:
    real = load_ground_truth(AB_LRU)
    profile = sim_config("hf_cb_physical", [])
    run_cfg = sim_config("hf_cb_physical", [*engine_overrides(real, profile), *overrides])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, order = workload_from_ground_truth(real, cfg.replay.hash_block_tokens)
    reqs = build(cfg, None, workload).run().requests.sort("request")
    ttft = ((reqs["first_token_us"] - reqs["arrival_us"]) / 1e3).to_list()
    return dict(zip(order["request_id"].to_list(), ttft, strict=True))


def test_the_cap_keeps_a_prefix_hit_waiting_as_the_engine_did_and_without_it_nothing_waits() -> (
    None
):
    real = load_ground_truth(AB_LRU).requests
    row = real.filter(pl.col("request_id") == STUCK)
    measured = float((row["first_token_us"] - row["send_us"]).item()) / 1e3
    assert measured > 500  # the engine: 763 ms
    capped, free = _ttft_ms([]), _ttft_ms(["engine.kv_read_cap=false"])
    assert capped[STUCK] > 0.5 * measured
    assert free[STUCK] < 0.2 * measured  # the opposite rule admits it at once
    mean_real = float((real["first_token_us"] - real["send_us"]).mean()) / 1e3  # type: ignore[operator]
    for sim, within in ((capped, True), (free, False)):
        err = (sum(sim.values()) / len(sim) - mean_real) / mean_real
        assert (abs(err) < 0.05) == within, err


@pytest.mark.parametrize("blocks", [6, 12])
def test_every_request_completes_under_the_cap_in_a_tiny_pool(blocks: int) -> None:
    gt = ground_truth(
        [300 + 37 * (i % 7) for i in range(24)],
        [200 + 53 * (i % 5) for i in range(24)],
        [i * 40_000 for i in range(24)],
    )
    run_cfg = sim_config("hf_cb", [f"engine.kv_pool_blocks={blocks}", "engine.kv_read_cap=true"])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, _ = workload_from_ground_truth(gt, cfg.replay.hash_block_tokens)
    reqs = build(cfg, None, workload).run().requests
    assert (reqs["outcome"] == "completed").all()
