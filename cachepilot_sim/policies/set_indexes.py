"""Exact indexes for SET-scope rules whose snapshot is a running sum and a walk from the LRU end.

SLRU's `prepare` keeps the protected segment's most recent entries that fit in its share of the
idle bytes; ARC's REPLACE takes T1's least recent entries while T1 holds more than the target.
Both read the candidates only through byte totals (kept here as running sums, updated on add and
discard) and an order (a `SortedList` per segment), and both cut their segment at a point that a
walk from the least recent end finds: the decision walks only as far as its victims reach, and
`prepare`'s snapshot (computed over every candidate but the excluded one) is never built. The
session manager uses them through the policy's `set_index()` (`policies/candidates.py`).

Exactness of SLRU's cut: `prepare` walks the protected entries most recent first, ordered by
(−last use, id), subtracting sizes from room = fraction × idle bytes while each fits. With integer
sizes and room below 2^53 every subtraction is exact, so entry j is demoted exactly when the bytes
of the protected entries at or before it in that order exceed room: P − O_j > room, with P the
protected bytes and O_j those after j in that order, i.e. before j in (last use, −id) order.
Within one last-use time the two orders disagree on ids, so the walk goes a last-use group at a
time. ARC walks T1 in the key's own order, (last use, id), and subtracts as `prepare` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry


class SlruSegments(Protocol):
    """What `SlruIndex` reads and records of SLRU (`SlruPolicy`; no import of it)."""

    protected: set[int]
    protected_fraction: float
    kept: set[int]


class ArcSegments(Protocol):
    """What `ArcIndex` reads and records of ARC (`ArcPolicy`)."""

    frequent: set[int]
    target_bytes: float
    capacity_bytes: float
    t1_excess: set[int]


Item = tuple[int, int, int]  # (last use, id or -id, entry id): a lane's order
# Per lane of a chained decision: items before `cut` (None: all) rank with the first segment
# number, the others with the second (`SetTails`, `components/kv/set_tails.py`).
LaneCut = tuple[Item | None, int, int]


class _Lanes:
    """Idle entries in a few segments, each a `SortedList` of `Item`, with byte sums."""

    __slots__ = ("lanes", "where", "lane_bytes", "sizes", "num_visits")

    def __init__(self, num_lanes: int) -> None:
        self.lanes = [SortedList() for _ in range(num_lanes)]
        self.where: dict[int, tuple[int, Item, CacheEntry, int]] = {}  # id -> lane, item, bytes
        self.lane_bytes = [0] * num_lanes
        self.sizes: list[dict[int, int]] = [{} for _ in range(num_lanes)]  # bytes -> count
        self.num_visits = 0  # items looked at by decisions (a complexity probe for tests)

    def __len__(self) -> int:
        return len(self.where)

    def put(self, entry: CacheEntry, lane: int, item: Item) -> None:
        self.drop(entry.entry_id)
        self.lanes[lane].add(item)
        self.where[entry.entry_id] = (lane, item, entry, entry.num_bytes)
        self.lane_bytes[lane] += entry.num_bytes
        sizes = self.sizes[lane]
        sizes[entry.num_bytes] = sizes.get(entry.num_bytes, 0) + 1

    def drop(self, entry_id: int) -> None:
        where = self.where.pop(entry_id, None)
        if where is not None:
            lane, item, _, num_bytes = where
            self.lanes[lane].remove(item)
            self.lane_bytes[lane] -= num_bytes
            sizes = self.sizes[lane]
            sizes[num_bytes] -= 1
            if not sizes[num_bytes]:
                del sizes[num_bytes]

    def excluded(self, exclude_id: int) -> tuple[int, int]:
        """(lane, bytes) of the excluded candidate; (-1, 0) when it is not one."""
        where = self.where.get(exclude_id)
        return (-1, 0) if where is None else (where[0], where[3])

    def walk(self, lane: int, exclude_id: int) -> Iterator[CacheEntry]:
        """The lane's entries but `exclude_id`, in its order; each counts one visit."""
        where = self.where
        for item in self.lanes[lane]:
            self.num_visits += 1
            if item[2] != exclude_id:
                yield where[item[2]][2]

    def cut(self, lane: int, done: Callable[[int], bool]) -> Item | None:
        """The first item of `lane` at which `done(bytes of the items before it)` holds (None:
        nowhere); `done` must stay true once true. A binary search when the lane's entries are
        all one size (prefix blocks), else a walk from the front."""
        order, sizes = self.lanes[lane], self.sizes[lane]
        if len(sizes) <= 1:
            size = next(iter(sizes), 0)
            lo, hi = 0, len(order)
            while lo < hi:
                mid = (lo + hi) // 2
                self.num_visits += 1
                lo, hi = (lo, mid) if done(size * mid) else (mid + 1, hi)
            return order[lo] if lo < len(order) else None
        older = 0
        for item in order:
            self.num_visits += 1
            if done(older):
                return item  # type: ignore[no-any-return]
            older += self.where[item[2]][3]
        return None


