"""The shared index of a key that moves with time: lanes of a time-independent order.

A DECISION-scope policy whose key reads the decision's time or restore estimate (GDSF's
inflation, Wild's decaying reuse probability, clairvoyant PERC's time to the next arrival, T-LRU's
restore threshold) keeps its idle entries here instead of in an index of its own. It declares how
its key moves, per entry: `lane(entry, restore_us, now_us)` puts the entry in a lane under an
order that does not read the time, such that within a lane the exact key at every time from
`now_us` on is non-decreasing in that order, and says until when that holds (`until_us`: at a
query at or after it the entry is placed again: clairvoyant PERC's arrival coming within δ, then
passing). `key_at(entry, restore_us, now_us)` is the policy's key with the restore estimate it
was indexed with (`key` reads `entry.restore_us`, which a KV manager fills in only for victims).
A query keys each lane's front and returns the smallest: O(lanes x log n) per pop, never O(n).

How a lane's front is found (`Walk`): STATIC, the order is the key (GDSF's H while the base is
fixed); EXACT, the front's key is the lane's smallest (the key is a function of the order); TIES,
the float key is non-decreasing in the order but neighbouring orders may give equal first
fields (GDSF's inflation + v rounding equal for close v), so entries are keyed past the front
while their first field equals the best, one run of equal order (all but the id) at a time;
ROUNDED, only the exact key is monotone (Wild's exponentials), so entries are keyed past the
front while their first field is within a relative `SLACK` of the front's, far above a key's
rounding error (about 1e-15): an entry beyond it loses under exact float comparison too. ROUNDED
keys have a non-negative first field and the lane's order as their other fields, so a front whose
first field is 0 is the lane's smallest.

Per-policy indexes remain where a key has no such order (`docs/architecture.md` says which and
why): PERC's dormant key reads two fields (idle time and weight: `perc_index.py`), survival
curves (`forecast_index.py`, `hazard_index.py`), LRB's predicted residual (`lrb_index.py`).
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry

Key = tuple[float | int, ...]
NEVER = 1 << 62  # an `until_us` that no query reaches
SLACK = 1e-9  # far above the relative rounding error of a key (about 1e-15)


class Walk:
    """How far past a lane's front a query keys entries (see the module docstring). Plain ints,
    not an IntEnum: reading an enum member costs 150 ns in Python 3.11, on every add."""

    STATIC = 0  # the order is the key: nothing to compute
    EXACT = 1
    TIES = 2
    ROUNDED = 3


# Where an idle entry sits: (lane, order, walk, until_us); `order` is time-independent and ends
# with the entry id. A plain tuple: one is built per entry that goes idle, and a NamedTuple with
# defaults costs 7x as much to build.
Lane = tuple[int, Key, int, int]
_STATIC, _EXACT, _TIES = Walk.STATIC, Walk.EXACT, Walk.TIES


def in_lane(lane: int, order: Key, walk: int = Walk.EXACT, until_us: int = NEVER) -> Lane:
    """A `lane()` answer: in `lane` under `order` (a `Walk`) until `until_us` (exclusive)."""
    return (lane, order, walk, until_us)


class LanedKey(Protocol):
    """A policy whose key moves with time in lanes of a fixed order (its declaration)."""

    def lane(self, entry: CacheEntry, restore_us: float, now_us: int) -> Lane:
        """The entry's lane from `now_us` until the lane's `until_us` (exclusive)."""
        ...

    def key_at(self, entry: CacheEntry, restore_us: float, now_us: int) -> Key:
        """The policy's key of `entry` at `now_us` with the restore estimate `restore_us`."""
        ...


_BEFORE_ANY = -(1 << 62)  # the placement time of an entry added before any query


