"""Replays a session workload through any vLLM CachePolicy the way CPUOffloadingManager calls it.

The op stream is fixed by the workload (sessions from the simulator's SessionFactory: Poisson
arrivals, geometric turns, log-normal lengths and think times), not by the policy: every policy sees
the same requests at the same times. What a policy changes is which chunks are still there when a
session resumes, and so the realized restore cost: a reload of the head run of hits plus the
recompute of the rest of the earlier prompt. The CPU tier is modelled as the only copy of an idle
session's KV (the GPU prefix cache is assumed to have dropped it).

The call sequence mirrors vLLM 0.33's CPUOffloadingManager (prepare_load / complete_load, then
prepare_store with on_store_miss, on_request_access, evict(n, protected), insert and the completed
store's mark_evictable, then on_request_finished); the manager itself imports most of vLLM's
serving stack and cannot be loaded on a CPU-only host, so it is not used directly.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cachepilot_sim.clock import ms_to_us
from cachepilot_sim.config import HardwareConfig, ModelConfig, SimConfig, WorkloadConfig
from cachepilot_sim.cost import compute_fit, recompute_us, transfer_fits, transfer_us
from cachepilot_sim.cost.kv_bytes import kv_bytes_per_token
from cachepilot_sim.rng import make_streams
from cachepilot_sim.workloads.synthetic import SessionFactory


@dataclass(frozen=True, slots=True)
class Turn:
    """One request: session `session` sends at t_us; its prompt's first `prior_chunks` chunks are
    the previous turn's stored prompt; `num_chunks` full chunks of this prompt are stored;
    `class_index` is the session's workload class (sent in kv_transfer_params)."""

    t_us: int
    end_us: int
    session: int
    prior_chunks: int
    num_chunks: int
    class_index: int = -1


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    tokens_per_chunk: int = 256
    decode_token_ms: float = 20.0  # time from a turn's send to its end, per output token
    num_sessions: int = 3000
    seed: int = 0


def make_turns(workload: WorkloadConfig, cfg: ReplayConfig) -> list[Turn]:
    """All turns of `cfg.num_sessions` sessions, ordered by send time (ties by session, turn)."""
    sim = SimConfig(workload=workload, seed=cfg.seed)
    streams = make_streams(cfg.seed)
    factory = SessionFactory(sim, streams)
    gaps_s = streams.arrivals.exponential(1.0 / workload.session_rate_per_s, cfg.num_sessions)
    arrivals_us = np.cumsum(np.rint(gaps_s * 1e6)).astype(np.int64)
    turns: list[tuple[int, int, int, Turn]] = []
    for start_us in arrivals_us:
        spec = factory.make()
        t, context, prior = int(start_us), 0, 0
        for k in range(spec.num_turns):
            prompt = context + int(spec.prompt_tokens[k])
            end = t + ms_to_us(cfg.decode_token_ms * int(spec.output_tokens[k]))
            stored = prompt // cfg.tokens_per_chunk
            turn = Turn(t, end, spec.session_id, prior, stored, spec.class_index)
            turns.append((t, spec.session_id, k, turn))
            context, prior = prompt + int(spec.output_tokens[k]), stored
            t = end + int(spec.think_us[k])
    turns.sort(key=lambda x: x[:3])
    return [x[3] for x in turns]


@dataclass(slots=True)
class ReplayStats:
    """What one policy paid on one op stream."""

    num_turns: int = 0
    num_decisions: int = 0  # evict calls with n > 0
    num_failed_decisions: int = 0  # evict returned None (the store was skipped)
    num_evicted_chunks: int = 0
    num_hit_chunks: int = 0
    num_missed_chunks: int = 0
    reload_us: float = 0.0
    recompute_us: float = 0.0
    decision_ns: list[int] = field(default_factory=list)

    @property
    def restore_us(self) -> float:
        return self.reload_us + self.recompute_us


@dataclass(frozen=True, slots=True)
class VllmTypes:
    """vLLM's ChunkStatus and ReqContext classes (or a faithful stand-in, in tests)."""

    chunk_status: Callable[[int], Any]
    req_context: Callable[..., Any]


def chunk_key(session: int, index: int) -> bytes:
    """An OffloadKey-shaped key: 8 bytes of 'hash' then the 4-byte KV cache group index (0)."""
    return session.to_bytes(4, "big") + index.to_bytes(4, "big") + bytes(4)