def _greedy(
    streams: list[Iterator[CacheEntry]], bytes_needed: int
) -> tuple[list[CacheEntry], list[int]]:
    """Entries from `streams` in turn (each exhausted before the next) until the bytes are
    covered: greedy by a key whose first field is the stream's position. Returns the victims
    and, per victim, the stream it came from; no stream is read past the last victim."""
    victims: list[CacheEntry] = []
    origin: list[int] = []
    freed = 0
    for k, stream in enumerate(streams):
        if freed >= bytes_needed:
            break
        for entry in stream:
            victims.append(entry)
            origin.append(k)
            freed += entry.num_bytes
            if freed >= bytes_needed:
                break
    return victims, origin


def _merge(a: Iterator[CacheEntry], b: Iterator[CacheEntry]) -> Iterator[CacheEntry]:
    """Two streams each ordered by (last use, id), merged in that order (lazily)."""
    x, y = next(a, None), next(b, None)
    while x is not None or y is not None:
        if y is None or (
            x is not None and (x.last_used_us, x.entry_id) < (y.last_used_us, y.entry_id)
        ):
            assert x is not None
            yield x
            x = next(a, None)
        else:
            yield y
            y = next(b, None)


class _LaneIndex:
    """What SLRU's and ARC's indexes share: two lanes of idle entries with their bytes summed."""

    __slots__ = ("policy", "_lanes")

    def __init__(self, policy: object) -> None:
        self.policy = policy
        self._lanes = _Lanes(2)

    def __len__(self) -> int:
        return len(self._lanes)

    @property
    def num_visits(self) -> int:
        """Items looked at by decisions so far."""
        return self._lanes.num_visits

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        self._lanes.drop(entry_id)

    def lane_item(self, entry_id: int) -> tuple[int, Item] | None:
        """The candidate's lane and item; None when it is not a candidate."""
        where = self._lanes.where.get(entry_id)
        return None if where is None else (where[0], where[1])


class SlruIndex(_LaneIndex):
    """SLRU's idle entries: unprotected ones (lane 0) by (last use, id), protected ones (lane 1)
    by (last use, −id) with their bytes summed (see the module docstring)."""

    __slots__ = ()
    policy: SlruSegments

    def add(self, entry: CacheEntry) -> None:
        """Index an idle entry (again: a hook may have protected it)."""
        eid = entry.entry_id
        if eid in self.policy.protected:
            self._lanes.put(entry, 1, (entry.last_used_us, -eid, eid))
        else:
            self._lanes.put(entry, 0, (entry.last_used_us, eid, eid))

    def select(self, bytes_needed: int, now_us: int, exclude_id: int) -> list[CacheEntry]:
        """What `prepare` then greedy by key would evict among the candidates but `exclude_id`:
        probation (unprotected and demoted) least recent first, then the protected rest. The
        policy's `kept` records the victims taken from the protected rest."""
        lanes = self._lanes
        lane, ex_bytes = lanes.excluded(exclude_id)
        total = sum(lanes.lane_bytes) - ex_bytes
        if bytes_needed <= 0 or len(lanes) - (lane >= 0) == 0:
            return []
        protected = lanes.lane_bytes[1] - (ex_bytes if lane == 1 else 0)
        room = self.policy.protected_fraction * total
        kept: list[CacheEntry] = []
        groups = self._groups(exclude_id)

        def demoted_stream() -> Iterator[CacheEntry]:
            older = 0  # protected bytes before this group in (last use, -id) order
            for group in groups:  # ordered by -id within the group
                first_kept = len(group)
                for k, e in enumerate(group):
                    if protected - older <= room:
                        first_kept = k
                        break
                    older += e.num_bytes
                kept.extend(sorted(group[first_kept:], key=lambda e: e.entry_id))
                yield from sorted(group[:first_kept], key=lambda e: e.entry_id)
                if first_kept < len(group):
                    return

        def kept_stream() -> Iterator[CacheEntry]:
            yield from kept
            for group in groups:
                yield from reversed(group)

        victims, origin = _greedy(
            [_merge(lanes.walk(0, exclude_id), demoted_stream()), kept_stream()], bytes_needed
        )
        self.policy.kept = {e.entry_id for e, k in zip(victims, origin, strict=True) if k == 1}
        return victims

    # -- chains (the prefix manager): no excluded entry, every candidate one size ----------------
    descending = (False, True)  # per lane: ids descend within a last use (the protected lane)

    def chain_cuts(self) -> list[LaneCut]:
        """`prepare` over every candidate: unprotected ones rank 0; protected ones rank 0 (demoted)
        before the first that fits in room, 1 from it on."""
        lanes = self._lanes
        protected = lanes.lane_bytes[1]
        room = self.policy.protected_fraction * sum(lanes.lane_bytes)
        return [(None, 0, 0), (lanes.cut(1, lambda older: protected - older <= room), 0, 1)]

    def record(self, victims: list[tuple[CacheEntry, int]]) -> None:
        """The chained decision's victims and their segments: the keys read after it."""
        self.policy.kept = {e.entry_id for e, seg in victims if seg == 1}

    def _groups(self, exclude_id: int) -> Iterator[list[CacheEntry]]:
        """The protected entries but `exclude_id`, one list per last-use time, oldest first."""
        group: list[CacheEntry] = []
        for e in self._lanes.walk(1, exclude_id):
            if group and group[0].last_used_us != e.last_used_us:
                yield group
                group = []
            group.append(e)
        if group:
            yield group


