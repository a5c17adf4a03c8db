"""CPU swap of preempted requests (engine.cpu_swap_blocks, transformers' OffloadingManager)
against its opposite, recompute (soft reset): what is re-processed, what crosses PCIe, what a
swapped request's TPOT gains, and the fall-back to a soft reset when the swap space is full."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.cpu_swap import CpuSwapSpace
from cachepilot_sim.components.engine_stalls import EngineStalls
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.config import HardwareConfig
from cachepilot_sim.cost import transfer_fits
from cachepilot_sim.trace.derive import load_trace, request_results, run_metrics
from cachepilot_sim.validation.replay import simulate
from tests.engine_runs import ground_truth, pressure, run_hf_cb

BLOCK_BYTES = 256 * 131_072  # one 256-token block of the Llama-3-8B shape
# r000 reaches a block boundary first with the pool full: the only starved request, the victim;
# its 1000-odd generated tokens are not prefix-cached, so recomputing them is expensive
TWO_LONG = ground_truth([200, 200], [2000, 2000], [0, 10_000])
TWO_LONG_POOL = "engine.kv_pool_blocks=10"


def _space(capacity_blocks: int) -> CpuSwapSpace:
    env = SimEnvironment()
    return CpuSwapSpace(PcieLink(env, *transfer_fits(HardwareConfig())), capacity_blocks)


def test_a_victim_is_swapped_while_its_blocks_fit_first_fit() -> None:
    space = _space(5)
    assert space.swap_out(1, 3, 3 * BLOCK_BYTES, 700) is not None
    assert space.swap_out(2, 3, 3 * BLOCK_BYTES, 700) is None  # no room: soft reset
    assert space.swap_out(3, 2, 2 * BLOCK_BYTES, 400) is not None  # a smaller one still fits
    assert (space.free_blocks, space.holds(1), space.holds(2)) == (0, True, False)
    assert space.swap_out(4, 0, 0, 0) is None  # nothing to copy
    blocks, num_bytes, tokens, us = space.swap_in(1)
    assert (blocks, num_bytes, tokens, space.free_blocks) == (3, 3 * BLOCK_BYTES, 700, 3)
    assert us == space.link.duration_us("h2d", 3 * BLOCK_BYTES) > 0
    space.release(3)  # gave up while swapped out: freed, nothing copied back
    assert space.conserved() and space.free_blocks == 5
    assert space.link.bytes_moved == {"d2h": 5 * BLOCK_BYTES, "h2d": 3 * BLOCK_BYTES}


def test_swapped_requests_and_the_others_take_turns_in_the_queue() -> None:
    """transformers' _get_waiting_candidates, a swapped request first."""
    space = _space(10)
    for i in (3, 4):
        space.swap_out(i, 1, BLOCK_BYTES, 10)
    order = [SimpleNamespace(req_id=i) for i in (0, 1, 2, 3, 4)]
    stalls = SimpleNamespace(swap=space)
    out = EngineStalls._interleave_swapped(stalls, order)  # type: ignore[arg-type]
    assert [r.req_id for r in out] == [3, 0, 4, 1, 2]


def _two_long(*overrides: str) -> tuple[dict, dict, int]:
    sim, result = run_hf_cb(TWO_LONG, TWO_LONG_POOL, *overrides)
    rows = {r["request"]: r for r in result.requests.iter_rows(named=True)}
    extra = sim.batcher.stats.tokens_prefilled - sum(r["prompt_tokens"] for r in rows.values())
    return result.metrics, rows[0], extra


