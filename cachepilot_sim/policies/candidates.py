"""Idle cache entries kept for eviction decisions: ordered by the policy's key, lazily invalidated.

A KV manager adds an entry when it becomes idle, refreshes it after a hook that may change its key
and discards it when it is used or evicted. For a policy whose key reads only the entry
(`KeyScope.ENTRY`) a decision takes the smallest items: O(log n) per victim, amortized over the
stale items it skips. A `KeyScope.DECISION` policy that offers an exact index of its decaying key
(`time_index`: PERC, `policies/perc_index.py`; perc_plus1's index answers the whole decision,
`policies/plus1_index.py`) gets one per restore regime the manager names: when
the manager says every candidate's restore estimate is fixed while it is idle (`restore_mode` True
or False: `static_restore` gives it), a decision pops from that index; when the estimate moves with
time (a CPU store whose residency is below δ), the decision keys every candidate (`num_full`).
A `KeyScope.SET` policy whose rule relative to the candidates has an exact incremental form
(`set_index()`: SLRU's and ARC's segment sums, `policies/set_indexes.py`) gets that index, which
answers the decision (`prepare` over the candidates but the excluded one, then greedy by key)
walking only as far as its victims. A policy may rank whole entries by a narrower scope than
chains of prefix blocks (`key_scope_on_entries`: T-LRU is DECISION here, SET on chains). Any other
policy gets every candidate, as `select_victims` always did.

The order is a `FrontOrder` (`policies/front_order.py`) rather than a binary heap: keys that
arrive in increasing order (LRU's: an entry goes idle now, after every other) are appended to a
deque and popped from its front in O(1), the others kept in a `SortedList`; the smallest item is
the smaller front. A heap's root-to-leaf paths through n scattered items made a decision 5x
slower at 10^6 items than at 10^3, a `SortedList`'s bisection over tuples spread in memory 3x
(`experiments/bench_eviction.md`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from cachepilot_sim.policies.base import CacheEntry, EvictionPolicy, KeyScope
from cachepilot_sim.policies.front_order import FrontOrder

# Rebuild the order when stale items outnumber live ones by this factor (bounds memory; amortized).
_COMPACT_FACTOR = 2

# The manager's restore estimate of an idle entry in a regime where it does not change while the
# entry is idle: (entry, offload) -> µs; offload False: every victim is dropped (recompute).
StaticRestore = Callable[[CacheEntry, bool], float]


class TimeIndex(Protocol):
    """An exact index of a time-dependent key (a policy's `time_index()`)."""

    def __len__(self) -> int: ...

    def add(self, entry: CacheEntry, restore_us: float, gap_ema_us: float) -> None: ...

    def discard(self, entry_id: int) -> None: ...

    def pop_min(self, now_us: int) -> int | None: ...


class SetIndex(Protocol):
    """An exact index of a SET policy's decision over whole entries (a policy's `set_index()`):
    it keeps the candidates and answers what `select_victims` over all of them would."""

    @property
    def num_visits(self) -> int: ...

    def __len__(self) -> int: ...

    def add(self, entry: CacheEntry) -> None: ...

    def discard(self, entry_id: int) -> None: ...

    def select(self, bytes_needed: int, now_us: int, exclude_id: int) -> list[CacheEntry]: ...


class CandidateIndex:
    """Idle entries of one manager in the order its policy evicts them.

    Items are `(key, stamp, entry)`: keys end with the unique entry id and stamps are unique,
    so no comparison reaches the entry. An item is live while its stamp is the entry's current one;
    `refresh` and `discard` make the older items stale, and a decision skips them.
    """

    __slots__ = (
        "policy",
        "entries",
        "indexed",
        "num_visits",
        "num_full",
        "static_restore",
        "reads_restore",
        "_timed",
        "_set",
        "_order",
        "_stamp",
        "_next_stamp",
        "_recheck",
    )

    def __init__(self, policy: EvictionPolicy, static_restore: StaticRestore | None = None) -> None:
        self.policy = policy
        self.entries: dict[int, CacheEntry] = {}  # entry id -> entry, in the order they went idle
        scope = getattr(policy, "key_scope_on_entries", getattr(policy, "key_scope", KeyScope.SET))
        self.indexed = scope == KeyScope.ENTRY
        self.num_visits = 0  # items looked at by decisions (a complexity probe for tests)
        self.num_full = 0  # DECISION decisions that keyed every candidate (restore moves with time)
        timed = scope == KeyScope.DECISION and static_restore is not None
        self.static_restore = static_restore if timed and hasattr(policy, "time_index") else None
        self._timed: dict[bool, TimeIndex] = {}  # restore regime (offload?) -> index, made on use
        # A key that reads no restore estimate: one index (regime False) serves every decision.
        self.reads_restore = getattr(policy, "time_index_reads_restore", True)
        make_set = getattr(policy, "set_index", None) if scope == KeyScope.SET else None
        self._set: SetIndex | None = make_set() if make_set is not None else None
        self._order = FrontOrder()  # of (key, stamp, entry): recency keys arrive in order
        self._stamp: dict[int, int] = {}
        self._next_stamp = 0
        # The last decision's excluded entry stayed idle and was skipped, not keyed: the victims'
        # hooks may have moved its key (SIEVE's hand passing it), so the next decision re-keys it.
        self._recheck = -1

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self.entries

    def __iter__(self) -> Iterator[CacheEntry]:
        return iter(self.entries.values())

    def add(self, entry: CacheEntry, now_us: int) -> None:
        """`entry` became idle (or its key may have changed while idle): (re)index it."""
        self.entries[entry.entry_id] = entry
        if self.indexed:
            self._push(entry, now_us)
        elif self._set is not None:
            self._set.add(entry)
        elif self._timed:
            assert self.static_restore is not None
            for offload, index in self._timed.items():
                index.add(entry, self.static_restore(entry, offload), entry.gap_ema_us)

    def refresh(self, entry: CacheEntry, now_us: int) -> None:
        """A hook may have changed an idle entry's key: index it again (no-op when not idle)."""
        if entry.entry_id in self.entries and (
            self.indexed or self._timed or self._set is not None
        ):
            self.add(entry, now_us)

    def discard(self, entry_id: int) -> None:
        """The entry is in use or evicted: no longer a candidate."""
        self.entries.pop(entry_id, None)
        self._stamp.pop(entry_id, None)
        if self._set is not None:
            self._set.discard(entry_id)
        for index in self._timed.values():
            index.discard(entry_id)

    def _timed_index(self, offload: bool) -> TimeIndex:
        """The index for a restore regime; built from every idle entry on first use."""
        index = self._timed.get(offload)
        if index is None:
            assert self.static_restore is not None
            index = self.policy.time_index()  # type: ignore[attr-defined]
            for entry in self.entries.values():
                index.add(entry, self.static_restore(entry, offload), entry.gap_ema_us)
            self._timed[offload] = index
        return index

    def _select_timed(
        self,
        offload: bool,
        bytes_needed: int,
        now_us: int,
        prepare: Callable[[CacheEntry], CacheEntry],
        exclude_id: int,
    ) -> list[CacheEntry]:
        """Smallest keys first from an exact time index; victims leave it, `exclude_id` stays."""
        index, restore = self._timed_index(offload), self.static_restore
        assert restore is not None
        victims: list[CacheEntry] = []
        freed = 0
        excluded = False
        # An index may answer the whole decision: `decide(bytes, now, exclude_id)` -> victim ids
        # in order, which leave it (perc_plus1's +1 step, `policies/plus1_index.py`).
        decide = getattr(index, "decide", None)
        if decide is not None:
            victims = [self.entries[i] for i in decide(bytes_needed, now_us, exclude_id)]
            self.num_visits += len(victims)
        while decide is None and freed < bytes_needed:
            entry_id = index.pop_min(now_us)
            if entry_id is None:
                break
            self.num_visits += 1
            if entry_id == exclude_id:
                excluded = True
                continue
            victims.append(self.entries[entry_id])
            freed += self.entries[entry_id].num_bytes
        if excluded:
            entry = self.entries[exclude_id]
            index.add(entry, restore(entry, offload), entry.gap_ema_us)
        out = [prepare(e) for e in victims]
        for e in out:  # the index's restore is the manager's estimate now, or it is not exact
            assert not self.reads_restore or e.restore_us == restore(e, offload), e.entry_id
        return out

    def _push(self, entry: CacheEntry, now_us: int) -> None:
        stamp = self._next_stamp
        self._next_stamp += 1
        self._stamp[entry.entry_id] = stamp
        self._order.add((self.policy.key(entry, now_us), stamp, entry))
        if len(self._order) > _COMPACT_FACTOR * len(self.entries) + 64:
            stamps = self._stamp
            self._order = FrontOrder(
                item for item in self._order if stamps.get(item[2].entry_id) == item[1]
            )

    def select(
        self,
        bytes_needed: int,
        now_us: int,
        prepare: Callable[[CacheEntry], CacheEntry],
        exclude_id: int = -1,
        restore_mode: bool | None = None,
    ) -> list[CacheEntry]:
        """The policy's victims among the candidates but `exclude_id`, each passed through
        `prepare` (the manager's restore estimate) before the policy sees it.

        Indexed: the smallest keys until `bytes_needed` are covered (greedy by key, as
        `RankingPolicy.select_victims`); victims leave the order, the caller discards them.
        `restore_mode` (True: offload regime, False: drop regime, None: the estimate moves with
        time) says whether `prepare` gives `static_restore` for this decision.
        """
        if self.static_restore is not None and bytes_needed > 0 and self.entries:
            if not self.reads_restore:
                restore_mode = False
            if restore_mode is None:
                self.num_full += 1
            else:
                return self._select_timed(restore_mode, bytes_needed, now_us, prepare, exclude_id)
        if self._set is not None:  # victims' estimates are read before any is evicted, as below
            return [prepare(e) for e in self._set.select(bytes_needed, now_us, exclude_id)]
        if not self.indexed:
            candidates = [prepare(e) for e in self.entries.values() if e.entry_id != exclude_id]
            if not candidates:
                return []
            return self.policy.select_victims(candidates, bytes_needed, now_us)
        victims: list[CacheEntry] = []
        if bytes_needed <= 0:
            return victims
        if self._recheck >= 0:
            again = self.entries.get(self._recheck)
            self._recheck = -1
            if again is not None:
                self._push(again, now_us)
        skipped: list[tuple[tuple[float | int, ...], int, CacheEntry]] = []
        order, stamps = self._order, self._stamp
        freed = 0
        while order and freed < bytes_needed:
            item = order.pop_min()
            self.num_visits += 1
            entry = item[2]
            if stamps.get(entry.entry_id) != item[1]:
                continue  # stale: the entry was refreshed, used or evicted since
            if entry.entry_id == exclude_id:
                skipped.append(item)
                continue
            del stamps[entry.entry_id]  # popped: the caller evicts it
            victims.append(entry)
            freed += entry.num_bytes
        for item in skipped:
            order.add(item)
            self._recheck = exclude_id
        # Every restore estimate is read before any victim is evicted, as on the full path.
        return [prepare(e) for e in victims]
