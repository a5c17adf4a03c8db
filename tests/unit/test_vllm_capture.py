"""The vLLM capture's CPU-side logic (experiments/validation/vllm/vllm_gt.py, vllm_steplog.py)
with fake engine outputs: the request lists are the transformers captures' own, the client
replays them open loop, and what it writes loads as ground truth. No vllm needed."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "experiments/validation/vllm"), str(ROOT / "experiments/validation")]
H100 = ROOT / "experiments/validation/hf_cb/2026-12-06-h100"

import vllm_gt  # noqa: E402
from capture_common import REQUEST_TYPES, STEP_TYPES, write_table  # noqa: E402
from vllm_common import LLAMA3_8B  # noqa: E402

from cachepilot_sim.validation.ground_truth import load_ground_truth  # noqa: E402
from cachepilot_sim.validation.gt_stats import summarize  # noqa: E402

RESOLVED = {k: 0 for k in vllm_gt.SETTING_KEYS} | {"block_size": 16, "num_gpu_blocks": 30000}


@pytest.mark.parametrize("name", ["poisson_r6", "multiturn"])
def test_request_lists_are_the_transformers_captures(name: str) -> None:
    """Same ids, lengths, planned send times and (for requests without a parent) the same
    prompt token ids as the committed H100 transformers capture (its 256-token block hashes)."""
    hf = pl.read_parquet(H100 / name / "run1" / "requests.parquet")
    reqs, _ = vllm_gt.workload(name)
    assert [r.request_id for r in reqs] == hf["request_id"].to_list()
    assert [r.max_new_tokens for r in reqs] == hf["max_new_tokens"].to_list()
    client = vllm_gt.OpenLoop(reqs)
    roots = client.due(1e9)
    by_id = {r["request_id"]: r for r in hf.iter_rows(named=True)}
    assert roots and all(r.parent_id is None for r, _ in roots)
    for r, ids in roots:
        row = by_id[r.request_id]
        assert len(ids) == row["prompt_tokens"]
        assert round(client.records[r.request_id].planned_s * 1e6) == row["planned_send_us"]
        blocks = vllm_gt.block_hashes(ids, 256, r.request_id)
        assert blocks == row["block_hash_ids"]


def test_a_later_turn_is_sent_after_its_parent_with_its_prompt_and_reply() -> None:
    reqs, _ = vllm_gt.workload("multiturn")
    client = vllm_gt.OpenLoop(reqs[:2])  # one session's first two turns
    first, child = reqs[0], reqs[1]
    ((r, ids),) = client.due(0.0)
    assert r.request_id == first.request_id and client.due(100.0) == []
    client.sent(r.request_id, 10.0)
    client.tokens(r.request_id, 10.2, [7, 8])
    client.tokens(r.request_id, 10.3, [9])
    client.finish(r.request_id, t0=10.0)
    due = client.next_due_s()
    assert due == pytest.approx(0.3 + child.think_s)
    assert client.due(due - 1e-6) == []
    ((c, cids),) = client.due(due)
    assert c.request_id == child.request_id
    assert (
        cids[: len(ids) + 3] == ids + [7, 8, 9] and len(cids) == len(ids) + 3 + child.prompt_tokens
    )


def test_a_failed_turn_fails_the_later_turns_of_its_session() -> None:
    reqs, _ = vllm_gt.workload("multiturn")
    client = vllm_gt.OpenLoop(reqs[:4])
    client.due(0.0)
    client.finish(reqs[0].request_id, 0.0, error="RuntimeError: boom")
    assert client.done()
    rows = client.rows(0.0, 16, {})
    assert [r["status"] for r in rows] == ["failed"] * 4
    assert rows[3]["error"] == f"parent {reqs[2].request_id} failed"


def fake_run(tmp: Path) -> tuple[Path, vllm_gt.OpenLoop]:
    """Serve the first 6 poisson_r6 requests with made-up token times (10 ms per token, the
    first 50 ms after the send) and a made-up core step log; write the run's folder."""
    reqs, meta = vllm_gt.workload("poisson_r6")
    reqs = [vllm_gt.Req(**{**r.__dict__, "max_new_tokens": 4}) for r in reqs[:6]]
    t0 = 1000.0
    client = vllm_gt.OpenLoop(reqs)
    core = []
    for r, _ids in client.due(1e9):
        sent = t0 + (client.records[r.request_id].planned_s or 0.0)
        client.sent(r.request_id, sent)
        for k in range(4):
            client.tokens(r.request_id, sent + 0.05 + 0.01 * k, [100 + k])
        client.records[r.request_id].num_cached_tokens = 0
        client.finish(r.request_id, t0)
        core.append(
            {"kind": "step", "schedule_start": sent, "schedule_end": sent + 0.001}
            | {"update_start": sent + 0.04, "update_end": sent + 0.041}
            | dict.fromkeys(vllm_gt.STEP_COUNTS, 1)
        )
    core.append({"kind": "preempt", "t": t0 + 0.5, "request_id": f"{reqs[1].request_id}-abcd1234"})
    folder = tmp / "poisson_r6" / "run1"
    folder.mkdir(parents=True)
    t1 = t0 + 100
    rows = client.rows(t0, 16, vllm_gt.preemptions(core, t0, t1))
    write_table(rows, {**REQUEST_TYPES, **vllm_gt.ENGINE_REQUEST_TYPES}, folder / "requests")
    write_table(vllm_gt.step_rows(core, t0, t1), STEP_TYPES, folder / "steps")
    eng = vllm_gt.engine_json(RESOLVED, LLAMA3_8B, {"workload": "poisson_r6", "run": 1})
    (folder / "engine.json").write_text(json.dumps(eng))
    return folder, client


