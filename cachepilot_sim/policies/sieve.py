"""SIEVE (Zhang et al., "SIEVE is Simpler than LRU", NSDI'24; cachemon/sieve, libCacheSim Sieve.c)
for KV entries: one FIFO queue, a visited bit per entry and a hand that sweeps from the oldest
entry towards the newest, clearing visited bits and evicting the first unvisited entry it meets.

A hit sets the bit and moves nothing; a miss (a session back after eviction) enters at the head
as new. The hand keeps its place between evictions and wraps to the oldest entry at the head.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from cachepilot_sim.config import PolicyConfig
from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register
from cachepilot_sim.policies.reuse import GapEstimator

# A queue position: (the time the entry entered the queue, entry id); newer entries compare larger.
Position = tuple[int, int]
_BEFORE_ALL: Position = (-1, -1)  # the hand there: the next lap starts at the oldest entry


@register("sieve")
class SievePolicy(RankingPolicy):
    """The key is the absolute place where the hand will evict the entry: (lap, position).

    The hand moves over an unrolled queue, lap after lap. An unvisited entry is evicted when the
    hand next reaches its position: this lap if the position lies ahead of the hand, the next lap
    if the hand has passed it. A visited entry has its bit cleared there and is evicted one lap
    later, so a hit adds one lap (once: the bit is one bit). The hand moves only to a victim's
    key, the smallest of the idle keys, so an idle entry's key never changes between its hooks
    (ENTRY scope: the smallest key is exactly the entry SIEVE's hand would evict next), except
    the one entry a decision leaves out (the session being admitted), which the hand may pass:
    the session manager's index re-keys it at the next decision (`CandidateIndex`). When
    the victim was the newest entry the hand wraps: the next lap starts at the oldest entry, and
    entries inserted from then on are reached after every older one (they enter at the head).

    Adaptations to KV entries: an entry enters the queue when it is created (a miss re-enters at
    its access); an entry in use when the hand passes it cannot be evicted, so it keeps its place
    and is next reached a lap later (the paper's cache has no pinned objects).
    """

    name = "sieve"
    key_scope = KeyScope.ENTRY

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        self.lap: dict[int, int] = {}  # entry id -> lap of its key
        self.position: dict[int, Position] = {}  # entry id -> its place in the queue
        self.hand: tuple[int, Position] = (0, _BEFORE_ALL)  # where the last victim was evicted
        self.queue: SortedList = SortedList()  # positions of the entries in the queue

    def _position(self, entry: CacheEntry) -> Position:
        return self.position.get(entry.entry_id, (entry.created_us, entry.entry_id))

    def _reach_lap(self, pos: Position) -> int:
        """The lap in which the hand next reaches `pos` (this one, or the next if passed)."""
        lap, hand_pos = self.hand
        return lap if pos > hand_pos else lap + 1

    def _lap(self, entry: CacheEntry) -> int:
        reach = self._reach_lap(self._position(entry))
        return max(self.lap.get(entry.entry_id, reach), reach)

    def visited(self, entry: CacheEntry) -> bool:
        """SIEVE's bit: set by a hit, cleared when the hand passes the entry."""
        return self._lap(entry) > self._reach_lap(self._position(entry))

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        """A hit sets the visited bit (one more lap); a miss enters at the head, unvisited."""
        eid = entry.entry_id
        if eid not in self.lap and eid in self.position:  # evicted: a miss, new at the head
            self.position[eid] = (now_us, eid)
            self._enter(entry)
            return
        lap = self._lap(entry)
        if lap == self._reach_lap(self._position(entry)):  # the bit was clear: set it
            lap += 1
        if eid not in self.lap:
            self._enter(entry)
        self.lap[eid] = lap

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        """Fix the key of an entry (new, or passed by the hand while in use) before indexing."""
        if entry.entry_id not in self.lap:
            self._enter(entry)
        self.lap[entry.entry_id] = self._lap(entry)

    def _enter(self, entry: CacheEntry) -> None:
        self.position[entry.entry_id] = pos = self._position(entry)
        self.queue.add(pos)
        self.lap[entry.entry_id] = self._reach_lap(pos)

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        """The hand moves to the victim's place; the entry leaves the queue (its position is kept
        only to recognise a miss)."""
        if entry.entry_id not in self.lap:
            return
        lap, pos = self._lap(entry), self._position(entry)
        newest = self.queue[-1] == pos
        self.queue.remove(pos)
        del self.lap[entry.entry_id]
        self.hand = max(self.hand, (lap + 1, _BEFORE_ALL) if newest else (lap, pos))

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        lap = self._lap(entry)
        created, eid = self._position(entry)
        return (lap, created, eid)

    def metrics(self) -> dict[str, float]:
        """How many laps the hand swept (how often visited entries were spared)."""
        return {"sieve_hand_laps": float(self.hand[0])}
