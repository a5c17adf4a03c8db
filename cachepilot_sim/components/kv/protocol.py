"""What the engine sees of a KV manager: one protocol, implemented by the session manager
(`session.py`, synthetic sessions) and the prefix manager (`prefix.py`, hash-block sharing on
traces), which share collaborators (room rule, CPU store, transfers) instead of a parent class.

Ports are handed in at construction (`KvDeps`): a manager talks to the request queue, the wake
signal, the pool and the PCIe link it is given, and to nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.components.request import Request
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.cost import ComputeFit
from cachepilot_sim.policies import EvictionPolicy, GapEstimator
from cachepilot_sim.trace.events import TraceEvents


class Tier(IntEnum):
    """Where a unit of KV (a session's, or a prefix block) is: exactly one at a time."""

    GPU = 0
    CPU = 1
    NONE = 2
    FLIGHT_OUT = 3  # GPU -> CPU copy in progress
    FLIGHT_IN = 4  # CPU -> GPU copy in progress


class Admit(IntEnum):
    """The outcome of asking a KV manager to admit a request."""

    READY = 0  # blocks allocated; the request can run
    WAIT = 1  # its KV is in flight; the manager hands it back when the copy lands
    BLOCKED = 2  # not enough free memory yet
    REJECT = 3  # can never fit
    # BLOCKED after finding some of its KV cached on the GPU (an engine that makes a request
    # active on a prefix hit, before allocating the rest, sees a starved running request)
    BLOCKED_HIT = 4


@dataclass
class KvStats:
    """Counters of what the cache did; realized costs are paid costs, not predictions. The prefix
    fields stay 0 for the session manager."""

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
    cpu_drops: int = 0  # KV dropped by the CPU store to make room (sessions or blocks)
    cpu_peak_bytes: int = 0
    convert_us: int = 0  # quantize before offload + dequantize after reload (quantized CPU tier)
    # Prefix sharing (trace replay), counted once per request at its first admission.
    lookup_blocks: int = 0
    hit_blocks: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    cap_evictions: int = 0  # blocks evicted to respect replay.prefix_cache_max_blocks
    reload_blocks: int = 0  # blocks brought back from the CPU store


class EngineQueue(Protocol):
    """The request queue as a KV manager sees it: a request whose KV landed goes first."""

    def requeue_front(self, req: Request) -> None:
        """Put `req` before every queued request and wake the engine."""
        ...


class SharedKvStore(Protocol):
    """One replica's port to the shared store of prefix blocks (by hash)."""

    write_on_eviction: bool  # cluster.shared_tier.write == ON_EVICTION
    load_when_cheaper: bool  # cluster.shared_tier.load == CHEAPER
    hash_tokens: int  # tokens of one block

    def holds(self, hash_id: int) -> bool:
        """The store has the block or is writing it."""
        ...

    def load_estimate_us(self, num_blocks: int) -> int:
        """Modelled time (µs) to load `num_blocks` into this replica if started now."""
        ...

    def record_choice(self, req_id: int, num_recomputed: int, recompute_us: float) -> None:
        """The request's latest load-or-recompute choice (0 blocks recomputed: it loads)."""
        ...

    def num_stored(self, hash_ids: Sequence[int], start: int) -> int:
        """How many blocks of `hash_ids`, from position `start` on, the store can serve now
        (consecutive: the first one it lacks ends the run)."""
        ...

    def start_load(self, hash_ids: Sequence[int]) -> simpy.Event:
        """Pin the blocks in the store now and start copying them to this replica; the event's
        value is the transfer time paid (µs) when they have landed."""
        ...

    def store(
        self,
        blocks: Sequence[tuple[int, int, float]],
        landed: Callable[[int], None] | None = None,
    ) -> int:
        """Write (hash id, group id, recompute µs) blocks this replica computed to the store;
        those it already holds or is writing are skipped. Returns how many are being written;
        `landed(µs paid)` runs when they are stored."""
        ...


@dataclass(frozen=True, slots=True)
class KvDeps:
    """Everything a KV manager talks to, handed in at construction (its ports)."""

    env: SimEnvironment
    pool: VramPool
    link: PcieLink
    policy: EvictionPolicy
    estimator: GapEstimator
    fit: ComputeFit
    events: TraceEvents
    queue: EngineQueue  # hands back a request whose reload (or wait for a copy) is over
    wake: Signal  # memory was freed (an offload landed): the engine may admit again
    # A cluster's shared KV store (None: none). The prefix manager loads misses from it and
    # writes finished blocks to it (`remote.py`); the session manager ignores it.
    remote: SharedKvStore | None = None


class KvManager(Protocol):
    """What the batcher, the admission gate and the simulation call. Sizes are per model."""

    stats: KvStats
    block_tokens: int
    block_bytes: list[int]  # GPU bytes of one block, per model

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        ...

    def on_arrival(self, req: Request) -> None:
        """A request reached the scheduler: reuse observations for the policy and estimator."""
        ...

    def admit(self, req: Request) -> Admit:
        """Give `req` the KV it needs to run (hit, reload, or recompute), evicting idle KV."""
        ...

    def grow(self, session_ids: list[int], num_blocks: list[int]) -> bool:
        """More blocks for running requests now (decode growth); all or nothing."""
        ...

    def maintain_watermark(self) -> None:
        """After an iteration: start evicting so that the free watermark is restored soon."""
        ...

    def finish(self, req: Request, num_tokens: int) -> None:
        """The request ended holding `num_tokens` tokens of KV; that KV becomes idle."""
        ...

    def preempt(self, req: Request, num_tokens: int, swapped: bool = False) -> None:
        """Preemption: the running request loses its GPU KV and will prefill again; `swapped`:
        the engine copied that KV to its CPU swap space, so nothing is recomputed (cost 0)."""
        ...

    def abandon(self, req: Request) -> None:
        """A queued request gave up: release anything held for it."""
        ...

    def evictable_bytes(self) -> int:
        """GPU bytes that eviction could free now (idle KV)."""
        ...

    def metrics(self) -> dict[str, float | int]:
        """Run metrics of this manager beyond `stats` (prefix hit ratios, say)."""
        ...