def test_a_run_written_by_the_capture_loads_as_ground_truth(tmp_path: Path) -> None:
    folder, client = fake_run(tmp_path)
    gt = load_ground_truth(folder)
    assert gt.engine["engine"] == "vllm_v1" and gt.engine["kv_bytes_per_token"] == 131072
    summ = summarize(gt)
    assert summ["finished"] == 6 and summ["ttft_ms_mean"] == pytest.approx(50.0, abs=0.01)
    assert summ["tpot_ms_mean"] == pytest.approx(10.0, abs=0.01)
    assert summ["num_soft_resets"] == 1  # the core log's preemption, mapped to the external id
    first = gt.requests.row(0, named=True)
    assert len(first["block_hash_ids"]) == -(-first["prompt_tokens"] // 16)
    assert gt.steps is not None and gt.steps.height == 6


def test_step_summary_tells_decodes_from_prompt_chunks_and_recompute() -> None:
    prompts = {"new": 100, "chunk": 3000, "dec": 50, "last": 40, "res": 60}
    out = SimpleNamespace(
        num_scheduled_tokens={"new": 64, "chunk": 512, "dec": 1, "last": 1, "res": 70},
        total_num_scheduled_tokens=648,
        scheduled_new_reqs=[SimpleNamespace(req_id="new", num_computed_tokens=32)],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=["chunk", "dec", "last", "res"],
            num_computed_tokens=[1024, 57, 39, 0],
            resumed_req_ids={"res"},
        ),
        preempted_req_ids={"x"},
    )
    s = vllm_gt.step_summary(out, prompts.__getitem__)
    # "last" has one prompt token left (39 of 40 computed): a prefill token, not a decode
    assert (s["decode_tokens"], s["num_decode_requests"]) == (1, 1)
    assert s["prefill_tokens"] == 64 + 512 + 1 + 70
    assert (s["num_new_requests"], s["prefix_hit_tokens"], s["num_preempted"]) == (2, 32, 1)
    assert s["kv_read_tokens"] == (32 + 64) + (1024 + 512) + 58 + 40 + 70
    assert s["max_seqlen_k"] == 1536


def test_step_rows_start_when_the_previous_step_output_is_ready() -> None:
    """Async scheduling: step 2 is scheduled while step 1 runs; its GPU work starts when step
    1's output is ready, and a step after an idle gap starts when it is scheduled."""
    counts = dict.fromkeys(vllm_gt.STEP_COUNTS, 1)
    core = [
        {"kind": "step", "schedule_start": 10.0, "schedule_end": 10.001}
        | {"update_start": 10.030, "update_end": 10.031}
        | counts,
        {"kind": "step", "schedule_start": 10.002, "schedule_end": 10.003}
        | {"update_start": 10.060, "update_end": 10.061}
        | counts,
        {"kind": "step", "schedule_start": 11.0, "schedule_end": 11.002}
        | {"update_start": 11.020, "update_end": 11.021}
        | counts,
    ]
    rows = vllm_gt.step_rows(core, 10.0, 12.0)
    assert [r["gpu_us"] for r in rows] == [29000, 30000, 18000]
    assert [(r["start_us"], r["end_us"]) for r in rows] == [
        (1000, 30000),
        (30000, 60000),
        (1002000, 1020000),
    ]
    assert vllm_gt.step_rows(core, 10.5, 12.0)[0]["step"] == 0  # only steps scheduled in the run