class LaneIndex:
    """Idle entries of a `LanedKey` policy; `pop_min(now)` is the id its sort puts first.

    A `TimeIndex` (`policies/candidates.py`): the KV managers keep one per restore regime.
    `now` must not decrease from one query to the next (a lane's `until_us` is passed once); an
    entry added between queries is placed at the last query's time.
    """

    __slots__ = ("policy", "_lanes", "_walks", "_lane_ids", "_where", "_moves", "_placed", "_now")

    def __init__(self, policy: LanedKey) -> None:
        self.policy = policy
        self._lanes: dict[int, SortedList] = {}  # lane -> its entries' orders
        self._walks: dict[int, int] = {}  # lane -> how its front is found (a `Walk`)
        self._lane_ids: list[int] = []  # the non-empty lanes, ascending (queries visit them so)
        # id -> (lane, order, entry, restore, placement number)
        self._where: dict[int, tuple[int, Key, CacheEntry, float, int]] = {}
        self._moves: list[tuple[int, int, int]] = []  # (until_us, placement number, id): a heap
        self._placed = 0
        self._now = _BEFORE_ANY  # the last query's time

    def __len__(self) -> int:
        return len(self._where)

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None:
        """Index an idle entry whose restore estimate stays `restore_us` while it is idle (the
        lanes read no gap EMA)."""
        if entry.entry_id in self._where:
            self.discard(entry.entry_id)
        self._place(entry, restore_us, self._now)

    def _place(self, entry: CacheEntry, restore_us: float, now_us: int) -> None:
        lane_id, order, walk, until_us = self.policy.lane(entry, restore_us, now_us)
        items = self._lanes.get(lane_id)
        if items is None:
            items = self._lanes[lane_id] = SortedList()
            self._walks[lane_id] = walk
            bisect.insort(self._lane_ids, lane_id)
        items.add(order)
        placed = self._placed
        self._placed += 1
        self._where[entry.entry_id] = (lane_id, order, entry, restore_us, placed)
        if until_us < NEVER:
            moves = self._moves
            heapq.heappush(moves, (until_us, placed, entry.entry_id))
            if len(moves) > 2 * len(self._where) + 64:  # drop stale moves (bounds memory)
                where = self._where
                moves[:] = [m for m in moves if m[2] in where and where[m[2]][4] == m[1]]
                heapq.heapify(moves)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent; a pending move goes stale)."""
        where = self._where.pop(entry_id, None)
        if where is not None:
            lane_id = where[0]
            items = self._lanes[lane_id]
            items.remove(where[1])
            if not items:
                del self._lanes[lane_id], self._walks[lane_id]
                self._lane_ids.remove(lane_id)

    def rank(self, entry: CacheEntry, restore_us: float) -> Key:
        """The entry's place in `pop_min`'s order were it indexed with `restore_us`, at the last
        query's time: its key (T-LRU's suffix tails rank a parent their cuts expose so)."""
        return self.policy.key_at(entry, restore_us, self._now)

    def _move(self, now_us: int) -> None:
        """Place again, at `now_us`, every entry whose lane held until `now_us` or before."""
        moves, where = self._moves, self._where
        while moves and moves[0][0] <= now_us:
            _, placed, eid = heapq.heappop(moves)
            got = where.get(eid)
            if got is None or got[4] != placed:
                continue  # stale: discarded, or placed again since
            self.discard(eid)
            self._place(got[2], got[3], now_us)

    def pop_min(self, now_us: int) -> int | None:
        """The id the policy's sort would put first at `now_us`, removed from the index."""
        self._now = now_us
        if self._moves and self._moves[0][0] <= now_us:
            self._move(now_us)
        best: Key | None = None
        lanes, walks = self._lanes, self._walks
        for lane in self._lane_ids:
            walk = walks[lane]
            if walk == _STATIC:
                cand: Key | None = lanes[lane][0]
            else:
                cand = self._lane_min(lanes[lane], walk, now_us, best)
            if cand is not None and (best is None or cand < best):
                best = cand
        if best is None:
            return None
        eid = int(best[-1])
        self.discard(eid)
        return eid

    def _lane_min(self, items: SortedList, walk: int, now_us: int, bound: Key | None) -> Key | None:
        """The smallest key of a lane (keys end with the entry id, as orders do); None when a
        TIES lane cannot beat `bound` (the other lanes' best so far)."""
        where, key_at = self._where, self.policy.key_at
        front: Key = items[0]
        got = where[int(front[-1])]
        best = key_at(got[2], got[3], now_us)
        if walk == _EXACT:
            return best
        if walk == _TIES:
            if bound is not None and best[0] > bound[0]:
                return None  # every key of the lane is at least its front's
            if bound is not None and bound < best:
                best = bound
            i = items.bisect_right(front[:-1] + (math.inf,))
            while i < len(items):
                order = items[i]
                got = where[int(order[-1])]
                cand = key_at(got[2], got[3], now_us)
                if cand[0] > best[0]:
                    break
                best = min(best, cand)
                i = items.bisect_right(order[:-1] + (math.inf,))  # same order: larger ids
        elif best[0] > 0.0:  # ROUNDED
            limit = float(best[0]) * (1.0 + SLACK)
            for k in range(1, len(items)):
                got = where[int(items[k][-1])]
                cand = key_at(got[2], got[3], now_us)
                if cand[0] > limit:
                    break  # later entries' exact keys are at least this one's
                best = min(best, cand)
        return best


class LanedPolicy:
    """Mixin: a policy that declares `lane` and `key_at` gets the shared index as its
    `time_index()` (the KV managers ask every DECISION policy for one)."""

    def time_index(self: LanedKey) -> LaneIndex:
        """The shared index of this policy's lanes."""
        return LaneIndex(self)
