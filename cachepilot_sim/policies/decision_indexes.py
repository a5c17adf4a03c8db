"""Exact indexes for the other DECISION-scope keys: GDSF, Wild and clairvoyant PERC.

Each keeps a policy's idle entries so that `pop_min(now)` returns the entry its sort would put
first at `now`, without keying every entry (the KV managers use them through the policy's
`time_index()`, as PERC's `policies/perc_index.py`; `policies/candidates.py` says when). Keys are
computed exactly as the policy computes them; where float rounding could reorder two keys that
are equal in exact arithmetic, the candidates within a relative `_SLACK` are keyed too.

* GDSF: H = base + uses × restore / bytes, base the inflation when the entry was released: fixed
  while idle for a given restore estimate, a `SortedList` by (H, id). An entry indexed without a
  base (KV reloaded and idle before its turn ends) reads the current inflation, a query argument:
  those are kept by (uses × restore / bytes, id), where inflation + v is monotone in v.
* Wild: the reuse probability decays with idle time at a rate and fraction shared by the entry's
  workload class, so within a class the longest idle entry (smallest last use, then id) ranks
  first whatever the class's statistics; a query compares the classes' fronts by the full key.
* perc_clairvoyant: an entry whose true next arrival falls within δ of now has key
  (restore / bytes, −time to arrival, id), one beyond it (0, −time to arrival, id): the latter
  are kept by (−arrival, id), moved to the former (kept by (restore / bytes, −arrival, id)) once,
  when `now` comes within δ of the arrival.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import islice
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry
from cachepilot_sim.policies.reuse import GapEstimator


class GdsfKey(Protocol):
    """What `GdsfIndex` reads of GDSF (`GdsfPolicy`)."""

    inflation: float
    base: dict[int, float]


class KeyedPolicy(Protocol):
    """A policy's key (`WildIndex` keys with Wild's own)."""

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]: ...


class EstimatedPolicy(Protocol):
    """A policy with a gap estimator (`ClairvoyantIndex` reads its δ)."""

    estimator: GapEstimator


_SLACK = 1e-9  # far above the relative rounding error of a key (about 1e-15)
Key = tuple[float | int, ...]


class GdsfIndex:
    """GDSF's idle entries by H (see the module docstring)."""

    __slots__ = ("policy", "_based", "_unbased", "_where")

    def __init__(self, policy: GdsfKey) -> None:
        self.policy = policy
        self._based: SortedList = SortedList()  # (H, id)
        self._unbased: SortedList = SortedList()  # (uses x restore / bytes, id)
        self._where: dict[int, tuple[bool, float]] = {}  # id -> (has a base, its sort value)

    def __len__(self) -> int:
        return len(self._where)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry whose restore estimate stays `restore_us` while it is idle."""
        self.discard(entry.entry_id)
        value = entry.num_uses * restore_us / max(entry.num_bytes, 1)
        base = self.policy.base.get(entry.entry_id)
        if base is None:
            self._unbased.add((value, entry.entry_id))
            self._where[entry.entry_id] = (False, value)
        else:
            self._based.add((base + value, entry.entry_id))
            self._where[entry.entry_id] = (True, base + value)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        where = self._where.pop(entry_id, None)
        if where is not None:
            (self._based if where[0] else self._unbased).remove((where[1], entry_id))

    def pop_min(self, now_us: int) -> int | None:
        """The id GDSF's sort would put first, removed from the index."""
        best: tuple[float, int] | None = self._based[0] if self._based else None
        inflation = self.policy.inflation
        i, unbased = 0, self._unbased
        while i < len(unbased):  # inflation + v may round equal for neighbouring v: ids decide
            value, entry_id = unbased[i]
            cand = (inflation + value, entry_id)
            if best is not None and cand[0] > best[0]:
                break
            if best is None or cand < best:
                best = cand
            i = unbased.bisect_right((value, math.inf))  # same v: larger ids
        if best is None:
            return None
        self.discard(best[1])
        return best[1]