def test_engine_json_refuses_an_unresolved_setting() -> None:
    resolved = dict(RESOLVED)
    del resolved["async_scheduling"]
    with pytest.raises(ValueError, match="async_scheduling"):
        vllm_gt.engine_json(resolved, LLAMA3_8B, {})


def test_steplog_wraps_the_scheduler_and_logs_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "core.jsonl"
    monkeypatch.setenv("CP_VLLM_STEP_LOG", str(log))
    steplog = importlib.reload(importlib.import_module("vllm_steplog"))

    class FakeScheduler:
        def __init__(self) -> None:
            self.requests = {"a-12345678": SimpleNamespace(num_prompt_tokens=10)}
            self.waiting, self.running, self.skipped_waiting = [1, 2], [3], []
            pool = SimpleNamespace(num_gpu_blocks=100, get_num_free_blocks=lambda: 60)
            self.kv_cache_manager = SimpleNamespace(block_pool=pool)

        def schedule(self) -> SimpleNamespace:
            return SimpleNamespace(
                num_scheduled_tokens={"a-12345678": 1},
                total_num_scheduled_tokens=1,
                scheduled_new_reqs=[],
                scheduled_cached_reqs=SimpleNamespace(
                    req_ids=["a-12345678"], num_computed_tokens=[12], resumed_req_ids=set()
                ),
            )

        def update_from_output(self, scheduler_output: object, model_output: object) -> str:
            return "outputs"

        def _preempt_request(self, request: object, timestamp: float) -> None:
            return None

    assert steplog.install(FakeScheduler)
    sched = FakeScheduler()
    out = sched.schedule()
    assert sched.update_from_output(out, None) == "outputs"
    sched._preempt_request(SimpleNamespace(request_id="a-12345678"), 0.0)
    step, pre = steplog.read(log)
    assert step["kind"] == "step" and step["decode_tokens"] == 1 and step["kv_blocks_in_use"] == 40
    assert step["schedule_start"] <= step["update_start"] <= step["update_end"]
    assert (step["num_waiting"], step["num_running"]) == (2, 1)
    assert vllm_gt.external_id(pre["request_id"]) == "a"


class FakeEngine:
    """An engine with AsyncLLM's `generate`/`abort` shape: the first token 20 ms after the
    request, then one every 5 ms; a request named `*-hang` never produces one."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    async def generate(self, prompt: Any, params: Any, rid: str) -> Any:
        if rid.endswith("-hang"):
            await asyncio.sleep(3600)
        await asyncio.sleep(0.02)
        for k in range(params):
            if k:
                await asyncio.sleep(0.005)
            yield SimpleNamespace(
                outputs=[SimpleNamespace(token_ids=[k])],
                num_cached_tokens=len(prompt) // 2,
                finished=k == params - 1,
                metrics=SimpleNamespace(queued_ts=1.0, scheduled_ts=2.0, first_token_ts=3.0),
            )

    async def abort(self, ids: list[str]) -> None:
        self.aborted += ids


def _fake_request(r: vllm_gt.Req, ids: list[int]) -> tuple[list[int], int]:
    return ids, r.max_new_tokens


def test_serve_sends_open_loop_and_a_later_turn_after_its_parent() -> None:
    import capture_vllm

    reqs = [
        vllm_gt.Req("a-0000", 40, 3, send_s=0.0, session_id="a"),
        vllm_gt.Req("a-0001", 8, 2, session_id="a", parent_id="a-0000", turn=1, think_s=0.03),
        vllm_gt.Req("b-0000", 20, 2, send_s=0.05),
    ]
    client, t0, t1 = asyncio.run(capture_vllm.serve(FakeEngine(), reqs, 10.0, _fake_request))
    rec = client.records
    assert all(r.finished for r in rec.values())
    assert rec["b-0000"].sent_s - t0 >= 0.05  # never before its planned time
    assert rec["a-0001"].sent_s >= rec["a-0000"].token_s[-1] + 0.03  # think time after the reply
    assert rec["a-0001"].prompt[:43] == rec["a-0000"].prompt + [0, 1, 2]
    assert rec["a-0000"].num_cached_tokens == 20 and rec["a-0000"].engine["scheduled_ts"] == 2.0
    rows = client.rows(t0, 16, {})
    assert [r["output_tokens"] for r in rows] == [3, 2, 2] and t1 >= rec["b-0000"].token_s[-1]


def test_serve_aborts_what_is_left_at_the_time_limit() -> None:
    import capture_vllm

    engine = FakeEngine()
    reqs = [vllm_gt.Req("x-0000", 10, 2, send_s=0.0), vllm_gt.Req("x-hang", 10, 2, send_s=0.0)]
    client, t0, _ = asyncio.run(capture_vllm.serve(engine, reqs, 0.3, _fake_request))
    assert engine.aborted == ["x-hang"]
    status = {r["request_id"]: r["status"] for r in client.rows(t0, 16, {})}
    assert status == {"x-0000": "finished", "x-hang": "missing"}


class FakeStepEngine:
    """LLMEngine's stepping shape: each step gives every active request one token."""

    def __init__(self) -> None:
        self.vllm_config = None
        self.active: dict[str, int] = {}
        self.steps = 0

    def add_request(self, rid: str, prompt: Any, params: int) -> None:
        self.active[rid] = params

    def has_unfinished_requests(self) -> bool:
        return bool(self.active)

    def step(self) -> list[SimpleNamespace]:
        self.steps += 1
        outs = []
        for rid in list(self.active):
            self.active[rid] -= 1
            done = self.active[rid] == 0
            if done:
                del self.active[rid]
            outs.append(
                SimpleNamespace(
                    request_id=rid,
                    outputs=[SimpleNamespace(token_ids=[self.steps])],
                    num_cached_tokens=0,
                    finished=done,
                    metrics=None,
                )
            )
        return outs

    def abort_request(self, ids: list[str]) -> None:
        for rid in ids:
            self.active.pop(rid, None)

    def reset_prefix_cache(self) -> bool:
        return True


