"""One serving engine (one GPU): scheduler, batcher, KV manager, VRAM pool and PCIe link, wired on
a clock it shares with its clients or a whole cluster. The single-GPU simulation is one of these.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from typing import Any

import simpy

from cachepilot_sim.clock import SimEnvironment, s_to_us
from cachepilot_sim.components.batcher import Batcher
from cachepilot_sim.components.cpu_swap import CpuSwapSpace
from cachepilot_sim.components.kv import KvDeps, make_kv_manager
from cachepilot_sim.components.kv.protocol import SharedKvStore
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.components.ports import EnginePorts
from cachepilot_sim.components.request import Request, RequestSink
from cachepilot_sim.components.scheduler import RequestQueue, Scheduler
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.components.step_cost import make_step_cost
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.config import SimConfig
from cachepilot_sim.cost import transfer_fits
from cachepilot_sim.cost.gpu_scaling import run_hardware
from cachepilot_sim.policies import GapEstimator, make_policy
from cachepilot_sim.policies.oracle import ShadowOracle
from cachepilot_sim.trace.events import TraceEvents


class Replica:
    """The engine's components, built in the order of the process diagram (docs/architecture.md):
    each gets the ports it talks through, nothing is wired afterwards. Requests enter through
    the scheduler (`inbox`, `submit`); `processes()` are started by the owner, after its clients."""

    def __init__(
        self,
        env: SimEnvironment,
        cfg: SimConfig,
        events: TraceEvents,
        remote: SharedKvStore | None = None,
    ) -> None:
        """`remote`: this replica's port to the cluster's shared KV tier (None: none)."""
        self.env, self.events = env, events
        # The GPU type and TP degree's hardware (one H200: cfg.hardware itself, unchanged).
        hw, fit = run_hardware(cfg)
        h2d, d2h = transfer_fits(hw)
        self.pool = VramPool(cfg)
        self.link = PcieLink(env, h2d, d2h)
        p = cfg.policy
        self.estimator = GapEstimator(p.ema_weight, s_to_us(p.prior_gap_s), s_to_us(p.delta_s))
        self.policy = make_policy(p, self.estimator)
        if p.shadow_oracle:
            self.policy = ShadowOracle(self.policy, self.estimator, p)
        wake = Signal(env)
        self.queue = RequestQueue(env, cfg.scheduler, wake)
        deps = KvDeps(
            env, self.pool, self.link, self.policy, self.estimator, fit, events, self.queue, wake,
            remote,
        )  # fmt: skip
        self.kv = make_kv_manager(cfg if hw is cfg.hardware else replace(cfg, hardware=hw), deps)
        e = cfg.engine  # vLLM: the AsyncLLM front end's intake of a request
        intake = (e.frontend_in_us, e.frontend_in_token_us)
        self.scheduler = Scheduler(env, self.queue, self.kv, events, intake)
        swap_blocks = cfg.engine.cpu_swap_blocks
        self.swap = CpuSwapSpace(self.link, swap_blocks) if swap_blocks else None
        ports = EnginePorts(
            env, self.queue, self.kv, self.pool, fit, events, wake, make_step_cost(cfg, fit),
            self.swap,
        )  # fmt: skip
        self.batcher = Batcher(cfg, ports)

    @property
    def inbox(self) -> RequestSink:
        """Where requests for this engine are put."""
        return self.scheduler

    def submit(self, req: Request) -> simpy.Event:
        """Put `req` in this engine's inbox; the returned event fires when it is done."""
        self.scheduler.put(req)  # queued at once
        return req.done

    def processes(self) -> list[Generator[simpy.Event, Any, None]]:
        """The engine's processes (the batcher: the scheduler takes arrivals without one)."""
        return [self.batcher.run()]

    def kv_load(self) -> float:
        """(Used + in-flight KV bytes) / pool bytes."""
        pool = self.pool
        return (pool.used_bytes + pool.in_flight_bytes) / pool.capacity_bytes