def test_a_swapped_request_recomputes_nothing_and_crosses_pcie_out_and_back() -> None:
    m, victim, extra = _two_long("engine.cpu_swap_blocks=64")
    assert (m["preemptions"], m["cpu_swaps"], m["soft_resets"]) == (1, 1, 0)
    assert (victim["preemptions"], victim["cpu_swaps"]) == (1, 1)
    assert extra == 1  # one token re-processed on restore: the last one it generated
    held = -(-(200 + 1024) // 256)  # its blocks when it starved: 200 + 1024 tokens + the next
    assert m["pcie_d2h_gb"] == m["pcie_h2d_gb"] == held * BLOCK_BYTES / 1e9


def test_recompute_prefills_the_generated_tokens_again() -> None:
    m, victim, extra = _two_long()
    assert (m["preemptions"], m["cpu_swaps"], m["soft_resets"]) == (1, 0, 1)
    assert (victim["preemptions"], victim["cpu_swaps"]) == (1, 0)
    assert extra > 1000 and m["pcie_d2h_gb"] == m["pcie_h2d_gb"] == 0


def test_swapping_gives_the_victim_a_lower_tpot_than_recomputing_it() -> None:
    _, swapped, _ = _two_long("engine.cpu_swap_blocks=64")
    _, recomputed, _ = _two_long()
    assert swapped["tpot_us"] < recomputed["tpot_us"]
    assert swapped["generated"] == recomputed["generated"] == 2000


def test_a_full_swap_space_falls_back_to_a_soft_reset() -> None:
    """The victim holds 5 blocks; 3 do not take it: the run is the recompute run, exactly."""
    small = run_hf_cb(TWO_LONG, TWO_LONG_POOL, "engine.cpu_swap_blocks=3")[1]
    none = run_hf_cb(TWO_LONG, TWO_LONG_POOL)[1]
    assert small.metrics["cpu_swaps"] == 0
    assert small.requests.equals(none.requests)


@pytest.mark.parametrize(("blocks", "swaps", "resets"), [(0, 0, 12), (2, 4, 8), (100, 9, 0)])
def test_every_preemption_is_a_swap_or_a_soft_reset_and_every_request_completes(
    blocks: int, swaps: int, resets: int
) -> None:
    """Under pressure a small swap space takes some victims and soft resets the others."""
    sim, result = run_hf_cb(
        pressure(), "engine.kv_pool_blocks=12", f"engine.cpu_swap_blocks={blocks}"
    )
    m, reqs = result.metrics, result.requests
    assert (m["cpu_swaps"], m["soft_resets"]) == (swaps, resets)
    assert m["cpu_swaps"] + m["soft_resets"] == m["preemptions"] == reqs["preemptions"].sum()
    assert reqs["cpu_swaps"].sum() == swaps
    assert (reqs["outcome"] == "completed").all()
    assert (reqs["generated"] == reqs["output_tokens"]).all()
    # memory conserved (the run checks the pool too) and the swap space empty at the end
    assert sim.pool.conserved()
    swap = sim.engine.swap
    if blocks:
        assert swap is not None and swap.conserved() and swap.free_blocks == blocks
    else:
        assert swap is None


def test_swap_runs_are_deterministic() -> None:
    a = run_hf_cb(pressure(), "engine.kv_pool_blocks=12", "engine.cpu_swap_blocks=3")[1]
    b = run_hf_cb(pressure(), "engine.kv_pool_blocks=12", "engine.cpu_swap_blocks=3")[1]
    assert a.requests.equals(b.requests) and a.metrics == b.metrics
    assert 0 < a.metrics["cpu_swaps"] < a.metrics["preemptions"]


def test_the_trace_derives_the_same_swaps_and_pcie_bytes(tmp_path: Path) -> None:
    _, result = run_hf_cb(
        pressure(), "engine.kv_pool_blocks=12", "engine.cpu_swap_blocks=3", trace_dir=tmp_path
    )
    lf, meta = load_trace(tmp_path)
    derived = run_metrics(lf, meta)
    for key in ("cpu_swaps", "soft_resets", "preemptions", "pcie_d2h_gb", "pcie_h2d_gb"):
        assert derived[key] == result.metrics[key], key
    per_request = request_results(lf, meta).select("request", "cpu_swaps")
    assert per_request.equals(result.requests.select("request", "cpu_swaps"))
    swaps = lf.filter(pl.col("kind") == "swap_out").collect()
    assert (swaps["bytes"] == swaps["blocks"] * BLOCK_BYTES).all()


def test_the_replay_frame_counts_swaps_and_soft_resets_apart() -> None:
    from cachepilot_sim.tools.validate import sim_config

    run_cfg = sim_config("hf_cb", ["engine.kv_pool_blocks=12", "engine.cpu_swap_blocks=3"])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    frame, metrics = simulate(cfg, pressure())
    r = frame.requests
    assert r["num_cpu_swaps"].sum() == metrics["cpu_swaps"] > 0
    assert r["num_soft_resets"].sum() == metrics["soft_resets"] > 0
