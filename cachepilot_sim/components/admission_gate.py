"""Admission gate: before a new session's first turn is admitted under KV pressure, a controller
decides admit, defer (back to the queue after `defer_ms`) or reject (reason `admission`).

Later turns, preempted requests and requests already cleared once are never gated: admission is a
decision about taking on a session, not about serving one already taken. With `admission.name:
all` the gate is off and the batcher never calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from cachepilot_sim.admission import AdmissionController, AdmissionView, Decision, make_controller
from cachepilot_sim.admission.features import feature_names
from cachepilot_sim.clock import SimEnvironment, ms_to_us, s_to_us
from cachepilot_sim.components.kv import KvManager
from cachepilot_sim.components.request import Request
from cachepilot_sim.components.scheduler import RequestQueue
from cachepilot_sim.components.vram_pool import PoolView
from cachepilot_sim.config import SimConfig

EVICTION_RATE_TAU_US = s_to_us(1.0)  # time constant of the eviction-rate EMA


def gate_class_names(cfg: SimConfig) -> list[str]:
    """The classes the controller's features are split by (a replayed trace is one class)."""
    return list(cfg.workload.classes) if cfg.replay.format == "none" else ["trace"]


class AdmissionGate:
    """Admit, defer or reject a new session's first turn; its ports are handed in: the queue
    (pop, requeue), the KV manager (sizes, stats, evictable bytes), a read-only pool view, the
    engine's reject and its running fraction (running sequences over the sequence limit)."""

    def __init__(
        self,
        env: SimEnvironment,
        cfg: SimConfig,
        queue: RequestQueue,
        kv: KvManager,
        pool: PoolView,
        reject: Callable[[Request, str], None],
        running_fraction: Callable[[], float],
    ) -> None:
        a = cfg.admission
        self.env, self.queue, self.kv, self.pool, self.reject = env, queue, kv, pool, reject
        self.running_fraction = running_fraction
        self.class_names = gate_class_names(cfg)
        self.feature_names = feature_names(self.class_names)
        self.controller: AdmissionController = make_controller(a, self.feature_names)
        self.defer_us = ms_to_us(a.defer_ms)
        self.max_defers = a.max_defers
        self.pressure_queue_depth = a.pressure_queue_depth
        self._cleared: set[int] = set()  # req ids already let through: never asked twice
        self._defers: dict[int, int] = {}
        self._rate_per_s = 0.0
        self._last_us = 0
        self._last_evictions = 0
        self.num_deferred = 0
        self.num_rejected = 0

    def _eviction_rate(self) -> float:
        st = self.kv.stats
        evictions = st.evictions_offload + st.evictions_drop
        dt = self.env.now - self._last_us
        if dt > 0:
            alpha = 1.0 - math.exp(-dt / EVICTION_RATE_TAU_US)
            rate = (evictions - self._last_evictions) * s_to_us(1.0) / dt
            self._rate_per_s += alpha * (rate - self._rate_per_s)
            self._last_us, self._last_evictions = self.env.now, evictions
        return self._rate_per_s

    def view(self, req: Request) -> AdmissionView:
        """What the controller sees about admitting `req` now (queue, pool, need, rates)."""
        pool = self.pool
        need = self.kv.blocks_for(req.context_tokens + req.prompt_tokens)
        return AdmissionView(
            queue_depth=len(self.queue),
            pool_bytes=pool.capacity_bytes,
            free_bytes=pool.free_bytes,
            evictable_bytes=self.kv.evictable_bytes(),
            held_bytes=pool.used_bytes + pool.in_flight_bytes,
            need_bytes=need * self.kv.block_bytes[req.model_index],
            tokens=req.context_tokens + req.prompt_tokens,
            class_index=req.class_index,
            num_classes=len(self.class_names),
            eviction_rate_per_s=self._eviction_rate(),
            running_fraction=self.running_fraction(),
            num_defers=self._defers.get(req.req_id, 0),
            max_defers=self.max_defers,
        )

    def passes(self, req: Request) -> bool:
        """True: admit `req` as usual. False: the gate took it off the queue (deferred or
        rejected); the caller peeks again."""
        if req.turn != 0 or req.num_preemptions or req.req_id in self._cleared:
            return True
        v = self.view(req)
        pressure = v.under_pressure_bytes or v.queue_depth >= self.pressure_queue_depth
        decision = self.controller.decide(v) if pressure else Decision.ADMIT
        if decision == Decision.DEFER and v.num_defers >= self.max_defers:
            decision = Decision.ADMIT
        if decision == Decision.ADMIT:
            self._cleared.add(req.req_id)
            return True
        self.queue.pop(req)
        if decision == Decision.REJECT:
            self.num_rejected += 1
            self._defers.pop(req.req_id, None)
            self.reject(req, "admission")
            return False
        self.num_deferred += 1
        self._defers[req.req_id] = v.num_defers + 1
        timer = self.env.timeout(self.defer_us)
        timer.callbacks.append(lambda _: self.queue.requeue(req))
        return False