def test_the_in_process_engine_streams_each_steps_tokens_to_its_request() -> None:
    import capture_vllm

    async def run() -> tuple[vllm_gt.OpenLoop, float, float]:
        engine = capture_vllm.InprocEngine(FakeStepEngine())
        try:
            assert await engine.reset_prefix_cache()
            return await capture_vllm.serve(engine, reqs, 10.0, _fake_request)
        finally:
            engine.shutdown()

    reqs = [
        vllm_gt.Req("p-0000", 10, 3, send_s=0.0, session_id="p"),
        vllm_gt.Req("p-0001", 5, 2, session_id="p", parent_id="p-0000", turn=1, think_s=0.01),
    ]
    client, t0, _ = asyncio.run(run())
    rows = {r["request_id"]: r for r in client.rows(t0, 16, {})}
    assert [rows[k]["output_tokens"] for k in ("p-0000", "p-0001")] == [3, 2]
    assert all(r["status"] == "finished" for r in rows.values())
    first, second = client.records["p-0000"], client.records["p-0001"]
    assert second.prompt[10:13] == first.output_ids and second.sent_s >= first.token_s[-1] + 0.01


def test_micro_steps_in_the_capture_format_feed_the_step_cost_fit(tmp_path: Path) -> None:
    import capture_vllm

    from cachepilot_sim.tools.micro_steps import load_micro_steps

    counts = dict.fromkeys(vllm_gt.STEP_COUNTS, 4) | {"q_tokens": 4, "kv_read_tokens": 4096}
    core = [
        {"kind": "step", "schedule_start": 1.0 + 0.02 * i, "schedule_end": 1.001 + 0.02 * i}
        | {"update_start": 1.015 + 0.02 * i, "update_end": 1.016 + 0.02 * i}
        | counts
        for i in range(5)
    ]
    tag = {"bench": "decode", "batch_size": 4, "cfg_prompt_tokens": 16, "context_tokens": 1024}
    steps = [{**s, **tag, "rep": 1, "config_id": 0} for s in vllm_gt.step_rows(core, 1.0, 2.0)]
    types = {**STEP_TYPES, **capture_vllm.EXTRA_STEP_TYPES, **capture_vllm.MICRO_TAG_TYPES}
    write_table(steps, types, tmp_path / "steps")
    loaded = load_micro_steps(tmp_path / "steps.parquet")
    assert loaded.height == 5 and (loaded["gpu_us"] > 0).all()
    assert loaded["bench"].to_list() == ["decode"] * 5


def test_the_distinct_plan_gives_every_decode_its_own_context() -> None:
    plan = vllm_gt.MICRO_PLANS["microbench_distinct"]()
    decodes = [reqs for tag, reqs in plan if tag["bench"] == "decode_distinct"]
    assert len(decodes) == 7 and all(r.prefix_of is None for reqs in decodes for r in reqs)
    client = vllm_gt.OpenLoop(decodes[0])
    prompts = [tuple(ids) for _, ids in client.due(1.0)]
    assert len(prompts) == 8 and len({p[:16] for p in prompts}) == 8  # no shared first block
    alone = next(reqs for tag, reqs in plan if tag["bench"] == "eager_alone")
    gaps = np.diff([r.send_s for r in alone])
    assert len(alone) == 24 and (gaps >= 0.4 - 1e-9).all()  # each prefill alone on the engine
