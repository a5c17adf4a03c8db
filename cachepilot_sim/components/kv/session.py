"""Session KV manager: a session's KV outlives its turn.

When a turn ends the KV stays on the GPU, idle, until the eviction policy picks it. A victim goes to
the CPU store over PCIe when offload is on and the store has room, otherwise it is dropped. A
returning session hits (GPU), reloads (CPU) or prefills its context again. The KV of a session is on
exactly one tier at a time: GPU, CPU, none, or in flight between them.
"""

from __future__ import annotations

from collections.abc import Generator

import simpy

from cachepilot_sim.components.kv.cpu_store import CpuStore
from cachepilot_sim.components.kv.protocol import Admit, KvDeps, KvStats, Tier
from cachepilot_sim.components.kv.room import RoomRule
from cachepilot_sim.components.kv.session_record import SessionKV
from cachepilot_sim.components.kv.transfers import Transfers, cpu_kv_bytes_per_token
from cachepilot_sim.components.request import KvSource, Request
from cachepilot_sim.config import SimConfig
from cachepilot_sim.cost import recompute_us
from cachepilot_sim.policies import CacheEntry
from cachepilot_sim.policies.candidates import CandidateIndex


class SessionKvManager:
    """KV per session (synthetic workloads): hit, reload or recompute a returning session. A
    closed session's record goes once it holds no KV (`close_session`; `forget_closed = False`
    keeps every record: the tests compare both)."""

    forget_closed = True

    def __init__(self, cfg: SimConfig, deps: KvDeps) -> None:
        self.env, self.pool, self.link = deps.env, deps.pool, deps.link
        self.policy, self.estimator, self.fit = deps.policy, deps.estimator, deps.fit
        self.events, self.queue, self.wake = deps.events, deps.queue, deps.wake
        self.block_tokens = cfg.kv.block_tokens
        self.block_bytes = [m.kv_bytes_per_token * cfg.kv.block_tokens for m in cfg.models]
        # The CPU store's form of a block: the GPU's unless kv.offload_dtype_bytes quantizes it.
        self.cpu_block_bytes = [
            cpu_kv_bytes_per_token(m, cfg.kv.offload_dtype_bytes) * cfg.kv.block_tokens
            for m in cfg.models
        ]
        self.offload_enabled = cfg.kv.offload_enabled
        self.prompt_room = cfg.engine.prompt_room_tokens  # KV room beyond the prompt at admission
        self.stats = KvStats()
        self.room = RoomRule(self.pool, cfg.kv.watermark_fraction, cfg.engine.atomic_admission)
        self.cpu = CpuStore(cfg.kv.cpu_store_bytes, cfg.kv.cpu_store_evicts_lru, self.stats)
        self.transfers = Transfers(
            self.env, self.pool, self.link, self.stats, cfg.hardware.quantize_bytes_per_us
        )
        self.sessions: dict[int, SessionKV] = {}
        self.idle: dict[int, SessionKV] = {}  # GPU-resident, not attached: eviction candidates
        # Their entries in the policy's order (PERC: an exact index per restore regime).
        self.candidates = CandidateIndex(self.policy, self._static_restore)
        self.idle_bytes = 0
        self.num_active = 0
        self._next_entry_id = 0
        self._next_cpu_seq = 0

    # -- helpers ---------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks of `kv.block_tokens` that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_tokens)

    def evictable_bytes(self) -> int:
        """GPU bytes held by idle sessions (what eviction could free now)."""
        return self.idle_bytes

    def metrics(self) -> dict[str, float | int]:
        """No metrics beyond `stats` for per-session KV."""
        return {}

    def _set_idle(self, s: SessionKV) -> None:
        self.idle[s.entry.entry_id] = s
        self.candidates.add(s.entry, self.env.now)
        self.idle_bytes += s.num_bytes

    def _unset_idle(self, s: SessionKV) -> bool:
        if self.idle.pop(s.entry.entry_id, None) is None:
            return False
        self.candidates.discard(s.entry.entry_id)
        self.idle_bytes -= s.num_bytes
        return True

    def _new_session(self, req: Request) -> SessionKV:
        now = self.env.now
        entry = CacheEntry(
            entry_id=self._next_entry_id,
            session_id=req.session_id,
            model_index=req.model_index,
            class_index=req.class_index,
            priority=req.priority,
            num_tokens=0,
            num_bytes=0,
            created_us=now,
            last_used_us=now,
        )
        self._next_entry_id += 1
        m = req.model_index
        s = SessionKV(entry, self.block_bytes[m], self.cpu_block_bytes[m])
        self.sessions[req.session_id] = s
        return s

    # -- arrivals and admission ------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        """A session's next turn arrived: its idle gap is an observation for the reuse model."""
        s = self.sessions.get(req.session_id)
        if s is not None and req.turn > 0:
            gap = self.env.now - s.entry.last_used_us
            e = s.entry
            # The estimator's belief when it ranked this session, next to the true gap.
            predicted = e.gap_ema_us if e.gap_ema_us >= 0 else self.estimator.population_gap_us
            self.events.reuse_gap(self.env.now, req, gap, predicted)
            self.estimator.observe(e, gap)
            self.policy.on_access(e, self.env.now)
            self.candidates.refresh(e, self.env.now)  # the hook may re-key an idle entry

    def admit(self, req: Request) -> Admit:
        """Give `req` the blocks for its context and prompt, evicting idle KV if needed."""
        s = self.sessions.get(req.session_id)
        if s is None:
            s = self._new_session(req)
        if s.tier in (Tier.FLIGHT_OUT, Tier.FLIGHT_IN):
            s.waiting = req
            return Admit.WAIT
        if s.tier == Tier.CPU:
            return self._start_reload(s, req)
        cached = s.num_blocks if s.tier == Tier.GPU else 0
        prefix = req.context_tokens if s.tier == Tier.GPU else 0
        # After a recompute preemption, everything the request had computed must be prefilled again.
        redo = req.prompt_tokens + (req.generated if req.num_preemptions else 0)
        total_blocks = self.blocks_for(req.context_tokens + redo + self.prompt_room)
        need_bytes = (total_blocks - cached) * s.block_bytes
        if total_blocks * s.block_bytes > self.pool.capacity_bytes:
            return Admit.REJECT
        if not self._make_room(need_bytes, exclude=s):
            return Admit.BLOCKED_HIT if cached else Admit.BLOCKED
        self.pool.allocate(need_bytes)
        self._unset_idle(s)
        s.tier, s.active, s.num_blocks = Tier.GPU, True, total_blocks
        self.num_active += 1
        req.prefill_tokens = req.context_tokens + redo - prefix
        if req.num_preemptions == 0:
            self._classify(req, hit=prefix > 0)
        return Admit.READY

    def _classify(self, req: Request, hit: bool) -> None:
        now = self.env.now
        if hit:
            if req.kv_source != KvSource.RELOAD:
                req.kv_source = KvSource.HIT
                self.stats.hits += 1
                self.events.hit(now, req)
        elif req.context_tokens > 0:
            req.kv_source = KvSource.RECOMPUTE
            req.recompute_us_paid = recompute_us(self.fit, req.context_tokens)
            self.stats.recomputes += 1
            self.stats.realized_recompute_us += req.recompute_us_paid
            self.events.recompute(now, req, req.recompute_us_paid)

    def _make_room(self, need_bytes: int, exclude: SessionKV) -> bool:
        """True when the room rule's target is free now; starts evictions towards it if not."""
        idle = self.num_active == 0 and self.pool.in_flight_bytes == 0
        own = exclude.num_bytes if exclude.entry.entry_id in self.idle else 0
        target = self.room.target(need_bytes, idle, lambda: self.idle_bytes - own)
        if self.pool.free_bytes >= target:
            return True
        pending = self.transfers.pending_free_bytes
        short = self.room.shortfall(target, pending, self.idle_bytes - own)
        if short > 0:
            self.evict(short, exclude=exclude, allow_offload=True)
        return self.pool.free_bytes >= target

    # -- eviction ----------------------------------------------------------------------------
    def _can_offload(self, num_bytes: int) -> bool:
        return self.offload_enabled and self.cpu.can_take(num_bytes)

    def _cpu_room(self, num_bytes: int, keep: SessionKV | None) -> bool:
        """Room in the CPU store, dropping its oldest KV; `keep` (the session whose reload is
        making room right now) is never dropped."""

        def drop(session_id: int, seq: int) -> bool | None:
            old = self.sessions.get(session_id)  # None: closed and forgotten since (stale)
            if old is None or old.tier != Tier.CPU or old.cpu_seq != seq:
                return None
            if old is keep:
                return False
            self.cpu.release(old.cpu_bytes)
            self.cpu.record_drop(self.env.now - old.cpu_since_us)
            self.events.cpu_drop(self.env.now, old.entry, old.num_blocks, old.num_bytes)
            old.tier, old.num_blocks = Tier.NONE, 0
            self._forget_if_closed(old)
            return True

        return self.cpu.make_room(num_bytes, drop)

    def _static_restore(self, e: CacheEntry, offload: bool) -> float:
        """`evict`'s restore estimate for idle `e` in a regime where it stays fixed while `e` is
        idle (`_restore_mode`): a reload if the store can take it, else a recompute."""
        if offload and self._can_offload(self.idle[e.entry_id].cpu_bytes):
            return min(e.reload_us, e.recompute_us)
        return e.recompute_us

    def _restore_mode(self, allow_offload: bool) -> bool | None:
        """Whether this decision's restore estimates are `_static_restore(e, mode)`; None when
        they move with idle time (store residency below δ) or with the store's fill."""
        if not (allow_offload and self.offload_enabled):
            return False
        if self.cpu.evicts_lru and self.cpu.residency_us >= self.estimator.delta_us:
            return True
        return None

    def evict(self, bytes_needed: int, exclude: SessionKV | None, allow_offload: bool) -> int:
        """Ask the policy for idle victims covering `bytes_needed`; returns bytes evicted."""
        now = self.env.now

        def prepare(e: CacheEntry) -> CacheEntry:
            """The restore estimate for this decision: reload when a CPU copy will exist."""
            e.restore_us = e.recompute_us
            if allow_offload and self._can_offload(self.idle[e.entry_id].cpu_bytes):
                e.restore_us = self.cpu.restore_us(
                    e.reload_us,
                    e.recompute_us,
                    self.estimator.gap_us(e, now),
                    self.estimator.delta_us,
                )
            return e

        exclude_id = exclude.entry.entry_id if exclude is not None else -1
        mode = self._restore_mode(allow_offload)
        victims = self.candidates.select(bytes_needed, now, prepare, exclude_id, mode)
        for e in victims:  # every victim below is evicted (offloaded or dropped)
            self.policy.on_evict(e, now)
        evicted = 0
        for e in victims:
            s = self.idle[e.entry_id]
            self._unset_idle(s)
            evicted += s.num_bytes
            expected = self.estimator.resume_probability(e, now) * e.restore_us
            self.stats.expected_evict_cost_us += expected
            score = float(self.policy.key(e, now)[0])
            if (
                allow_offload
                and self._can_offload(s.cpu_bytes)
                and self._cpu_room(s.cpu_bytes, keep=exclude)
            ):
                self._start_offload(s, score, expected)
            else:
                self._drop(s, score, expected)
        return evicted

    def _drop(self, s: SessionKV, score: float, expected_us: float) -> None:
        self.stats.evictions_drop += 1
        self.stats.evicted_bytes_drop += s.num_bytes
        self.events.evict(
            self.env.now, s.entry, s.num_blocks, s.num_bytes, False, score, expected_us
        )
        self.pool.release(s.num_bytes)
        s.tier, s.num_blocks = Tier.NONE, 0
        self._forget_if_closed(s)

    def _start_offload(self, s: SessionKV, score: float, expected_us: float) -> None:
        num_bytes = s.num_bytes
        self.stats.evictions_offload += 1
        self.stats.evicted_bytes_offload += num_bytes
        self.events.evict(self.env.now, s.entry, s.num_blocks, num_bytes, True, score, expected_us)
        self.transfers.start_offload(num_bytes)
        self.cpu.reserve(s.cpu_bytes)
        s.tier = Tier.FLIGHT_OUT
        self.transfers.offload_then(num_bytes, s.cpu_bytes, lambda d: self._offloaded(s, d))

    def _offloaded(self, s: SessionKV, duration: int) -> None:
        """A victim's copy to the CPU store landed (`duration` µs paid): its GPU bytes are free."""
        s.tier = Tier.CPU
        s.cpu_seq, s.cpu_since_us = self._next_cpu_seq, self.env.now
        self._next_cpu_seq += 1
        self.cpu.push(s.cpu_seq, 0, s.entry.session_id)
        self.events.offload_done(self.env.now, s.entry, s.num_blocks, s.cpu_bytes, duration)
        self._hand_back(s)
        self.wake.notify()

    def _start_reload(self, s: SessionKV, req: Request) -> Admit:
        num_bytes = s.num_bytes
        if not self._make_room(num_bytes, exclude=s):
            return Admit.BLOCKED
        self.pool.start_reload(num_bytes)
        s.tier = Tier.FLIGHT_IN
        s.waiting = req
        self.events.reload_start(self.env.now, req, s.num_blocks, num_bytes)
        self.env.process(self._reload(s, req, num_bytes))
        return Admit.WAIT

    def _reload(
        self, s: SessionKV, req: Request, num_bytes: int
    ) -> Generator[simpy.Event, object, None]:
        """Process: copy a session's blocks back from the CPU store; the request then re-queues.
        The paid time counts the copy and a quantized tier's conversion."""
        duration = yield from self.transfers.reload(num_bytes, s.cpu_bytes)
        self.cpu.release(s.cpu_bytes)
        s.tier = Tier.GPU
        s.entry.last_used_us = self.env.now
        self._set_idle(s)  # evictable again until its request is admitted
        req.kv_source = KvSource.RELOAD
        req.reload_us_paid += duration
        self.stats.reloads += 1
        self.stats.realized_reload_us += duration
        self.events.reload_done(self.env.now, req, s.num_blocks, s.cpu_bytes, duration)
        self._hand_back(s)

    def _hand_back(self, s: SessionKV) -> None:
        req, s.waiting = s.waiting, None
        if req is not None:
            self.queue.requeue_front(req)

    # -- running requests ----------------------------------------------------------------------
    def grow(self, session_ids: list[int], num_blocks: list[int]) -> bool:
        """Give running sessions more blocks now (decode growth); all or nothing.

        If memory is short, idle KV is dropped (there is no time to offload it); False when even
        that does not free enough, and then nothing changes.
        """
        sessions = [self.sessions[sid] for sid in session_ids]
        num_bytes = sum(s.block_bytes * n for s, n in zip(sessions, num_blocks, strict=True))
        if self.pool.free_bytes < num_bytes:
            self.evict(num_bytes - self.pool.free_bytes, exclude=None, allow_offload=False)
        if self.pool.free_bytes < num_bytes:
            return False
        self.pool.allocate(num_bytes)
        for s, n in zip(sessions, num_blocks, strict=True):
            s.num_blocks += n
        return True

    def maintain_watermark(self) -> None:
        """After an iteration: start evicting so that the watermark is free again soon."""
        short = self.room.watermark_shortfall(self.transfers.pending_free_bytes)
        if short > 0 and self.idle:
            self.evict(short, exclude=None, allow_offload=True)

    def finish(self, req: Request, num_tokens: int) -> None:
        """A turn ended: the session's KV stays on the GPU, idle and evictable."""
        s = self.sessions[req.session_id]
        s.active = False
        self.num_active -= 1
        e = s.entry
        e.num_tokens, e.num_bytes = num_tokens, s.num_bytes
        e.last_used_us = self.env.now
        e.num_uses += 1
        e.recompute_us = recompute_us(self.fit, num_tokens)
        e.reload_us = self.transfers.reload_estimate_us(s.num_bytes, s.cpu_bytes)
        e.next_arrival_us = self.env.now + req.next_gap_us if req.next_gap_us >= 0 else -1
        self.policy.on_release(e, self.env.now)  # before indexing: the hook may set its key
        self._set_idle(s)

    def abandon(self, req: Request) -> None:
        """A queued request gave up (queue timeout). A session's reloaded KV is already idle and
        evictable here, so nothing is held for it."""

    def close_session(self, session_id: int) -> None:
        """The session sends no more turns: its record goes now if it holds no KV, else when its
        KV is dropped (from the GPU or the CPU store); idle KV stays evictable as before."""
        if (s := self.sessions.get(session_id)) is not None:
            s.closed = True
            self._forget_if_closed(s)

    def _forget_if_closed(self, s: SessionKV) -> None:
        if s.closed and s.tier == Tier.NONE and self.forget_closed:  # no request of it is left
            del self.sessions[s.entry.session_id]

    def preempt(self, req: Request, num_tokens: int, swapped: bool = False) -> None:
        """Preemption: the running request loses all its GPU KV and re-queues; recomputed on
        resume unless `swapped` (the engine's CPU swap space holds it)."""
        s = self.sessions[req.session_id]
        cost = 0.0 if swapped else recompute_us(self.fit, num_tokens)
        self.stats.preemptions += 1
        self.stats.preempt_recompute_us += cost
        self.events.preempt(self.env.now, req, s.num_blocks, s.num_bytes, cost)
        self.pool.release(s.num_bytes)
        s.tier, s.active, s.num_blocks = Tier.NONE, False, 0
        self.num_active -= 1
        req.num_preemptions += 1
