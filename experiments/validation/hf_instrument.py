"""Per-step and per-request instrumentation of the transformers continuous-batching engine.

Wraps the engine's own methods on the live objects of one manager (nothing in transformers is
edited); token times are kept by request id because a soft reset re-creates the request and drops
the engine's own timestamps."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

perf_counter = time.perf_counter


class Recorder:
    """Collects per-step and per-request timings from wrapped engine methods (host perf_counter)."""

    def __init__(self, use_cuda: bool) -> None:
        self.use_cuda = use_cuda
        self.t0 = perf_counter()
        self.active = False
        self.steps: list[dict] = []
        self.captures: list[dict] = []
        self.preemptions: list[dict] = []
        self.token_times: dict[str, list[float]] = defaultdict(list)
        self.num_soft_resets: dict[str, int] = defaultdict(int)
        self.num_cpu_swaps: dict[str, int] = defaultdict(int)
        self.num_restores: dict[str, int] = defaultdict(int)
        self.prefix_hit: dict[str, int] = {}
        self.batch: dict | None = None
        self.iter_times: dict[str, float] = {}
        self.events: list[tuple[int, Any, Any]] = []

    def begin(self) -> None:
        self.__init__(self.use_cuda)  # type: ignore[misc]
        self.active = True

    def rel_us(self, t: float) -> int:
        return int(round((t - self.t0) * 1e6))


REC: Recorder | None = None


def instrument(manager: Any, rec: Recorder) -> None:
    """Wrap the engine's step pieces (instance attributes, so only this manager is affected)."""
    from transformers.generation.continuous_batching.requests import RequestState, RequestStatus

    global REC
    REC = rec
    bp = manager.batch_processor
    sched, cache, runner, ios = bp.scheduler, bp.cache, bp.model_runner, bp.inputs_and_outputs
    offl = bp.offloading_manager

    if not getattr(RequestState, "_cp_patched", False):
        orig_update = RequestState.update_and_check_completion

        def update_and_check_completion(self, token_id, logprob):  # type: ignore[no-untyped-def]
            t = perf_counter()
            n_before = len(self.generated_tokens)
            done = orig_update(self, token_id, logprob)
            if REC is not None and REC.active and len(self.generated_tokens) > n_before:
                REC.token_times[self.request_id].append(t)
            return done

        RequestState.update_and_check_completion = update_and_check_completion
        RequestState._cp_patched = True

    orig_schedule = sched.schedule_batch

    def schedule_batch(token_budget, cache_budget):  # type: ignore[no-untyped-def]
        before = {rid: st.status for rid, st in sched.active_requests.items()}
        offloaded = {rid for rid, st in sched.waiting_requests.items() if st.is_cpu_offloaded}
        res = orig_schedule(token_budget, cache_budget)
        reqs = res[0]
        if reqs and rec.active:
            b = dict(
                num_requests=len(reqs),
                num_prefill_requests=0,
                num_decode_requests=0,
                prefill_tokens=0,
                decode_tokens=0,
                num_new_requests=0,
                prefix_hit_tokens=0,
                num_restores=0,
                q_tokens=int(res[2]),
                kv_read_tokens=int(res[3]),
                max_seqlen_k=0,
            )
            for fs in reqs:
                st, ql = fs.state, fs.query_length
                b["max_seqlen_k"] = max(b["max_seqlen_k"], st.position_offset + ql)
                if before.get(st.request_id) == RequestStatus.DECODING:
                    b["num_decode_requests"] += 1
                    b["decode_tokens"] += ql
                    continue
                b["num_prefill_requests"] += 1
                b["prefill_tokens"] += ql
                if st.request_id not in before:
                    b["num_new_requests"] += 1
                    if st.request_id in offloaded:
                        b["num_restores"] += 1
                        rec.num_restores[st.request_id] += 1
                    elif st.position_offset > 0:
                        b["prefix_hit_tokens"] += st.position_offset
                    if st.request_id not in rec.prefix_hit:
                        rec.prefix_hit[st.request_id] = int(st.position_offset)
            b["kv_blocks_in_use"] = cache.num_blocks - cache.get_num_free_blocks()
            b["num_waiting"] = len(sched.waiting_requests)
            b["num_active"] = len(sched.active_requests)
            rec.batch = b
        return res

    sched.schedule_batch = schedule_batch

    orig_pad = runner.maybe_pad_inputs

    def maybe_pad_inputs(num_q_tokens, max_kv_read, use_decode_fast_path):  # type: ignore[no-untyped-def]
        q, kv = orig_pad(num_q_tokens, max_kv_read, use_decode_fast_path)
        if rec.batch is not None:
            rec.batch["q_tokens_padded"] = int(q)
            rec.batch["kv_read_padded"] = int(kv)
        return q, kv

    runner.maybe_pad_inputs = maybe_pad_inputs

    orig_capture = runner._capture_graph

    def _capture_graph(forward_fn, compute_stream, *args):  # type: ignore[no-untyped-def]
        pair = getattr(ios, "current_pair", 0)
        dev_io = ios.io_pairs[pair].device_io if hasattr(ios, "io_pairs") else ios
        key = list(dev_io._get_graph_key())
        t = perf_counter()
        orig_capture(forward_fn, compute_stream, *args)
        torch.cuda.synchronize()
        dur = perf_counter() - t
        rec.captures.append(dict(t_us=rec.rel_us(t), dur_us=int(dur * 1e6), key=key, pair=pair))
        if rec.batch is not None:
            rec.batch["graph_captures"] = rec.batch.get("graph_captures", 0) + 1
            rec.batch["capture_us"] = rec.batch.get("capture_us", 0) + int(dur * 1e6)

    runner._capture_graph = _capture_graph

    orig_compute = runner.compute_batch

    def compute_batch(model, batch_data):  # type: ignore[no-untyped-def]
        if not (rec.use_cuda and rec.active and rec.batch is not None):
            return orig_compute(model, batch_data)
        stream = ios.compute_stream or torch.cuda.current_stream()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        orig_compute(model, batch_data)
        e1.record(stream)
        rec.batch["_events"] = (e0, e1)

    runner.compute_batch = compute_batch

    orig_offload = offl._offload_to_cpu

    def _offload_to_cpu(victims):  # type: ignore[no-untyped-def]
        blocks = {st.request_id: cache.blocks_in_use(st.request_id) for st in victims}
        swapped = orig_offload(victims)
        if rec.active:
            t_us = rec.rel_us(perf_counter())
            for st in victims:
                kind = "cpu_swap" if st.request_id in swapped else "soft_reset"
                counter = rec.num_cpu_swaps if kind == "cpu_swap" else rec.num_soft_resets
                counter[st.request_id] += 1
                rec.preemptions.append(
                    dict(
                        t_us=t_us,
                        request_id=st.request_id,
                        kind=kind,
                        blocks=blocks[st.request_id],
                        generated_tokens=len(st.generated_tokens),
                    )
                )
        return swapped

    offl._offload_to_cpu = _offload_to_cpu

    orig_prepare = bp.prepare_next_batch

    def prepare_next_batch():  # type: ignore[no-untyped-def]
        rec.batch = None
        ok = orig_prepare()
        rec.iter_times["prepare_end"] = perf_counter()
        return ok

    bp.prepare_next_batch = prepare_next_batch

    orig_update_batch = bp.update_batch

    def update_batch():  # type: ignore[no-untyped-def]
        rec.iter_times["update_start"] = perf_counter()
        orig_update_batch()

    bp.update_batch = update_batch

    orig_body = manager._generation_loop_body

    def body(batch_processor, bootstrapping):  # type: ignore[no-untyped-def]
        t_start = perf_counter()
        rec.iter_times = {}
        n_before = manager.current_batch
        cont = orig_body(batch_processor, bootstrapping)
        t_end = perf_counter()
        if rec.active and manager.current_batch != n_before and rec.batch is not None:
            b = rec.batch
            events = b.pop("_events", None)
            b["step"] = len(rec.steps)
            b["start_us"] = rec.rel_us(t_start)
            b["prepare_end_us"] = rec.rel_us(rec.iter_times.get("prepare_end", t_start))
            b["update_start_us"] = rec.rel_us(rec.iter_times.get("update_start", t_end))
            b["end_us"] = rec.rel_us(t_end)
            b["num_preemptions_total"] = len(rec.preemptions)
            b.setdefault("graph_captures", 0)
            b.setdefault("capture_us", 0)
            if events is not None:
                rec.events.append((b["step"], *events))
            rec.steps.append(b)
        return cont

    manager._generation_loop_body = body


def resolve_gpu_times(rec: Recorder) -> None:
    """Device time of each step's compute (CUDA events around compute_batch, compute stream)."""
    if not rec.use_cuda:
        return
    torch.cuda.synchronize()
    by_step = {s["step"]: s for s in rec.steps}
    for step, e0, e1 in rec.events:
        by_step[step]["gpu_us"] = int(e0.elapsed_time(e1) * 1000)
    rec.events = []


def detach() -> None:
    """Stop feeding token times to the last recorder (the engine it watched is gone)."""
    global REC
    REC = None
