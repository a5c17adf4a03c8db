"""The engine-profile rules read from transformers' continuous batching (engine=hf_cb): where a
preempted request waits, when admission resumes, looking past a request that does not fit, blocks
taken at the step that needs them (one step ahead under async batching), running sequences served
before queued requests, a prompt's room for two more tokens, and FIFO without deadline
promotion."""

from __future__ import annotations

import glob
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import simpy

from cachepilot_sim.components.kv.room import RoomRule
from cachepilot_sim.components.request import Request
from cachepilot_sim.components.scheduler import RequestQueue
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.config import SchedulerConfig
from cachepilot_sim.sim import build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.ground_truth import GroundTruth, load_ground_truth
from cachepilot_sim.validation.replay import engine_overrides, workload_from_ground_truth
from tests.engine_runs import ground_truth


def _req(i: int, arrival: int, deadline: int) -> Request:
    return Request(
        simpy.Environment(),  # type: ignore[arg-type]
        req_id=i,
        session_id=i,
        turn=0,
        class_index=0,
        model_index=0,
        priority=0,
        arrival_us=arrival,
        deadline_us=deadline,
        tpot_slo_us=0,
        context_tokens=0,
        prompt_tokens=10,
        output_tokens=5,
    )


def _queue(promotion: bool, now: int) -> RequestQueue:
    env = simpy.Environment(initial_time=now)
    cfg = SchedulerConfig(deadline_promotion=promotion)
    return RequestQueue(env, cfg, Signal(env))  # type: ignore[arg-type]


def _drain(q: RequestQueue) -> list[int]:
    out = []
    while (r := q.peek()) is not None:
        q.pop(r)
        out.append(r.req_id)
    return out


def test_requeue_back_waits_behind_every_queued_request_and_ahead_of_later_ones() -> None:
    q = _queue(promotion=False, now=1_000)
    for i, t in enumerate((100, 200, 300)):
        q.push(_req(i, t, t + 10))
    victim = _req(9, 50, 60)  # arrived first, preempted now
    q.requeue_back(victim)
    q.push(_req(5, 2_000, 2_010))  # a later arrival
    assert [r.req_id for r in q.in_order()] == [0, 1, 2, 9, 5]
    assert _drain(q) == [0, 1, 2, 9, 5]


@pytest.mark.parametrize("promotion", [True, False])
def test_in_order_is_the_order_peek_and_pop_give(promotion: bool) -> None:
    q = _queue(promotion, now=1_000)
    for i, (t, d) in enumerate(((100, 5_000), (200, 900), (300, 1_100), (400, 99_000))):
        q.push(_req(i, t, d))
    listed = [r.req_id for r in q.in_order()]
    assert listed == _drain(q)
    # past or near deadlines jump ahead only with promotion on
    assert listed == ([1, 2, 0, 3] if promotion else [0, 1, 2, 3])


