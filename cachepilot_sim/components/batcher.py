"""Dynamic batcher: iteration-level continuous batching with chunked prefill (the engine loop).

Each iteration is one SimPy timeout: every decoding sequence produces one token, and prefilling
sequences take chunks of what is left of the token budget, in admission order. The per-sequence state
of the batch lives in NumPy arrays indexed by slot, so an iteration costs a few vector operations, not
a Python loop over tokens. Modes: MAX_THROUGHPUT (large budget), LOW_LATENCY (small budget, short
iterations, low TPOT), ADAPTIVE (throughput limits while the queue is deep or a queued request's TTFT
deadline is within `adaptive_slack_ms`, latency limits otherwise).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import simpy

from cachepilot_sim.clock import ceil_us, ms_to_us
from cachepilot_sim.components.kv_manager import Admit, KvManager
from cachepilot_sim.components.request import Outcome, Request
from cachepilot_sim.components.scheduler import Scheduler
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.config import BatchMode, SimConfig
from cachepilot_sim.cost import ComputeFit, decode_step_slope_us, iteration_us
from cachepilot_sim.trace.recorder import TraceRecorder


@dataclass
class EngineStats:
    iterations: int = 0
    busy_us: int = 0
    tokens_prefilled: int = 0
    tokens_decoded: int = 0
    kv_byte_us: float = 0.0  # integral of (used + in flight) KV bytes over time
    kv_peak_bytes: int = 0
    throughput_iterations: int = 0


class Batcher:
    def __init__(
        self, env: simpy.Environment, cfg: SimConfig, scheduler: Scheduler, kv: KvManager,
        fit: ComputeFit, recorder: TraceRecorder, wake: Signal,
    ) -> None:
        self.env, self.cfg, self.scheduler, self.kv = env, cfg.batcher, scheduler, kv
        self.fit, self.recorder, self.wake = fit, recorder, wake
        self.trace_every = cfg.trace.iteration_every
        self.max_decode_run = cfg.batcher.max_decode_run
        self.adaptive_slack_us = ms_to_us(cfg.batcher.adaptive_slack_ms)
        models = cfg.models
        self.weight_bytes = np.array([m.weight_bytes for m in models], dtype=np.float64)
        self.token_bytes = [m.kv_bytes_per_token for m in models]
        self.num_models = len(models)
        self.block_tokens = cfg.kv.block_tokens
        n = max(cfg.batcher.throughput_max_seqs, cfg.batcher.latency_max_seqs)
        self.slot_req: list[Request | None] = [None] * n
        self.active = np.zeros(n, dtype=bool)
        self.ctx = np.zeros(n, dtype=np.int64)  # tokens whose KV this sequence holds
        self.prefill_left = np.zeros(n, dtype=np.int64)
        self.decode_left = np.zeros(n, dtype=np.int64)
        self.blocks = np.zeros(n, dtype=np.int64)
        self.block_bytes = np.zeros(n, dtype=np.int64)
        self.tok_bytes = np.zeros(n, dtype=np.float64)
        self.model = np.zeros(n, dtype=np.int64)
        self.order = np.zeros(n, dtype=np.int64)  # admission sequence: chunk order, preempt choice
        self.prio = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)  # written back to the request when it leaves
        self._free_slots = list(range(n - 1, -1, -1))
        self._admit_seq = 0
        self.stats = EngineStats()

    # -- limits and admission --------------------------------------------------------------
    def limits(self) -> tuple[int, int]:
        """(token budget, max sequences) for the next iteration."""
        c = self.cfg
        throughput = (c.throughput_token_budget, c.throughput_max_seqs)
        latency = (c.latency_token_budget, c.latency_max_seqs)
        if c.mode == BatchMode.MAX_THROUGHPUT:
            return throughput
        if c.mode == BatchMode.LOW_LATENCY:
            return latency
        slack = self.scheduler.min_slack_us()
        pressed = slack is not None and slack < self.adaptive_slack_us
        if len(self.scheduler) >= c.adaptive_queue_depth or pressed:
            self.stats.throughput_iterations += 1
            return throughput
        return latency

    def admit(self, budget: int, max_seqs: int) -> None:
        """Take queued requests while sequences and token budget remain and their KV fits."""
        num_active = int(self.active.sum())
        wanted = int(self.prefill_left[self.active].sum()) + num_active
        while num_active < max_seqs and wanted < budget:
            req = self.scheduler.peek()
            if req is None:
                return
            result = self.kv.admit(req)
            if result == Admit.BLOCKED:
                return
            self.scheduler.pop(req)
            if result == Admit.REJECT:
                self.reject(req, "exceeds_kv_capacity")
            elif result == Admit.READY:
                self._place(req)
                num_active += 1
                wanted += req.prefill_tokens + 1

    def _place(self, req: Request) -> None:
        i = self._free_slots.pop()
        self.slot_req[i] = req
        self.active[i] = True
        done = req.context_tokens + req.prompt_tokens + (req.generated if req.num_preemptions else 0)
        self.ctx[i] = done - req.prefill_tokens
        self.prefill_left[i] = req.prefill_tokens
        self.decode_left[i] = req.output_tokens - req.generated
        self.blocks[i] = self.kv.blocks_for(done)
        self.model[i] = req.model_index
        self.block_bytes[i] = self.kv.block_bytes[req.model_index]
        self.tok_bytes[i] = self.token_bytes[req.model_index]
        self.prio[i] = req.priority
        self.generated[i] = req.generated
        self.order[i] = self._admit_seq
        self._admit_seq += 1
        if req.admitted_us < 0:
            req.admitted_us = self.env.now
        self.recorder.emit(self.env.now, "batcher", "admit", req.session_id, req.req_id,
                           req.model_index, int(self.blocks[i]), value=req.prefill_tokens)

    def reject(self, req: Request, reason: str) -> None:
        req.outcome, req.reject_reason = Outcome.REJECTED, reason
        req.finish_us = self.env.now
        self.recorder.emit(self.env.now, "batcher", "reject", req.session_id, req.req_id,
                           req.model_index, value=0 if reason == "exceeds_kv_capacity" else 1)
        req.done.succeed()

    # -- one iteration -----------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, object, None]:
        """Process: admit, then either one mixed prefill/decode iteration or a run of decode steps.

        Yields one timeout per mixed iteration; a pure-decode run yields one timeout for up to
        `max_decode_run` steps, or until the wake signal (an arrival, a landed copy), after which
        it finishes the step in progress, so admission still happens at iteration boundaries.
        """
        while True:
            budget, max_seqs = self.limits()
            self.admit(budget, max_seqs)
            if not self.active.any():
                yield self.wake.wait()
                continue
            if (self.active & (self.prefill_left > 0)).any():
                yield from self._mixed_iteration(budget)
            else:
                yield from self._decode_run()
            self.kv.maintain_watermark()

    def _mixed_iteration(self, budget: int) -> Generator[simpy.Event, object, None]:
        decode = self._grow_decode()
        if decode is None:
            return
        chunk_idx, chunks = self._plan_prefill(budget - int(decode.sum()))
        duration = ceil_us(self._raw_duration_us(decode, chunk_idx, chunks))
        self._account(duration, 1)
        yield self.env.timeout(duration)
        self._advance(decode, chunk_idx, chunks)

    def _decode_run(self) -> Generator[simpy.Event, object, None]:
        """Up to k decode steps as one timeout; blocks for all k steps are reserved up front."""
        k = min(int(self.decode_left[self.active].min()), self.max_decode_run)
        k = self._reserve_decode_blocks(k)
        if k == 0:
            return
        decode = self.active.copy()
        none = decode[:0].nonzero()[0]
        first = self._raw_duration_us(decode, none, none)
        slope = decode_step_slope_us(self.fit, float(self.tok_bytes[decode].sum()),
                                     int(decode.sum()))
        ends = np.cumsum(np.maximum(1, np.ceil(first + slope * np.arange(k)))).astype(np.int64)
        start = self.env.now
        timer = self.env.timeout(int(ends[-1]))
        yield timer | self.wake.wait()
        steps = k
        if not timer.processed:
            elapsed = self.env.now - start
            steps = int(np.searchsorted(ends, elapsed, side="left")) + 1
            if ends[steps - 1] > elapsed:
                yield self.env.timeout(int(ends[steps - 1]) - elapsed)
        self._account(int(ends[steps - 1]), steps)
        self._advance_decode(decode, steps)

    def _reserve_decode_blocks(self, k: int) -> int:
        """Reserve blocks for k decode steps, shortening the run when memory is short; the
        single-step fallback evicts and, failing that, preempts. Returns the steps to run."""
        act = self.active
        room = self.blocks[act] * self.block_tokens - self.ctx[act]
        need = np.maximum(0, -(-(self.ctx[act] + k) // self.block_tokens) - self.blocks[act])
        num_bytes = int((need * self.block_bytes[act]).sum())
        if num_bytes == 0:
            return k
        if num_bytes <= self.kv.pool.free_bytes:
            self.kv.pool.allocate(num_bytes)
            self.blocks[act] += need
            return k
        if int(room.min()) >= 1:
            return min(k, int(room.min()))
        return 0 if self._grow_decode() is None else 1

    def _grow_decode(self) -> np.ndarray | None:
        """Mask of decoding slots, after giving each one that crosses a block boundary a block."""
        while True:
            decode = self.active & (self.prefill_left == 0)
            need = decode & (self.ctx >= self.blocks * self.block_tokens)
            if not need.any():
                return decode
            if self.kv.grow(int(self.block_bytes[need].sum())):
                self.blocks[need] += 1
                return decode
            self._preempt_one()
            if not self.active.any():
                return None

    def _preempt_one(self) -> None:
        """Recompute-preempt the lowest-priority, most recently admitted running sequence."""
        idx = np.flatnonzero(self.active)
        victim = int(idx[np.lexsort((-self.order[idx], self.prio[idx]))[0]])
        req = self.slot_req[victim]
        assert req is not None
        req.generated = int(self.generated[victim])
        self.kv.preempt(req, int(self.ctx[victim]))
        self._clear(victim)
        self.scheduler.requeue_front(req)

    def _plan_prefill(self, tokens_left: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunked prefill: slots in admission order share what is left of the token budget."""
        idx = np.flatnonzero(self.active & (self.prefill_left > 0))
        if idx.size == 0 or tokens_left <= 0:
            return idx[:0], idx[:0]
        idx = idx[np.argsort(self.order[idx], kind="stable")]
        want = self.prefill_left[idx]
        before = np.cumsum(want) - want
        chunks = np.clip(tokens_left - before, 0, want)
        keep = chunks > 0
        return idx[keep], chunks[keep]

    def _raw_duration_us(
        self, decode: np.ndarray, chunk_idx: np.ndarray, chunks: np.ndarray
    ) -> float:
        """Cost-model time of one iteration (before rounding up to whole microseconds)."""
        dec_ctx = self.ctx[decode]
        pre_ctx = self.ctx[chunk_idx]
        new = np.concatenate((np.ones(dec_ctx.size), chunks.astype(np.float64)))
        ctx = np.concatenate((dec_ctx, pre_ctx)).astype(np.float64)
        kv_read = ctx * np.concatenate((self.tok_bytes[decode], self.tok_bytes[chunk_idx]))
        pairs = new * (ctx + new / 2.0)
        if self.num_models == 1:
            return iteration_us(self.fit, self.weight_bytes[0], new.sum(), kv_read.sum(),
                                pairs.sum())
        model = np.concatenate((self.model[decode], self.model[chunk_idx]))
        m = self.num_models
        tokens = np.bincount(model, weights=new, minlength=m)
        reads = np.bincount(model, weights=kv_read, minlength=m)
        attn = np.bincount(model, weights=pairs, minlength=m)
        total = 0.0
        for k in np.flatnonzero(tokens):  # each model present runs its own forward pass
            total += iteration_us(self.fit, self.weight_bytes[k], tokens[k], reads[k], attn[k])
        return total

    def _account(self, duration: int, steps: int) -> None:
        st = self.stats
        before = st.iterations
        st.iterations += steps
        st.busy_us += duration
        pool = self.kv.pool
        held = pool.used_bytes + pool.in_flight_bytes
        st.kv_byte_us += held * duration
        st.kv_peak_bytes = max(st.kv_peak_bytes, held)
        if st.iterations // self.trace_every > before // self.trace_every:
            self.recorder.emit(self.env.now, "batcher", "iteration", -1, -1, 0,
                               int(self.active.sum()), held, "gpu", value=duration)

    def _advance(self, decode: np.ndarray, chunk_idx: np.ndarray, chunks: np.ndarray) -> None:
        now = self.env.now
        self.ctx[decode] += 1
        self.decode_left[decode] -= 1
        self.ctx[chunk_idx] += chunks
        self.prefill_left[chunk_idx] -= chunks
        st = self.stats
        st.tokens_decoded += int(decode.sum())
        st.tokens_prefilled += int(chunks.sum())
        # The iteration that finishes a prefill also produces the first output token.
        first = chunk_idx[self.prefill_left[chunk_idx] == 0]
        self.decode_left[first] -= 1
        st.tokens_decoded += int(first.size)
        for i in first.tolist():
            req = self.slot_req[i]
            assert req is not None
            if req.first_token_us < 0:
                req.first_token_us = now
                self.recorder.emit(now, "batcher", "first_token", req.session_id, req.req_id,
                                   req.model_index, value=now - req.arrival_us)
        self.generated[decode] += 1
        self.generated[first] += 1
        for i in np.flatnonzero(self.active & (self.prefill_left == 0) & (self.decode_left <= 0)):
            self._finish(int(i))

    def _advance_decode(self, decode: np.ndarray, steps: int) -> None:
        self.ctx[decode] += steps
        self.decode_left[decode] -= steps
        self.generated[decode] += steps
        self.stats.tokens_decoded += steps * int(decode.sum())
        for i in np.flatnonzero(decode & (self.decode_left <= 0)):
            self._finish(int(i))

    def _finish(self, i: int) -> None:
        req = self.slot_req[i]
        assert req is not None
        req.outcome, req.finish_us = Outcome.COMPLETED, self.env.now
        req.generated = int(self.generated[i])
        self.kv.finish(req, int(self.ctx[i]), int(self.blocks[i]))
        self.recorder.emit(self.env.now, "batcher", "finish", req.session_id, req.req_id,
                           req.model_index, int(self.blocks[i]), value=req.generated)
        self._clear(i)
        req.done.succeed()

    def _clear(self, i: int) -> None:
        self.active[i] = False
        self.slot_req[i] = None
        self.prefill_left[i] = 0
        self.decode_left[i] = 0
        self._free_slots.append(i)
