"""The engine's ports: what the batcher is handed at construction (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.cpu_swap import CpuSwapSpace
from cachepilot_sim.components.kv import KvManager
from cachepilot_sim.components.scheduler import RequestQueue
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.components.step_cost import StepCostModel
from cachepilot_sim.components.vram_pool import PoolView
from cachepilot_sim.cost import ComputeFit
from cachepilot_sim.trace.events import TraceEvents


@dataclass(frozen=True, slots=True)
class EnginePorts:
    """What the batcher talks to, handed in at construction."""

    env: SimEnvironment
    queue: RequestQueue  # peek/pop in scheduling order; preempted requests go back to the front
    kv: KvManager
    pool: PoolView  # read-only: free and held bytes
    fit: ComputeFit
    events: TraceEvents
    wake: Signal  # an arrival, a landed copy or a hand-back: re-check admission
    step_cost: StepCostModel  # the engine profile's step time (components/step_cost.py)
    # The engine's pinned CPU swap pool (engine.cpu_swap_blocks > 0); None: preemption recomputes.
    swap: CpuSwapSpace | None = None
