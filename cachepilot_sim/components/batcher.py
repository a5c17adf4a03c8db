"""Dynamic batcher: iteration-level continuous batching with chunked prefill (the engine loop).

Each iteration is one SimPy timeout: every decoding sequence produces one token, and prefilling
sequences take chunks of what is left of the token budget, in admission order. A stretch of
pure-decode iterations is one timeout too (`decode_run.py`). Per-sequence state lives in one
packed NumPy array (running sequences in columns 0..n-1, swap-removed when they leave): whole-row
updates are vector operations on views; the minima, sums and tests over the running batch (a few
to a few dozen columns) read rows as Python lists, and a step's one or two prefill chunks are
scalar updates, because a NumPy call costs more than a list pass of that size. None of this is a
loop per token, and every shortcut gives the integers and floats the vector form gave.

Modes: MAX_THROUGHPUT (large budget), LOW_LATENCY (small budget: short iterations, low TPOT),
ADAPTIVE (throughput limits while the queue is deep or a queued request's TTFT deadline is within
`adaptive_slack_ms`, latency limits otherwise).
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import simpy

from cachepilot_sim.clock import ceil_us, ms_to_us
from cachepilot_sim.components.admission_gate import AdmissionGate
from cachepilot_sim.components.decode_run import DecodeRuns
from cachepilot_sim.components.engine_stalls import EngineStalls
from cachepilot_sim.components.engine_stats import EngineStats
from cachepilot_sim.components.graph_capture import make_graph_captures
from cachepilot_sim.components.growth import DecodeGrowth
from cachepilot_sim.components.kv import Admit
from cachepilot_sim.components.output_lag import OutputLag
from cachepilot_sim.components.ports import EnginePorts
from cachepilot_sim.components.read_budget import NONE_HELD, ReadBudget
from cachepilot_sim.components.request import Outcome, Request
from cachepilot_sim.config import BatchMode, Preemption, SimConfig

# Rows of the packed per-sequence state array.
CTX, PREFILL_LEFT, DECODE_LEFT, BLOCKS, BLOCK_BYTES, TOKEN_BYTES, MODEL, ORDER, PRIO, GENERATED = (
    range(10)
)


class Batcher(DecodeRuns, DecodeGrowth, EngineStalls, ReadBudget):
    """The engine loop: admission at iteration boundaries, one timeout per iteration or run."""

    def __init__(self, cfg: SimConfig, ports: EnginePorts) -> None:
        self.env, self.cfg, self.queue, self.kv = ports.env, cfg.batcher, ports.queue, ports.kv
        self.pool, self.fit, self.step_cost = ports.pool, ports.fit, ports.step_cost
        self.events, self.wake = ports.events, ports.wake
        self.lag = OutputLag(self.env, self.events, cfg.engine)  # when a step's outputs leave
        # Async scheduling (engine profile): see _hold_new, and `ghost` for async_finish_slot.
        self.async_scheduling = cfg.engine.async_scheduling
        self.ghost_finished = self.async_scheduling and cfg.engine.async_finish_slot
        self.admit_after_preemption, self.num_preempted = cfg.engine.admit_after_preemption, 0
        self.prefill_margin = cfg.engine.prefill_margin_fraction
        self.preemption = cfg.engine.preemption
        self.block_new = False  # STARVED_BACK: no admission until a running request finishes
        self.admit_past_blocked = cfg.engine.admit_past_blocked
        self.grow_before_admit = cfg.engine.grow_before_admit
        self.prompt_room = cfg.engine.prompt_room_tokens
        # Async scheduling allocates a step's KV when the step is composed, while the one before
        # runs: a sequence takes its next block one step ahead.
        self.grow_ahead = int(self.async_scheduling)
        self.held_from = NONE_HELD  # columns with order >= this sit out the current step
        self.step_start_us = -1  # when the last step started
        self.ghost = np.zeros((3, 0), dtype=np.int64)  # context, KV bytes per token, model
        self.trace_every = cfg.trace.iteration_every
        self.max_decode_run = cfg.batcher.max_decode_run
        self.reserve_run_blocks = cfg.batcher.reserve_run_blocks
        self.adaptive_slack_us = ms_to_us(cfg.batcher.adaptive_slack_ms)
        models = cfg.models
        self.token_bytes = [m.kv_bytes_per_token for m in models]
        self.block_tokens = cfg.kv.block_tokens
        cap = max(cfg.batcher.throughput_max_seqs, cfg.batcher.latency_max_seqs)
        self.state = np.zeros((10, cap), dtype=np.int64)
        s = self.state
        self.ctx = s[CTX]  # tokens whose KV the sequence holds
        self.prefill_left = s[PREFILL_LEFT]
        self.decode_left = s[DECODE_LEFT]  # output tokens still to produce
        self.blocks = s[BLOCKS]
        self.block_bytes = s[BLOCK_BYTES]
        self.tok_bytes = s[TOKEN_BYTES]
        self.model = s[MODEL]
        self.order = s[ORDER]  # admission sequence: chunk order and preemption choice
        self.prio = s[PRIO]
        self.generated = s[GENERATED]  # written back to the request when it leaves
        self.slot_req: list[Request | None] = [None] * cap
        self.n = 0  # running sequences occupy columns 0..n-1
        self._admit_seq = 0
        self._run, self._cut_steps = None, 0  # the decode run in progress (DecodeRuns)
        self.stats = EngineStats()
        # Compute-stream stalls (engine_stalls.py): lazy graph captures, CPU swap copies.
        pool_tokens = self.pool.capacity_bytes // int(self.kv.block_bytes[0]) * self.block_tokens
        self.graphs = make_graph_captures(cfg, pool_tokens)
        self.read_budget = pool_tokens if cfg.engine.kv_read_cap else 0  # read_budget.py
        self._passed_over: dict[int, int] = {}
        self.swap = ports.swap
        self.stall_us = 0
        # Admission control of new sessions under pressure; None (`all`): every request admitted.
        self.gate: AdmissionGate | None = None
        if cfg.admission.name != "all":
            self.gate = AdmissionGate(
                self.env, cfg, self.queue, self.kv, self.pool, self.reject, self.running_fraction
            )

    def running_fraction(self) -> float:
        """Running sequences over the current sequence limit (an admission feature)."""
        return self.n / max(1, self.limits()[1])

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
        if len(self.queue) >= c.adaptive_queue_depth:
            return throughput
        slack = self.queue.min_slack_us()
        if slack is not None and slack < self.adaptive_slack_us:
            return throughput
        return latency

    def admit(self, budget: int, max_seqs: int) -> None:
        """Take queued requests while sequences and token budget remain and their KV fits."""
        if not len(self.queue):
            return
        if self.n == 0:
            self.block_new = False  # nothing left to finish: the engine admits again
        n = self.n
        wanted = sum(self.prefill_left[:n].tolist()) + n
        order = self.queue.in_order() if self.admit_past_blocked else None
        if order is not None and self.swap is not None:
            order = self._interleave_swapped(order)
        while self.n < max_seqs and wanted < budget and not self.block_new:
            if self.n and self._outside_margin():
                return  # the engine admits no new prefill next to running requests
            if order is None:
                req = self.queue.peek()
            else:  # look past requests that do not fit while a block is free
                req = order.pop(0) if order else None
            if req is None:
                return
            if self.queue.expired(req):  # the client gave up waiting
                self.queue.pop(req)
                self.kv.abandon(req)
                self.reject(req, "queue_timeout")
                continue
            if self.gate is not None and not self.gate.passes(req):
                continue  # deferred or rejected by admission control
            free = order is not None and self._any_free_block()
            result = self.kv.admit(req)
            if result in (Admit.BLOCKED, Admit.BLOCKED_HIT):
                if result == Admit.BLOCKED_HIT and self.preemption == Preemption.STARVED_BACK:
                    if not self._swapped_out(req):  # it skips the prefix match: no hit activates it
                        self._starve_queued(req)
                if not free:  # the engine stops looking once no block is free
                    return
                continue
            self.queue.pop(req)
            if result == Admit.REJECT:
                self.reject(req, "exceeds_kv_capacity")
            elif result == Admit.READY:
                if self.swap is not None and self.swap.holds(req.req_id):
                    self._swap_in(req)
                self._place(req)
                wanted += req.prefill_tokens + 1

    def _any_free_block(self) -> bool:
        """A KV block is free, idle cached blocks included (the engine stops looking when none)."""
        free = self.pool.free_bytes + self.kv.evictable_bytes()
        return free >= int(self.kv.block_bytes[0])

    def _outside_margin(self) -> bool:
        """Free KV (idle cached blocks count as free) under the engine's prefill margin."""
        free = self.pool.free_bytes + self.kv.evictable_bytes()
        return self.prefill_margin > 0 and free < self.prefill_margin * self.pool.capacity_bytes

    def _place(self, req: Request) -> None:
        i = self.n
        self.n += 1
        self.slot_req[i] = req
        done = (
            req.context_tokens + req.prompt_tokens + (req.generated if req.num_preemptions else 0)
        )
        m = req.model_index
        self.state[:, i] = (
            done - req.prefill_tokens,
            req.prefill_tokens,
            req.output_tokens - req.generated,
            self.kv.blocks_for(done + self.prompt_room),
            self.kv.block_bytes[m],
            self.token_bytes[m],
            m,
            self._admit_seq,
            req.priority,
            req.generated,
        )
        self._admit_seq += 1
        if req.admitted_us < 0:
            req.admitted_us = self.env.now
        self.events.admit(self.env.now, req, int(self.blocks[i]))

    def _remove(self, i: int) -> Request:
        """Swap-remove column i; callers removing several go in descending column order."""
        req = self.slot_req[i]
        assert req is not None
        req.generated = int(self.generated[i])
        last = self.n - 1
        if i != last:
            self.state[:, i] = self.state[:, last]
            self.slot_req[i] = self.slot_req[last]
        self.slot_req[last] = None
        self.n = last
        self._passed_over.pop(req.req_id, None)
        return req

    def reject(self, req: Request, reason: str) -> None:
        """End `req` as rejected with `reason` (one of trace.schema.REJECT_REASONS)."""
        req.outcome, req.reject_reason = Outcome.REJECTED, reason
        req.finish_us = self.env.now
        self._release_swap(req)  # a swapped-out request gave up: its CPU blocks are free
        self.events.reject(self.env.now, req, reason)
        req.done.succeed()

    # -- the engine loop ---------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, object, None]:
        """Process: admit, then either one mixed prefill/decode iteration or a run of decode steps.

        Yields one timeout per mixed iteration; a pure-decode run yields one timeout for up to
        `max_decode_run` steps, or until the wake signal (an arrival, a landed copy), after which
        it finishes the step in progress, so admission still happens at iteration boundaries.
        """
        limits, admit, prefill_left = self.limits, self.admit, self.prefill_left
        self._process = self.env.active_process  # its resumption is what a cut moves
        while True:
            budget, max_seqs = limits()
            first_new = self._admit_seq
            if self._grow_before_admit():
                admit(budget, max_seqs)
            if self.n == 0:
                self.lag.release()
                yield self.wake.wait()
                continue
            if self.async_scheduling:  # otherwise nothing is held (held_from stays at its max)
                self._hold_new(first_new)
            if any(prefill_left[: self.n].tolist()) or self._reads_bind():
                yield from self._mixed_iteration(budget)
            else:
                yield from self._decode_run()
            self.kv.maintain_watermark()

    def _hold_new(self, first_new: int) -> None:
        """Async scheduling: the next step was composed when the last one started, so requests
        that arrived after that sit it out while older ones run; an idle engine starts at once."""
        n, self.held_from = self.n, NONE_HELD
        if self.async_scheduling and not self.lag.last_eager and (self.order[:n] < first_new).any():
            new = [(int(self.order[i]), self.slot_req[i]) for i in range(n)]
            late = [o for o, r in new if o >= first_new and r and r.arrival_us > self.step_start_us]
            self.held_from = min(late, default=NONE_HELD)

    def _mixed_iteration(self, budget: int) -> Generator[simpy.Event, object, None]:
        if self._at_block_boundary() and not self._grow_decode():
            return
        n = self.n
        decoding = self.prefill_left[:n] == 0
        decode, allowed = self._capped(decoding.nonzero()[0].tolist())
        if allowed is not None:  # the read cap may pass decoding columns over
            decoding = np.zeros(n, dtype=bool)
            decoding[decode] = True
        chunk_idx, chunks = self._plan_prefill(budget - len(decode), allowed)
        duration = ceil_us(self._raw_duration_us(decode, chunk_idx, chunks))
        if self.graphs is not None:
            duration += self._step_graph_stall(self.graphs, decode, chunk_idx, chunks)
        if self.stall_us:
            duration += self._take_stall()
        if self.ghost.shape[1]:
            self.ghost = self.ghost[:, :0]
        self._account(duration, 1)
        self.step_start_us = self.env.now
        self.lag.next_step(duration, len(decode), chunks)
        yield self.env.timeout(duration)
        self._advance(decoding, len(decode), chunk_idx, chunks)

    def _raw_duration_us(self, decode: list[int], chunk_idx: list[int], chunks: list[int]) -> float:
        """Cost-model time of one iteration (before rounding up to whole microseconds): one token
        for each column in `decode`, `chunks[j]` for column `chunk_idx[j]`."""
        g = self.ghost.shape[1]
        if not g:  # the sums over plain ints where the step cost can take them (small batches)
            cols = decode + chunk_idx
            n = self.n
            ctx, tok = self.ctx[:n].tolist(), self.tok_bytes[:n].tolist()
            new = [1] * len(decode) + chunks
            us = self.step_cost.iteration_us_ints(
                new, [ctx[i] for i in cols], [tok[i] for i in cols]
            )
            if us is not None:
                return us
            idx = np.array(cols, dtype=np.int64)
            # The same arrays as before async scheduling existed: identical results.
            new_tokens = np.ones(idx.size)
            new_tokens[len(decode) :] = chunks
            return self.step_cost.iteration_us(
                new_tokens, self.ctx[idx], self.tok_bytes[idx], self.model[idx]
            )
        new_tokens = np.concatenate((np.ones(len(decode) + g), np.array(chunks, dtype=np.float64)))
        dec, chi = np.array(decode, dtype=np.int64), np.array(chunk_idx, dtype=np.int64)
        ctx = np.concatenate((self.ctx[dec], self.ghost[0], self.ctx[chi]))
        tok = np.concatenate((self.tok_bytes[dec], self.ghost[1], self.tok_bytes[chi]))
        model = np.concatenate((self.model[dec], self.ghost[2], self.model[chi]))
        return self.step_cost.iteration_us(new_tokens, ctx, tok, model)

    def _account(self, duration: int, steps: int) -> None:
        st = self.stats
        before = st.iterations
        st.iterations += steps
        st.busy_us += duration
        pool = self.pool
        held = pool.used_bytes + pool.in_flight_bytes
        st.kv_byte_us += held * duration
        st.kv_peak_bytes = max(st.kv_peak_bytes, held)
        if st.iterations // self.trace_every > before // self.trace_every:
            self.events.iteration(self.env.now, self.n, held, duration)

    def _advance(
        self, decoding: np.ndarray, num_decode: int, chunk_idx: list[int], chunks: list[int]
    ) -> None:
        """One mixed step done: a token for each of columns 0..n-1 where `decoding` (
        `num_decode` of them), the chunks for `chunk_idx`, and the first token of every prompt
        whose prefill it finished."""
        now = self.env.now
        n = decoding.size
        late = self._passed_over_gaps(decoding, now)  # columns that sat out steps
        self.stats.add_gaps(now - self.step_start_us, num_decode - late)
        # Whole-row arithmetic with the mask: faster than scattering into the decoding columns.
        if num_decode:
            self.ctx[:n] += decoding
            self.decode_left[:n] -= decoding
            self.generated[:n] += decoding
        st = self.stats
        st.tokens_decoded += num_decode
        if not chunk_idx:
            self._finish_done()
            return
        ctx, left = self.ctx, self.prefill_left
        first = []  # the iteration that finishes a prefill also produces the first output token
        for i, c in zip(chunk_idx, chunks, strict=True):  # a chunk or two: scalar updates
            ctx[i] += c
            left[i] -= c
            if left[i] == 0:
                first.append(i)
        st.tokens_prefilled += sum(chunks)
        if first:
            self.stats.resumed(first, self.generated, self.slot_req, now)
            decode_left, generated = self.decode_left, self.generated
            for i in first:
                decode_left[i] -= 1
                generated[i] += 1
            st.tokens_decoded += len(first)
            for i in first:
                req = self.slot_req[i]
                assert req is not None
                if req.first_token_us < 0 and req not in self.lag.held_first:
                    self.lag.first_token(req)
        self._finish_done()

    def _finish_done(self) -> None:
        n = self.n
        left = self.decode_left[:n]
        if not self.async_scheduling and min(left.tolist(), default=1) > 0:
            return
        done = ((self.prefill_left[:n] == 0) & (left <= 0)).nonzero()[0]
        if self.ghost_finished:  # they were scheduled into the next step before finishing
            self.ghost = self.state[[CTX, TOKEN_BYTES, MODEL]][:, done]
        if done.size:
            self.block_new = False
        for i in done[::-1].tolist():
            tokens, blocks, req = int(self.ctx[i]), int(self.blocks[i]), self._remove(i)
            self.kv.finish(req, tokens)
            self.lag.finish(req, blocks)  # stamped now, or after the next eager step
