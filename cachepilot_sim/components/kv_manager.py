"""Paged KV-cache manager: allocate, extend, release, offload, reload, preempt.

A session's KV outlives its turn: when a turn ends the KV stays on the GPU, idle, until the eviction
policy picks it. A victim goes to the CPU store over PCIe when offload is on and the store has room,
otherwise it is dropped. A returning session hits (GPU), reloads (CPU) or prefills its context
again. The KV of a session is on exactly one tier at a time: GPU, CPU, none, or in flight between
them.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import IntEnum

import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.components.request import KvSource, Request
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.config import ModelConfig, SimConfig
from cachepilot_sim.cost import ComputeFit, quantize_us, recompute_us
from cachepilot_sim.policies import CacheEntry, EvictionPolicy, GapEstimator
from cachepilot_sim.trace.recorder import TraceRecorder


class Tier(IntEnum):
    GPU = 0
    CPU = 1
    NONE = 2
    FLIGHT_OUT = 3  # GPU -> CPU copy in progress
    FLIGHT_IN = 4  # CPU -> GPU copy in progress


class Admit(IntEnum):
    READY = 0  # blocks allocated; the request can run
    WAIT = 1  # its KV is in flight; the manager hands it back when the copy lands
    BLOCKED = 2  # not enough free memory yet
    REJECT = 3  # can never fit


class SessionKV:
    """The manager's record of one session's KV."""

    __slots__ = ("entry", "tier", "num_blocks", "block_bytes", "active", "waiting")

    def __init__(self, entry: CacheEntry, block_bytes: int) -> None:
        self.entry = entry
        self.tier = Tier.NONE
        self.num_blocks = 0
        self.block_bytes = block_bytes
        self.active = False  # attached to a running request (never evictable then)
        self.waiting: Request | None = None  # request parked until an in-flight copy lands

    @property
    def num_bytes(self) -> int:
        return self.num_blocks * self.block_bytes


@dataclass
class KvStats:
    """Counters of what the cache did; realized costs are paid costs, not predictions."""

    hits: int = 0
    reloads: int = 0
    recomputes: int = 0
    preemptions: int = 0
    evictions_offload: int = 0
    evictions_drop: int = 0
    evicted_bytes_offload: int = 0
    evicted_bytes_drop: int = 0
    realized_reload_us: int = 0
    realized_recompute_us: float = 0.0
    preempt_recompute_us: float = 0.0
    expected_evict_cost_us: float = 0.0  # the seed's metric: sum of P(resume) x restore at eviction
    cpu_drops: int = 0  # CPU-resident KV dropped to make room in the store
    cpu_peak_bytes: int = 0
    convert_us: int = 0  # quantize before offload + dequantize after reload (quantized CPU tier)


def cpu_kv_bytes_per_token(model: ModelConfig, offload_dtype_bytes: int) -> int:
    """KV bytes a token in the CPU store: the GPU's unless `offload_dtype_bytes` is smaller, then
    that many bytes a value plus a float32 scale per (layer, K|V) row (per-token quantization).
    """
    if offload_dtype_bytes in (0, model.kv_dtype_bytes):
        return model.kv_bytes_per_token
    values = 2 * model.num_layers * model.num_kv_heads * model.head_dim
    return values * offload_dtype_bytes + 2 * model.num_layers * 4


class KvManager:
    def __init__(
        self,
        env: SimEnvironment,
        cfg: SimConfig,
        pool: VramPool,
        link: PcieLink,
        policy: EvictionPolicy,
        estimator: GapEstimator,
        fit: ComputeFit,
        recorder: TraceRecorder,
    ) -> None:
        self.env = env
        self.pool = pool
        self.link = link
        self.policy = policy
        self.estimator = estimator
        self.fit = fit
        self.recorder = recorder
        self.block_tokens = cfg.kv.block_tokens
        self.block_bytes = [m.kv_bytes_per_token * cfg.kv.block_tokens for m in cfg.models]
        # The CPU store's form of a block: the GPU's unless kv.offload_dtype_bytes quantizes it.
        self.cpu_block_bytes = [cpu_kv_bytes_per_token(m, cfg.kv.offload_dtype_bytes)
                                * cfg.kv.block_tokens for m in cfg.models]
        self.quantize_bytes_per_us = cfg.hardware.quantize_bytes_per_us
        self.offload_enabled = cfg.kv.offload_enabled
        self.cpu_capacity_bytes = cfg.kv.cpu_store_bytes
        self.cpu_used_bytes = 0
        self.watermark_bytes = int(cfg.kv.watermark_fraction * pool.capacity_bytes)
        self.pending_free_bytes = 0  # offloads in flight: will become free
        self.sessions: dict[int, SessionKV] = {}
        self.idle: dict[int, SessionKV] = {}  # GPU-resident, not attached: eviction candidates
        self.cpu_lru: dict[int, SessionKV] = {}  # CPU-resident, oldest offload first
        self.cpu_store_lru = cfg.kv.cpu_store_evicts_lru
        self.stats = KvStats()
        self.on_ready: Callable[[Request], None] = lambda req: None
        self.on_memory: Callable[[], None] = lambda: None
        self._next_entry_id = 0

    # -- helpers ---------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def cpu_bytes(self, s: SessionKV) -> int:
        """Bytes the session's KV takes in the CPU store and on the wire."""
        return s.num_blocks * self.cpu_block_bytes[s.entry.model_index]

    def convert_us(self, s: SessionKV) -> int:
        """GPU time to quantize the KV for the CPU store (or dequantize it back); 0 for a copy."""
        cpu = self.cpu_bytes(s)
        if cpu == s.num_bytes:
            return 0
        return quantize_us(self.quantize_bytes_per_us, s.num_bytes, cpu)

    def evictable_bytes(self) -> int:
        """GPU bytes held by idle sessions (what eviction could free now); O(idle sessions)."""
        return sum(s.num_bytes for s in self.idle.values())

    def _new_session(self, req: Request) -> SessionKV:
        entry = CacheEntry(
            entry_id=self._next_entry_id,
            session_id=req.session_id,
            model_index=req.model_index,
            class_index=req.class_index,
            priority=req.priority,
            num_tokens=0,
            num_bytes=0,
            created_us=self.env.now,
            last_used_us=self.env.now,
        )
        self._next_entry_id += 1
        s = SessionKV(entry, self.block_bytes[req.model_index])
        self.sessions[req.session_id] = s
        return s

    # -- arrivals and admission ------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        """A session's next turn arrived: its idle gap is an observation for the reuse model."""
        s = self.sessions.get(req.session_id)
        if s is not None and req.turn > 0:
            gap = self.env.now - s.entry.last_used_us
            # Trace the estimator's prediction (its gap EMA before this observation) next to the
            # true gap: what the reuse model believed when it ranked this session.
            e = s.entry
            self.recorder.emit(
                self.env.now,
                "kv",
                "reuse_gap",
                req.session_id,
                req.req_id,
                req.model_index,
                value=gap,
                score=e.gap_ema_us if e.gap_ema_us >= 0 else self.estimator.population_gap_us,
            )
            self.estimator.observe(s.entry, gap)
            self.policy.on_access(s.entry, self.env.now)

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
        total_blocks = self.blocks_for(req.context_tokens + redo)
        need_bytes = (total_blocks - cached) * s.block_bytes
        if total_blocks * s.block_bytes > self.pool.capacity_bytes:
            return Admit.REJECT
        if not self._make_room(need_bytes, exclude=s):
            return Admit.BLOCKED
        self.pool.allocate(need_bytes)
        self.idle.pop(s.entry.entry_id, None)
        s.tier, s.active, s.num_blocks = Tier.GPU, True, total_blocks
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
                self.recorder.emit(now, "kv", "hit", req.session_id, req.req_id, req.model_index)
        elif req.context_tokens > 0:
            req.kv_source = KvSource.RECOMPUTE
            req.recompute_us_paid = recompute_us(self.fit, req.context_tokens)
            self.stats.recomputes += 1
            self.stats.realized_recompute_us += req.recompute_us_paid
            self.recorder.emit(
                now,
                "kv",
                "recompute",
                req.session_id,
                req.req_id,
                req.model_index,
                value=int(req.recompute_us_paid),
                cost_us=req.recompute_us_paid,
            )

    def _make_room(self, need_bytes: int, exclude: SessionKV | None) -> bool:
        """True when `need_bytes` (plus the watermark, if it can ever fit) are free now."""
        target = need_bytes + self.watermark_bytes
        if target > self.pool.capacity_bytes:
            target = need_bytes
        if self.pool.free_bytes >= target:
            return True
        short = target - self.pool.free_bytes - self.pending_free_bytes
        if short > 0:
            self.evict(short, exclude=exclude, allow_offload=True)
        return self.pool.free_bytes >= target

    # -- eviction ----------------------------------------------------------------------------
    def _can_offload(self, num_bytes: int) -> bool:
        if not self.offload_enabled:
            return False
        if self.cpu_store_lru:
            return num_bytes <= self.cpu_capacity_bytes
        return self.cpu_used_bytes + num_bytes <= self.cpu_capacity_bytes

    def _cpu_room(self, num_bytes: int, keep: SessionKV | None) -> bool:
        """Make room in the CPU store by dropping its least recently offloaded KV, if allowed.

        `keep` is never dropped: it is the session whose reload is making room right now.
        """
        while self.cpu_used_bytes + num_bytes > self.cpu_capacity_bytes:
            old = next((o for o in self.cpu_lru.values() if o is not keep), None)
            if old is None:
                break
            del self.cpu_lru[old.entry.entry_id]
            self.cpu_used_bytes -= self.cpu_bytes(old)
            self.stats.cpu_drops += 1
            self.recorder.emit(
                self.env.now,
                "kv",
                "evict_drop",
                old.entry.session_id,
                -1,
                old.entry.model_index,
                old.num_blocks,
                old.num_bytes,
                "cpu",
            )
            old.tier, old.num_blocks = Tier.NONE, 0
        return self.cpu_used_bytes + num_bytes <= self.cpu_capacity_bytes

    def evict(self, bytes_needed: int, exclude: SessionKV | None, allow_offload: bool) -> int:
        """Ask the policy for idle victims covering `bytes_needed`; returns bytes evicted."""
        candidates: list[CacheEntry] = []
        for s in self.idle.values():
            if s is exclude:
                continue
            e = s.entry
            e.restore_us = e.recompute_us
            if allow_offload and self._can_offload(self.cpu_bytes(s)):
                e.restore_us = min(e.recompute_us, e.reload_us)
            candidates.append(e)
        if not candidates:
            return 0
        now = self.env.now
        victims = self.policy.select_victims(candidates, bytes_needed, now)
        for e in victims:  # every victim below is evicted (offloaded or dropped)
            self.policy.on_evict(e, now)
        evicted = 0
        for e in victims:
            s = self.idle.pop(e.entry_id)
            evicted += s.num_bytes
            expected = self.estimator.resume_probability(e, now) * e.restore_us
            self.stats.expected_evict_cost_us += expected
            score = float(self.policy.key(e, now)[0])
            if (
                allow_offload
                and self._can_offload(self.cpu_bytes(s))
                and self._cpu_room(self.cpu_bytes(s), keep=exclude)
            ):
                self._start_offload(s, score, expected)
            else:
                self._drop(s, score, expected)
        return evicted

    def _drop(self, s: SessionKV, score: float, expected_us: float) -> None:
        self.stats.evictions_drop += 1
        self.stats.evicted_bytes_drop += s.num_bytes
        self.recorder.emit(
            self.env.now,
            "kv",
            "evict_drop",
            s.entry.session_id,
            -1,
            s.entry.model_index,
            s.num_blocks,
            s.num_bytes,
            "none",
            score,
            cost_us=expected_us,
        )
        self.pool.release(s.num_bytes)
        s.tier, s.num_blocks = Tier.NONE, 0

    def _start_offload(self, s: SessionKV, score: float, expected_us: float) -> None:
        num_bytes = s.num_bytes
        self.stats.evictions_offload += 1
        self.stats.evicted_bytes_offload += num_bytes
        self.recorder.emit(
            self.env.now,
            "kv",
            "evict_offload",
            s.entry.session_id,
            -1,
            s.entry.model_index,
            s.num_blocks,
            num_bytes,
            "flight",
            score,
            cost_us=expected_us,
        )
        self.pool.start_offload(num_bytes)
        self.cpu_used_bytes += self.cpu_bytes(s)
        self.stats.cpu_peak_bytes = max(self.stats.cpu_peak_bytes, self.cpu_used_bytes)
        self.pending_free_bytes += num_bytes
        s.tier = Tier.FLIGHT_OUT
        self.env.process(self._offload(s, num_bytes))

    def _offload(self, s: SessionKV, num_bytes: int) -> Generator[simpy.Event, object, None]:
        """Process: copy a victim's blocks to the CPU store, then free them on the GPU.

        A quantized CPU tier first converts the blocks on the GPU (no PCIe lane held), then copies
        the smaller form; the GPU blocks are freed when the copy lands.
        """
        convert = self.convert_us(s)
        if convert:
            self.stats.convert_us += convert
            yield self.env.timeout(convert)
        duration = convert + (yield from self.link.transfer("d2h", self.cpu_bytes(s)))
        self.pool.finish_offload(num_bytes)
        self.pending_free_bytes -= num_bytes
        s.tier = Tier.CPU
        self.cpu_lru[s.entry.entry_id] = s
        self.recorder.emit(
            self.env.now,
            "pcie",
            "offload_done",
            s.entry.session_id,
            -1,
            s.entry.model_index,
            s.num_blocks,
            self.cpu_bytes(s),  # bytes on the wire (the trace's PCIe volume)
            "cpu",
            value=duration,
        )
        self._hand_back(s)
        self.on_memory()

    def _start_reload(self, s: SessionKV, req: Request) -> Admit:
        num_bytes = s.num_bytes
        if not self._make_room(num_bytes, exclude=s):
            return Admit.BLOCKED
        self.pool.start_reload(num_bytes)
        del self.cpu_lru[s.entry.entry_id]
        s.tier = Tier.FLIGHT_IN
        s.waiting = req
        self.recorder.emit(
            self.env.now,
            "pcie",
            "reload_start",
            req.session_id,
            req.req_id,
            req.model_index,
            s.num_blocks,
            num_bytes,
            "flight",
        )
        self.env.process(self._reload(s, req, num_bytes))
        return Admit.WAIT

    def _reload(self, s: SessionKV, req: Request, num_bytes: int) -> Generator:
        """Process: copy a session's blocks back from the CPU store (dequantizing them on the GPU
        for a quantized tier); the request then re-queues. The paid time counts both.
        """
        duration = yield from self.link.transfer("h2d", self.cpu_bytes(s))
        convert = self.convert_us(s)
        if convert:
            self.stats.convert_us += convert
            yield self.env.timeout(convert)
            duration += convert
        self.pool.finish_reload(num_bytes)
        self.cpu_used_bytes -= self.cpu_bytes(s)
        s.tier = Tier.GPU
        s.entry.last_used_us = self.env.now
        self.idle[s.entry.entry_id] = s  # evictable again until its request is admitted
        req.kv_source = KvSource.RELOAD
        req.reload_us_paid += duration
        self.stats.reloads += 1
        self.stats.realized_reload_us += duration
        self.recorder.emit(
            self.env.now,
            "pcie",
            "reload_done",
            req.session_id,
            req.req_id,
            req.model_index,
            s.num_blocks,
            self.cpu_bytes(s),  # bytes on the wire (the trace's PCIe volume)
            "gpu",
            value=duration,
        )
        self._hand_back(s)

    def _hand_back(self, s: SessionKV) -> None:
        req, s.waiting = s.waiting, None
        if req is not None:
            self.on_ready(req)

    # -- running requests ----------------------------------------------------------------------
    def grow(self, session_ids: list[int], num_blocks: list[int]) -> bool:
        """Give running sessions more blocks now (decode growth); all or nothing.

        If memory is short, idle KV is dropped (there is no time to offload it); False when even
        that does not free enough, and then nothing changes.
        """
        sessions = [self.sessions[sid] for sid in session_ids]
        num_bytes = sum(s.block_bytes * n for s, n in zip(sessions, num_blocks, strict=False))
        if self.pool.free_bytes < num_bytes:
            self.evict(num_bytes - self.pool.free_bytes, exclude=None, allow_offload=False)
        if self.pool.free_bytes < num_bytes:
            return False
        self.pool.allocate(num_bytes)
        for s, n in zip(sessions, num_blocks, strict=False):
            s.num_blocks += n
        return True

    def maintain_watermark(self) -> None:
        """After an iteration: start evicting so that the watermark is free again soon."""
        short = self.watermark_bytes - self.pool.free_bytes - self.pending_free_bytes
        if short > 0 and self.idle:
            self.evict(short, exclude=None, allow_offload=True)

    def finish(self, req: Request, num_tokens: int) -> None:
        """A turn ended: the session's KV stays on the GPU, idle and evictable."""
        s = self.sessions[req.session_id]
        s.active = False
        e = s.entry
        e.num_tokens, e.num_bytes = num_tokens, s.num_bytes
        e.last_used_us = self.env.now
        e.num_uses += 1
        e.recompute_us = recompute_us(self.fit, num_tokens)
        e.reload_us = float(self.link.duration_us("h2d", self.cpu_bytes(s)) + self.convert_us(s))
        e.next_arrival_us = self.env.now + req.next_gap_us if req.next_gap_us >= 0 else -1
        self.idle[e.entry_id] = s
        self.policy.on_release(e, self.env.now)

    def abandon(self, req: Request) -> None:
        """A queued request gave up (queue timeout): let go of anything held for it. A session's
        reloaded KV is already idle and evictable here, so there is nothing to release."""

    def preempt(self, req: Request, num_tokens: int) -> None:
        """Recompute preemption: the running request loses all its KV and re-queues."""
        s = self.sessions[req.session_id]
        cost = recompute_us(self.fit, num_tokens)
        self.stats.preemptions += 1
        self.stats.preempt_recompute_us += cost
        self.recorder.emit(
            self.env.now,
            "kv",
            "preempt",
            req.session_id,
            req.req_id,
            req.model_index,
            s.num_blocks,
            s.num_bytes,
            "none",
            value=int(cost),
            cost_us=cost,
        )
        self.pool.release(s.num_bytes)
        s.tier, s.active, s.num_blocks = Tier.NONE, False, 0
        req.num_preemptions += 1
