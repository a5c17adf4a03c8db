"""The CPU store: host memory that holds offloaded KV, with its own eviction.

Bytes are reserved when an offload starts (the copy's destination) and released when KV is reloaded
or dropped. When full, the store drops its oldest resident items first (`kv.cpu_store_evicts_lru`),
which items are candidates and in what order being the manager's choice (a session, or a prefix
tail). The store also estimates how long an item survives in it (the characteristic time of an
LRU/FIFO store, Che's approximation): the EMA of the lifetimes of the items it dropped. A block that
will be dropped before it is needed restores at recompute cost, not reload cost; `restore_us`
prices that.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from cachepilot_sim.components.kv.protocol import KvStats

RESIDENCY_EMA_WEIGHT = 0.1  # weight of one dropped item's lifetime in the residency estimate

# drop(item, order_key): True when the item was dropped; False when it must stay (it is coming back
# right now) and keeps its place; None when the entry is stale (the item left the store).
DropFn = Callable[[int, int], "bool | None"]


class CpuStore:
    """Capacity, used bytes, peak and drops of the CPU tier; oldest-first drop order."""

    __slots__ = ("capacity_bytes", "evicts_lru", "used_bytes", "stats", "residency_us", "_order")

    def __init__(self, capacity_bytes: int, evicts_lru: bool, stats: KvStats) -> None:
        self.capacity_bytes = capacity_bytes
        self.evicts_lru = evicts_lru
        self.used_bytes = 0
        self.stats = stats
        self.residency_us = math.inf  # no drop seen yet: an item stays until it is needed
        self._order: list[tuple[int, int, int]] = []  # (order key, tie-break, item), lazy

    def can_take(self, num_bytes: int) -> bool:
        """True when `num_bytes` fit now, or could after dropping older items."""
        if self.evicts_lru:
            return num_bytes <= self.capacity_bytes
        return self.used_bytes + num_bytes <= self.capacity_bytes

    def reserve(self, num_bytes: int) -> None:
        """An offload starts: its destination bytes are taken in the store."""
        self.used_bytes += num_bytes
        self.stats.cpu_peak_bytes = max(self.stats.cpu_peak_bytes, self.used_bytes)

    def release(self, num_bytes: int) -> None:
        """KV left the store (reloaded or dropped): its bytes are free."""
        self.used_bytes -= num_bytes
        assert self.used_bytes >= 0, "CPU store released more than it held"

    def push(self, order_key: int, tie: int, item: int) -> None:
        """`item` became droppable; smaller (order_key, tie) goes first."""
        heapq.heappush(self._order, (order_key, tie, item))

    def make_room(self, num_bytes: int, drop: DropFn) -> bool:
        """Drop the oldest items until `num_bytes` fit (if the store evicts); True when they do."""
        if self.used_bytes + num_bytes <= self.capacity_bytes:
            return True
        kept: list[tuple[int, int, int]] = []
        while self.used_bytes + num_bytes > self.capacity_bytes and self._order:
            key, tie, item = heapq.heappop(self._order)
            if drop(item, key) is False:
                kept.append((key, tie, item))
        for k in kept:
            heapq.heappush(self._order, k)
        return self.used_bytes + num_bytes <= self.capacity_bytes

    def record_drop(self, lifetime_us: int) -> None:
        """An item left the store after `lifetime_us` in it: one observation of the residency."""
        self.stats.cpu_drops += 1
        if math.isinf(self.residency_us):
            self.residency_us = float(lifetime_us)
        else:
            self.residency_us += RESIDENCY_EMA_WEIGHT * (lifetime_us - self.residency_us)

    def restore_us(
        self, reload_us: float, recompute_us: float, gap_us: float, horizon_us: float
    ) -> float:
        """Expected restore of KV offloaded now, given that it is needed within `horizon_us`
        (the policy's δ) after an exponential gap of mean `gap_us`: a reload if the store still
        holds it then (the gap is shorter than the residency), a recompute if it was dropped.
        Equals min(reload, recompute) while no drop was seen or the residency exceeds δ."""
        if self.residency_us >= horizon_us:
            return min(reload_us, recompute_us)
        gap = max(gap_us, 1.0)
        survive = math.expm1(-self.residency_us / gap) / math.expm1(-horizon_us / gap)
        return min(recompute_us, survive * reload_us + (1.0 - survive) * recompute_us)