class ArcIndex(_LaneIndex):
    """ARC's idle entries: T1 (lane 0) and T2 (lane 1, frequent) by (last use, id), with their
    bytes summed."""

    __slots__ = ()
    policy: ArcSegments

    def add(self, entry: CacheEntry) -> None:
        """Index an idle entry (again: a hook may have moved it to T2)."""
        eid = entry.entry_id
        lane = 1 if eid in self.policy.frequent else 0
        self._lanes.put(entry, lane, (entry.last_used_us, eid, eid))

    def select(self, bytes_needed: int, now_us: int, exclude_id: int) -> list[CacheEntry]:
        """What `prepare` then greedy by key would evict among the candidates but `exclude_id`:
        T1's least recent entries while T1 holds more than the target, then T2, then the rest
        of T1. Updates ARC's c (the most idle bytes seen at a decision) as `prepare` does; the
        policy's `t1_excess` records the victims taken from T1's excess."""
        lanes, policy = self._lanes, self.policy
        lane, ex_bytes = lanes.excluded(exclude_id)
        if bytes_needed <= 0 or len(lanes) - (lane >= 0) == 0:
            return []
        total = sum(lanes.lane_bytes) - ex_bytes
        policy.capacity_bytes = max(policy.capacity_bytes, float(total))
        t1_bytes = float(lanes.lane_bytes[0] - (ex_bytes if lane == 0 else 0))
        t1 = lanes.walk(0, exclude_id)
        rest: list[CacheEntry] = []  # the first T1 entry past the excess, when reached

        def excess_stream() -> Iterator[CacheEntry]:
            nonlocal t1_bytes
            for e in t1:
                if t1_bytes <= policy.target_bytes:
                    rest.append(e)
                    return
                t1_bytes -= e.num_bytes
                yield e

        def rest_stream() -> Iterator[CacheEntry]:
            yield from rest
            yield from t1

        streams = [excess_stream(), lanes.walk(1, exclude_id), rest_stream()]
        victims, origin = _greedy(streams, bytes_needed)
        policy.t1_excess = {e.entry_id for e, k in zip(victims, origin, strict=True) if k == 0}
        return victims

    # -- chains (the prefix manager): no excluded entry, every candidate one size ----------------
    descending = (False, False)

    def chain_cuts(self) -> list[LaneCut]:
        """`prepare` over every candidate (ARC's c grows to their bytes): T1 ranks 0 before the
        first item at which T1's remaining bytes are within the target, 2 from it on; T2 1."""
        lanes, policy = self._lanes, self.policy
        policy.capacity_bytes = max(policy.capacity_bytes, float(sum(lanes.lane_bytes)))
        t1_bytes, target = lanes.lane_bytes[0], policy.target_bytes
        return [(lanes.cut(0, lambda older: t1_bytes - older <= target), 0, 2), (None, 1, 1)]

    def record(self, victims: list[tuple[CacheEntry, int]]) -> None:
        """The chained decision's victims and their segments: the keys read after it."""
        self.policy.t1_excess = {e.entry_id for e, seg in victims if seg == 0}