def _run(gt: GroundTruth, tmp_path: Path, *overrides: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    run_cfg = sim_config("hf_cb", ["trace.enabled=true", "trace.iteration_every=1", *overrides])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, _ = workload_from_ground_truth(gt, cfg.replay.hash_block_tokens)
    result = build(cfg, tmp_path / "trace", workload).run()
    parts = sorted(glob.glob(str(tmp_path / "trace" / "**" / "*.parquet"), recursive=True))
    return result.requests, pl.concat([pl.read_parquet(p) for p in parts])


def _pressure() -> GroundTruth:
    """Long replies into a 12-block pool: decodes run out of blocks and preempt."""
    prompts = [300 + 37 * (i % 7) for i in range(24)]
    outputs = [200 + 53 * (i % 5) for i in range(24)]
    return ground_truth(prompts, outputs, [i * 40_000 for i in range(24)])


def test_after_a_starved_preemption_nothing_is_admitted_until_a_request_finishes(
    tmp_path: Path,
) -> None:
    reqs, trace = _run(_pressure(), tmp_path, "engine.kv_pool_blocks=12")
    assert (reqs["outcome"] == "completed").all()
    ev = trace.filter(pl.col("kind").is_in(["preempt", "admit", "finish"])).sort("t_us", "seq")
    kinds, times = ev["kind"].cast(pl.String).to_list(), ev["t_us"].to_list()
    preempts = [i for i, k in enumerate(kinds) if k == "preempt"]
    assert preempts, "the workload must preempt for this test to mean anything"
    for i in preempts:
        later = kinds[i + 1 :]
        if "admit" in later:
            first_admit = later.index("admit")
            assert "finish" in later[:first_admit], (
                f"admission right after the preempt at {times[i]}"
            )


def test_the_front_rule_readmits_a_victim_before_anything_finishes(tmp_path: Path) -> None:
    """The other rule (vLLM v1, the default engine) as the control: the check above can fail."""
    _, trace = _run(
        _pressure(), tmp_path, "engine.kv_pool_blocks=12", "engine.preemption=NEWEST_FRONT"
    )
    ev = trace.filter(pl.col("kind").is_in(["preempt", "admit", "finish"])).sort("t_us", "seq")
    kinds = ev["kind"].cast(pl.String).to_list()
    at_once = 0
    for i, k in enumerate(kinds):
        if k == "preempt" and "admit" in kinds[i + 1 :]:
            nxt = kinds[i + 1 :]
            at_once += "finish" not in nxt[: nxt.index("admit")]
    assert at_once > 0


def test_a_request_that_fits_is_admitted_past_one_that_does_not(tmp_path: Path) -> None:
    # r000 holds 3 then 4 of 6 blocks for a while; r001 (3 blocks) cannot fit, r002 (1) can
    gt = ground_truth([700, 700, 100], [300, 10, 10], [0, 10_000, 20_000])
    reqs, _ = _run(gt, tmp_path, "engine.kv_pool_blocks=5")
    first = dict(zip(reqs["request"].to_list(), reqs["first_token_us"].to_list(), strict=True))
    assert first[2] < first[1]
    reqs, _ = _run(
        gt, tmp_path / "hol", "engine.kv_pool_blocks=5", "engine.admit_past_blocked=false"
    )
    first = dict(zip(reqs["request"].to_list(), reqs["first_token_us"].to_list(), strict=True))
    assert first[1] <= first[2]  # head-of-line order: the control


def test_blocks_are_taken_at_the_step_that_crosses_into_them(tmp_path: Path) -> None:
    gt = ground_truth([100, 100], [600, 600], [0, 0])
    for reserve, peak_max in (("false", 3), ("true", 4)):
        _, trace = _run(gt, tmp_path / reserve, f"batcher.reserve_run_blocks={reserve}")
        it = trace.filter(pl.col("kind") == "iteration")
        # pool bytes held at a step / bytes of one 256-token block: the first crossing (token
        # 256) needs one more block each; reserving a run's blocks takes them early
        held_blocks = (it["bytes"] // (256 * 131_072)).to_list()
        early = held_blocks[: len(held_blocks) // 4]
        assert max(early) <= peak_max


def _peak_blocks(tmp_path: Path, gt: GroundTruth, pool_blocks: int, *overrides: str) -> float:
    run_cfg = sim_config("hf_cb", [f"engine.kv_pool_blocks={pool_blocks}", *overrides])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    workload, _ = workload_from_ground_truth(gt, cfg.replay.hash_block_tokens)
    result = build(cfg, tmp_path, workload).run()
    return float(result.metrics["vram_kv_util_peak"]) * pool_blocks


@pytest.mark.parametrize(
    ("prompt", "room", "blocks"),
    [(1024, 2, 5), (1024, 0, 4), (1022, 2, 4), (1023, 2, 5), (253, 2, 1), (254, 2, 1)],
)
def test_a_prompt_is_given_room_for_two_more_tokens(
    tmp_path: Path, prompt: int, room: int, blocks: int
) -> None:
    """transformers: (n + 1) // 256 + 1 blocks for n new tokens, i.e. room for n + 2."""
    gt = ground_truth([prompt], [1], [0])
    _, trace = _run(gt, tmp_path, f"engine.prompt_room_tokens={room}")
    admit = trace.filter(pl.col("kind") == "admit")
    assert admit["blocks"].to_list() == [blocks]


@pytest.mark.parametrize(("async_", "peak"), [("true", 2), ("false", 1)])
def test_async_batching_takes_a_block_one_step_ahead(
    tmp_path: Path, async_: str, peak: int
) -> None:
    # 253 + 2 fit one block; the third decode step (position 255) still fits, but under async
    # batching the step after it is composed (and its block taken) while it runs
    gt = ground_truth([253], [4], [0])
    assert _peak_blocks(tmp_path, gt, 8, f"engine.async_scheduling={async_}") == pytest.approx(peak)


@pytest.mark.parametrize(("first", "preempted"), [("true", 0), ("false", 1)])
def test_a_running_sequence_takes_its_block_before_a_queued_request(
    tmp_path: Path, first: str, preempted: int
) -> None:
    # r000 (254 + 2 in one block) needs its second block at the boundary where r001 (1000
    # tokens: 4 of the 5 blocks), sent during r000's first decode step, is first considered
    gt = ground_truth([254, 1000], [400, 10], [0, 18_000])
    reqs, _ = _run(gt, tmp_path, "engine.kv_pool_blocks=5", f"engine.grow_before_admit={first}")
    assert (reqs["outcome"] == "completed").all()
    assert reqs.sort("request")["preemptions"].to_list()[0] == preempted


@pytest.mark.parametrize(
    ("atomic", "free", "evictable", "short"),
    [
        (True, 10, 20, 0),  # 10 + 20 < 40: nothing can make room, so nothing is evicted
        (False, 10, 20, 30),  # the default engine starts evicting for a request that will wait
        (True, 10, 30, 30),  # enough idle bytes: evict what is short
        (True, 50, 0, -10),  # already free
    ],
)
def test_an_atomic_admission_evicts_nothing_unless_it_can_succeed(
    atomic: bool, free: int, evictable: int, short: int
) -> None:
    pool = SimpleNamespace(capacity_bytes=100, free_bytes=free)
    rule = RoomRule(pool, 0.0, atomic)  # type: ignore[arg-type]
    assert rule.shortfall(40, 0, evictable) == short


PRESSURE_PREEMPT = Path(__file__).resolve().parents[2] / (
    "experiments/validation/hf_cb/2026-12-01/pressure_preempt/run1"
)


@pytest.mark.parametrize(
    ("overrides", "phantoms"),
    [
        ((), True),
        (("engine.atomic_admission=false",), False),  # the cached prefix is gone by then
        (("engine.preemption=NEWEST_FRONT",), False),  # only transformers' rule does this
    ],
)
def test_a_queued_request_made_active_by_a_prefix_hit_is_evicted_when_it_starves(
    tmp_path: Path, overrides: tuple[str, ...], phantoms: bool
) -> None:
    """transformers CB activates a waiting request on a prefix hit before allocating the rest;
    starved, it is soft reset (a preemption of a request that never ran again: 0 blocks)."""
    real = load_ground_truth(PRESSURE_PREEMPT)
    gt = GroundTruth(real.path, real.requests, None, real.engine)
    reqs, trace = _run(gt, tmp_path, *engine_overrides(real, sim_config("hf_cb", [])), *overrides)
    assert (reqs["outcome"] == "completed").all()
    ev = trace.filter(pl.col("kind").is_in(["preempt", "admit", "finish"])).sort("t_us", "seq")
    phantom = ev.filter((pl.col("kind") == "preempt") & (pl.col("blocks") == 0))
    assert (phantom.height > 0) == phantoms
    kinds, blocks = ev["kind"].cast(pl.String).to_list(), ev["blocks"].to_list()
    for i, (k, b) in enumerate(zip(kinds, blocks, strict=True)):
        if k == "preempt" and b == 0 and "admit" in kinds[i + 1 :]:
            later = kinds[i + 1 :]
            assert "finish" in later[: later.index("admit")]  # no admission until a finish