class Replayer:
    """Drives one policy with the manager's call sequence; keeps the manager's counters."""

    def __init__(
        self,
        policy: Any,
        capacity: int,
        types: VllmTypes,
        hw: HardwareConfig,
        model: ModelConfig,
        tokens_per_chunk: int,
        clock: list[int],
    ) -> None:
        self.policy, self.capacity, self.types = policy, capacity, types
        self.tpc = tokens_per_chunk
        self.fit = compute_fit(hw)
        self.h2d = transfer_fits(hw)[0]
        self.bytes_per_chunk = kv_bytes_per_token(model, model.kv_dtype_bytes) * tokens_per_chunk
        self.clock = clock  # shared one-element list: the policy's clock reads clock[0]
        self.num_resident = 0
        self.num_evictable = 0
        self.stats = ReplayStats()
        self._next_chunk_id = 0
        self._open: dict[int, tuple[Any, list[bytes], list[bytes], list[bytes]]] = {}

    def start(self, turn: Turn, timer: Callable[[], int]) -> None:
        self.stats.num_turns += 1
        keys = [chunk_key(turn.session, i) for i in range(turn.num_chunks)]
        ctx = self.types.req_context(
            f"s{turn.session}-t{turn.t_us}",
            kv_transfer_params={"session_id": turn.session, "session_class": turn.class_index},
        )
        for i, key in enumerate(keys):
            ctx.set_offload_key_position(key, (i + 1) * self.tpc)
        hits = self._load(keys[: turn.prior_chunks], ctx)
        self._account(turn.prior_chunks, len(hits))
        inserted = self._store(keys, hits, ctx, timer)
        self._open[id(turn)] = (ctx, keys, hits, inserted)

    def finish(self, turn: Turn) -> None:
        ctx, keys, hits, inserted = self._open.pop(id(turn))
        present = [k for k in keys if self.policy.get(k) is not None]
        self.policy.on_request_finished(
            (tuple(present),), set(inserted) - set(hits), set(hits), ctx
        )

    def _account(self, prior: int, num_hits: int) -> None:
        s = self.stats
        s.num_hit_chunks += num_hits
        s.num_missed_chunks += prior - num_hits
        s.reload_us += transfer_us(self.h2d, num_hits * self.bytes_per_chunk)
        s.recompute_us += recompute_us(self.fit, prior * self.tpc) - recompute_us(
            self.fit, num_hits * self.tpc
        )

    def _load(self, prefix: list[bytes], ctx: Any) -> list[bytes]:
        hits: list[bytes] = []
        for key in prefix:  # lookup: a run of ready hits from the head
            status = self.policy.get(key)
            if status is None or status.ref_cnt < 0:
                break
            hits.append(key)
        if not hits:
            return hits
        for key in hits:  # prepare_load pins, complete_load unpins
            status = self.policy.get(key)
            if status.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
            status.ref_cnt += 1
        self.policy.on_request_access(hits, ctx)
        for key in hits:
            status = self.policy.get(key)
            status.ref_cnt -= 1
            if status.ref_cnt == 0:
                self.policy.mark_evictable(key)
        return hits

    def _store(
        self, keys: list[bytes], seen: list[bytes], ctx: Any, timer: Callable[[], int]
    ) -> list[bytes]:
        missing = [k for k in keys if self.policy.get(k) is None]
        if missing:
            self.policy.on_store_miss(missing, ctx)
        already = set(seen)  # the manager reports each key to on_request_access once per request
        self.policy.on_request_access([k for k in keys if k not in already], ctx)
        if not missing:
            return []
        num_to_evict = len(missing) - (self.capacity - self.num_resident)
        if num_to_evict > 0:
            self.stats.num_decisions += 1
            if num_to_evict > self.num_evictable:
                self.stats.num_failed_decisions += 1
                return []
            t0 = timer()
            evicted = self.policy.evict(num_to_evict, set(keys))
            self.stats.decision_ns.append(timer() - t0)
            if evicted is None:
                self.stats.num_failed_decisions += 1
                return []
            assert len(evicted) == num_to_evict, "a policy must evict exactly n chunks"
            self.num_resident -= len(evicted)
            self.num_evictable -= len(evicted)
            self.stats.num_evicted_chunks += len(evicted)
        for key in missing:
            self.policy.insert(key, self.types.chunk_status(self._next_chunk_id), ctx)
            self._next_chunk_id += 1
        self.num_resident += len(missing)
        for key in missing:  # the store completes: ready and idle
            self.policy.get(key).ref_cnt = 0
            self.policy.mark_evictable(key)
        self.num_evictable += len(missing)
        return missing


def replay(
    replayer: Replayer,
    turns: list[Turn],
    timer: Callable[[], int],
    max_decisions: int | None = None,
) -> int:
    """Runs sends and ends in time order; returns how many turns were started (all, or up to the
    one that made decision number `max_decisions`)."""
    events: list[tuple[int, int, int, Turn]] = []  # (time, 0 = end before 1 = send, seq, turn)
    for seq, turn in enumerate(turns):
        events.append((turn.t_us, 1, seq, turn))
    heapq.heapify(events)
    started = 0
    while events:
        t_us, kind, seq, turn = heapq.heappop(events)
        replayer.clock[0] = t_us
        if kind == 0:
            replayer.finish(turn)
            continue
        replayer.start(turn, timer)
        started += 1
        heapq.heappush(events, (turn.end_us, 0, seq, turn))
        if max_decisions is not None and replayer.stats.num_decisions >= max_decisions:
            break
    return started
