"""S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23; libCacheSim
S3FIFOv0.c, the paper's version) for KV entries: a small FIFO S (10 % of the cache) that new
entries enter, a main FIFO M with a 2-bit CLOCK, and a ghost FIFO G of recent S victims.

A hit adds one to the entry's counter. Evicting from S: its oldest entry moves to M (counter
cleared) if it was hit at least `s3fifo_move_to_main_threshold` times, else it is evicted and
remembered in G. Evicting from M: its oldest entry is evicted if its counter is 0, else it is
reinserted at M's head with min(counter, 3) - 1. A miss found in G enters M; any other enters S.
S is evicted from while M holds no more than (1 - small fraction) of the cache and S is not empty.
For KV entries: an entry enters when it first goes idle (the first hook a manager calls for it),
sizes are bytes, and the cache size is the most bytes the policy has seen cached.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from cachepilot_sim.config import PolicyConfig, bounded
from cachepilot_sim.policies.base import CacheEntry, RankingPolicy, register
from cachepilot_sim.policies.reuse import GapEstimator
from cachepilot_sim.policies.s3fifo_index import MAX_FREQ, Marks, S3FifoIndex


@dataclass
class S3FifoConfig(PolicyConfig):
    """S3-FIFO's knobs, the paper's defaults: S holds 10 % of the cache; one hit in S promotes."""

    name: str = "s3fifo"
    s3fifo_small_fraction: float = bounded(0.1, gt=0, lt=1)
    s3fifo_move_to_main_threshold: int = bounded(1, ge=1, integer=True)


@register("s3fifo", config=S3FifoConfig)
class S3FifoPolicy(RankingPolicy):
    """The queues are kept in the hooks; a decision (`prepare`) runs S3-FIFO's eviction loop on
    copies of them and ranks the idle entries in the order the loop evicts them.

    Which queue the loop evicts from reads the bytes of S and M against the cache size (the most
    bytes the policy has seen cached): a rule relative to the set, so the scope is SET, like
    ARC's, and this full path costs O(cached entries) per decision; the managers decide through
    `set_index()` instead, which runs the same loop on the live queues only as far as the
    victims (`policies/s3fifo_index.py`, exact). An entry in use cannot be evicted: the loop
    moves it on as if it had been hit (from S to M if promoted, else it stays in S; in M it goes
    round again). `on_evict` replays the loop's moves (promotions, reinsertions) up to each victim
    it is told of, so the queues are the ones S3-FIFO would have after those evictions.
    """

    name = "s3fifo"

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, S3FifoConfig), type(cfg)  # the registry pairs them
        self.small_fraction = cfg.s3fifo_small_fraction
        self.threshold = cfg.s3fifo_move_to_main_threshold
        self.small: OrderedDict[int, int] = OrderedDict()  # entry id -> hits, oldest first
        self.main: OrderedDict[int, int] = OrderedDict()  # entry id -> counter, oldest first
        self.ghost: OrderedDict[int, int] = OrderedDict()  # entry id -> bytes, oldest first
        self.size: dict[int, int] = {}  # entry id -> bytes it holds in S or M
        self.queue_bytes = [0, 0]  # bytes in S, in M
        self.ghost_bytes = 0
        self.capacity_bytes = 0
        self.rank: dict[int, int] = {}  # entry id -> place in the last decision's order
        # The last decision's loop: ("promote" | "rotate" | "evict", entry id), and how far
        # `on_evict` has replayed it.
        self.plan: list[tuple[str, int]] = []
        # Ranked id -> index of its step in `plan` (the index's plan holds only the moves: the
        # number of moves before it); `on_evict` replays the moves before it.
        self.plan_at: dict[int, int] = {}
        self.replayed = 0
        self.evicted_from = [0, 0]  # victims leaving S, M
        # What an index reported (`set_index()`, `policies/s3fifo_index.py`) and what its lazy
        # loop reads instead of every candidate: how many sit in M, S's entries it must look at.
        self.marks = Marks(self.threshold)

    # -- the queues ---------------------------------------------------------------------------
    def _insert(self, entry: CacheEntry) -> None:
        eid = entry.entry_id
        self.size[eid] = entry.num_bytes
        if eid in self.ghost:  # seen recently and evicted from S: straight to M
            self.ghost_bytes -= self.ghost.pop(eid)
            self.main[eid] = 0
            self.marks.entered_main(eid)
            self.queue_bytes[1] += entry.num_bytes
        else:
            self.small[eid] = 0
            self.marks.entered_small(eid)
            self.queue_bytes[0] += entry.num_bytes
        self.capacity_bytes = max(self.capacity_bytes, sum(self.queue_bytes))

    def queue_of(self, entry_id: int) -> str:
        """ "S", "M" or "" (not cached, as the policy knows it)."""
        return "S" if entry_id in self.small else "M" if entry_id in self.main else ""

    def mark(self, entry_id: int, candidate: bool, tail: bool) -> None:
        """An index says whether the entry is a candidate now (idle, evictable) and a tail (on
        prefix chains: cut first; whole entries are all tails)."""
        self.marks.mark(entry_id, candidate, tail, self.small.get(entry_id), entry_id in self.main)

    def set_index(self) -> S3FifoIndex:
        """The exact lazy index of this policy's decisions (one per policy: it reports `marks`)."""
        return S3FifoIndex(self)

    def _promote(self, eid: int) -> None:
        self.marks.left_small(eid, self.small.pop(eid))
        self.main[eid] = 0  # the counter is cleared on the move
        self.marks.entered_main(eid)
        self.queue_bytes[0] -= self.size[eid]
        self.queue_bytes[1] += self.size[eid]

    def _rotate(self, eid: int) -> None:
        self.main[eid] = max(min(self.main.pop(eid), MAX_FREQ) - 1, 0)

    # -- hooks ----------------------------------------------------------------------------------
    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        """A hit counts one more use; a miss enters M if G remembers it, else S."""
        eid = entry.entry_id
        if eid in self.small:
            self.marks.hit_small(eid, self.small[eid])
            self.small[eid] += 1
        elif eid in self.main:
            self.main[eid] += 1
        elif eid in self.size:  # evicted before: a miss
            self._insert(entry)

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        """A new entry enters S; a known one may have grown (a turn adds tokens)."""
        eid = entry.entry_id
        if eid not in self.small and eid not in self.main:
            self._insert(entry)
            return
        self.queue_bytes[0 if eid in self.small else 1] += entry.num_bytes - self.size[eid]
        self.size[eid] = entry.num_bytes
        self.capacity_bytes = max(self.capacity_bytes, sum(self.queue_bytes))

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        """Replay the decision's loop up to this victim, then evict it from its queue (an S
        victim is remembered in G, which holds at most M's share of the cache)."""
        eid = entry.entry_id
        step = self.plan_at.get(eid, -1)
        if step >= self.replayed:
            for kind, other in self.plan[self.replayed : step]:
                if kind == "promote" and other in self.small:
                    self._promote(other)
                elif kind == "rotate" and other in self.main:
                    self._rotate(other)
            self.replayed = step  # (the full path's plan[step] is this eviction, no move)
        if eid in self.small:
            self.marks.left_small(eid, self.small.pop(eid))
            self.queue_bytes[0] -= self.size[eid]
            self.ghost[eid] = self.size[eid]
            self.ghost_bytes += self.size[eid]
            limit = (1 - self.small_fraction) * self.capacity_bytes
            while self.ghost and self.ghost_bytes > limit:
                self.ghost_bytes -= self.ghost.popitem(last=False)[1]
            self.evicted_from[0] += 1
        elif eid in self.main:
            del self.main[eid]
            self.marks.left_main(eid)
            self.queue_bytes[1] -= self.size[eid]
            self.evicted_from[1] += 1

    # -- a decision -----------------------------------------------------------------------------
    def prepare(self, entries: Sequence[CacheEntry], now_us: int) -> None:
        """Rank `entries` in the order S3-FIFO's loop evicts them, on copies of the queues."""
        idle = {e.entry_id for e in entries}
        small = deque(self.small.items())
        main = deque(self.main.items())
        small_bytes, main_bytes = self.queue_bytes
        main_limit = (1 - self.small_fraction) * self.capacity_bytes
        idle_in_main = sum(1 for eid in self.main if eid in idle)
        plan: list[tuple[str, int]] = []
        self.rank, self.plan_at, self.replayed = {}, {}, 0
        while small or idle_in_main:
            if idle_in_main and (main_bytes > main_limit or not small):
                eid, freq = main.popleft()
                if freq == 0 and eid in idle:
                    idle_in_main -= 1
                    main_bytes -= self.size[eid]
                else:  # used since it was last passed (or in use now): round again
                    main.append((eid, max(min(freq, MAX_FREQ) - 1, 0)))
                    plan.append(("rotate", eid))
                    continue
            else:
                eid, hits = small.popleft()
                if hits >= self.threshold:  # to M's head, its counter cleared
                    small_bytes -= self.size[eid]
                    main_bytes += self.size[eid]
                    main.append((eid, 0))
                    idle_in_main += eid in idle
                    plan.append(("promote", eid))
                    continue
                if eid not in idle:  # in use and not promoted: it stays in S
                    continue
                small_bytes -= self.size[eid]
            self.rank[eid] = len(self.rank)
            self.plan_at[eid] = len(plan)
            plan.append(("evict", eid))
        self.plan = plan

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        """Place in the last decision's eviction order (entries it did not rank go last)."""
        return (self.rank.get(entry.entry_id, len(self.rank)), entry.entry_id)

    def metrics(self) -> dict[str, float]:
        """How many victims left through each queue."""
        return {
            "s3fifo_evicted_small": float(self.evicted_from[0]),
            "s3fifo_evicted_main": float(self.evicted_from[1]),
        }