class WildIndex:
    """Wild's idle entries per workload class, longest idle first (see the module docstring)."""

    __slots__ = ("policy", "_classes", "_where")

    def __init__(self, policy: KeyedPolicy) -> None:
        self.policy = policy
        self._classes: dict[int, SortedList] = {}  # class -> (last_used_us, id, entry)
        self._where: dict[int, tuple[int, int]] = {}  # id -> (class, last_used_us)

    def __len__(self) -> int:
        return len(self._where)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry (Wild reads neither the restore estimate nor the gap EMA)."""
        self.discard(entry.entry_id)
        order = self._classes.setdefault(entry.class_index, SortedList())
        order.add((entry.last_used_us, entry.entry_id, entry))
        self._where[entry.entry_id] = (entry.class_index, entry.last_used_us)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        where = self._where.pop(entry_id, None)
        if where is not None:
            order = self._classes[where[0]]
            order.remove(order[order.bisect_left((where[1], entry_id))])

    def _class_min(self, order: SortedList, now_us: int) -> tuple[Key, int] | None:
        """The class's smallest key: its front, unless rounding lets a near-equal later entry
        (whose exact probability is no smaller) come out below it."""
        key = self.policy.key
        front: Iterator[tuple[int, int, CacheEntry]] = iter(order)
        first = next(front, None)
        if first is None:
            return None
        best = key(first[2], now_us)
        limit = float(best[0]) * (1.0 + _SLACK)
        if best[0] > 0.0:
            for _, _, entry in islice(front, None):
                k = key(entry, now_us)
                if k[0] > limit:
                    break  # later entries are at least this likely to return: larger keys
                best = min(best, k)
        return best, int(best[-1])

    def pop_min(self, now_us: int) -> int | None:
        """The id Wild's sort would put first, removed from the index."""
        best: tuple[Key, int] | None = None
        for class_index in sorted(self._classes):
            cand = self._class_min(self._classes[class_index], now_us)
            if cand is not None and (best is None or cand[0] < best[0]):
                best = cand
        if best is None:
            return None
        self.discard(best[1])
        return best[1]


class ClairvoyantIndex:
    """perc_clairvoyant's idle entries by true next arrival (see the module docstring)."""

    __slots__ = ("policy", "_unknown", "_far", "_near", "_where", "_entries")

    def __init__(self, policy: EstimatedPolicy) -> None:
        self.policy = policy
        self._unknown: SortedList = SortedList()  # ids of entries with no known next arrival
        self._far: SortedList = SortedList()  # (-arrival, id): arrival beyond now + delta
        self._near: SortedList = SortedList()  # (restore / bytes, -arrival, id)
        self._where: dict[int, tuple[int, tuple[float | int, ...]]] = {}  # id -> (list, item)
        self._entries: dict[int, tuple[CacheEntry, float]] = {}  # id -> (entry, weight)

    def __len__(self) -> int:
        return len(self._where)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry whose restore estimate stays `restore_us` while it is idle."""
        eid = entry.entry_id
        self.discard(eid)
        weight = 1.0 * restore_us / max(entry.num_bytes, 1)  # as the key computes it (p = 1)
        self._entries[eid] = (entry, weight)
        if entry.next_arrival_us < 0:
            self._put(0, (eid,), eid)
        else:
            self._put(1, (-entry.next_arrival_us, eid), eid)  # moved to near when due

    def _put(self, which: int, item: tuple[float | int, ...], eid: int) -> None:
        (self._unknown, self._far, self._near)[which].add(item[0] if which == 0 else item)
        self._where[eid] = (which, item)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        where = self._where.pop(entry_id, None)
        if where is None:
            return
        which, item = where
        (self._unknown, self._far, self._near)[which].remove(item[0] if which == 0 else item)
        self._entries.pop(entry_id, None)

    def pop_min(self, now_us: int) -> int | None:
        """The id perc_clairvoyant's sort would put first, removed from the index."""
        horizon = now_us + math.floor(self.policy.estimator.delta_us)  # until <= delta
        far = self._far
        while far and -far[-1][0] <= horizon:  # the earliest arrivals come within delta
            _, eid = far.pop()
            entry, weight = self._entries[eid]
            item = (weight, -entry.next_arrival_us, eid)
            self._near.add(item)
            self._where[eid] = (2, item)
        # Keys as the policy computes them, with this decision's restore (the entry's own
        # restore_us is filled in only for victims): p = 0 gives 0 whatever the restore.
        cands: list[tuple[Key, int]] = []
        if self._unknown:
            eid = self._unknown[0]
            cands.append(((0.0, -math.inf, eid), eid))
        if far:
            neg_arrival, eid = far[0]
            cands.append(((0.0, -float(-neg_arrival - now_us), eid), eid))
        if self._near:
            cands.append(self._near_min(now_us))
        if not cands:
            return None
        best = min(cands)[1]
        self.discard(best)
        return best

    def _near_min(self, now_us: int) -> tuple[Key, int]:
        """Smallest weight first; within it the latest arrival, unless all are overdue (then
        their keys tie at 0 and the smallest id wins)."""
        weight, neg_arrival, eid = self._near[0]
        if -neg_arrival > now_us:
            return (weight, -float(-neg_arrival - now_us), eid), eid
        group = self._near.irange((weight,), (weight, math.inf))
        return min(((weight, -0.0, e), e) for _, _, e in group)
