"""S3-FIFO's decisions without copying its queues: the eviction loop read lazily off the live ones.

The full path (`S3FifoPolicy.prepare`) runs S3-FIFO's loop on copies of S and M, ranks every
candidate in the order the loop evicts it and records the loop's steps; greedy by that rank picks
the victims and `on_evict` replays the recorded moves (promotions, reinsertions) up to each victim.
The loop reads S from its front and never appends to it; it reads M from its front and appends
only to M's copy. So no copy is needed: `Loop` reads S through an iterator over the live queue and
M through an iterator over the live queue followed by a deque of what the loop appended, and runs
only as far as the decision's victims reach. It records the same steps in the policy's plan, up to
where it stopped, and `on_evict` applies them for real as before: the moves up to the last victim,
which is all the full path's replay ever applies. Nothing changes the queues during a decision
(the managers call `on_evict` after `select`), so the iterators stay valid.

What the loop reads of the candidates is a membership test and how many of them sit in M
(`S3FifoPolicy.marked`, `marked_in_main`: kept by the hooks and by the index as entries become and
stop being candidates). A candidate that is in no queue (evicted after its access, then reloaded
idle) is ranked by the full path after every queued one, by id: `ranks` yields those from one
pass over the candidates, only once the loop has run out (every queued candidate ranked).

A decision costs the loop's steps up to its last victim: the victims, the moves (which the full
path's replay applies as well) and the entries the loop passes without moving them: in-use (or
excluded) entries of S that are not promoted, at most the entries in use, and on prefix chains
ranked blocks that are not tails yet (`components/kv/rank_tails.py`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

from cachepilot_sim.policies.base import CacheEntry

if TYPE_CHECKING:
    from cachepilot_sim.policies.s3fifo import S3FifoPolicy

MAX_FREQ = 3  # the 2-bit counter's ceiling in M (libCacheSim: MIN(freq, 3) - 1 on reinsertion)


class Loop:
    """S3-FIFO's eviction loop over the live queues, one victim at a time: `prepare`'s loop
    without its copies, its steps recorded in the policy's plan as `prepare` records them."""

    __slots__ = (
        "policy",
        "is_candidate",
        "small",
        "small_left",
        "main",
        "main_left",
        "appended",
        "main_bytes",
        "main_limit",
        "idle_in_main",
        "num_steps",
    )

    def __init__(
        self, policy: S3FifoPolicy, is_candidate: Callable[[int], bool], idle_in_main: int
    ) -> None:
        self.policy = policy
        self.is_candidate = is_candidate
        self.small = iter(policy.small.items())
        self.small_left = len(policy.small)  # entries of S's copy not yet taken
        self.main = iter(policy.main.items())
        self.main_left = len(policy.main)
        self.appended: deque[tuple[int, int]] = deque()  # M's copy past the live queue
        self.main_bytes = policy.queue_bytes[1]
        self.main_limit = (1 - policy.small_fraction) * policy.capacity_bytes
        self.idle_in_main = idle_in_main  # candidates in M's copy
        self.num_steps = 0  # entries taken off either queue (a complexity probe for tests)
        policy.plan, policy.plan_at, policy.rank, policy.replayed = [], {}, {}, 0

    def _take_main(self) -> tuple[int, int]:
        if self.main_left:
            self.main_left -= 1
            return next(self.main)
        return self.appended.popleft()

    def next_victim(self) -> int | None:
        """The next candidate the loop evicts (ranked, its step planned); None when it stops."""
        p = self.policy
        plan, size, is_candidate = p.plan, p.size, self.is_candidate
        while self.small_left or self.idle_in_main:
            self.num_steps += 1
            if self.idle_in_main and (self.main_bytes > self.main_limit or not self.small_left):
                eid, freq = self._take_main()
                if freq == 0 and is_candidate(eid):
                    self.idle_in_main -= 1
                    self.main_bytes -= size[eid]
                else:  # used since it was last passed (or in use now): round again
                    self.appended.append((eid, max(min(freq, MAX_FREQ) - 1, 0)))
                    plan.append(("rotate", eid))
                    continue
            else:
                self.small_left -= 1
                eid, hits = next(self.small)
                if hits >= p.threshold:  # to M's head, its counter cleared
                    self.main_bytes += size[eid]
                    self.appended.append((eid, 0))
                    self.idle_in_main += is_candidate(eid)
                    plan.append(("promote", eid))
                    continue
                if not is_candidate(eid):  # in use and not promoted: it stays in S
                    continue
            p.rank[eid] = len(p.rank)
            p.plan_at[eid] = len(plan)
            plan.append(("evict", eid))
            return eid
        return None


class S3FifoIndex:
    """S3-FIFO's candidates for a KV manager: the session manager's `set_index()`
    (`policies/candidates.py`); the prefix manager feeds it from the tree (`rank_tails.py`)."""

    __slots__ = ("policy", "entries", "num_visits")

    def __init__(self, policy: S3FifoPolicy) -> None:
        self.policy = policy
        self.entries: dict[int, CacheEntry] = {}  # the candidates
        self.num_visits = 0  # loop steps taken by decisions (a complexity probe for tests)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: CacheEntry) -> None:
        """`entry` is a candidate (again: no-op for the order, which is the queues')."""
        self.entries[entry.entry_id] = entry
        self.policy.mark(entry.entry_id, True)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        if self.entries.pop(entry_id, None) is not None:
            self.policy.mark(entry_id, False)

    def ranks(self, exclude_id: int = -1) -> Generator[int, None, None]:
        """The candidates but `exclude_id` in the full path's order (its `rank`, then by id),
        lazily; the loop's steps go into the policy's plan as they are taken."""
        p, entries = self.policy, self.entries
        in_main = p.marked_in_main - (exclude_id in entries and exclude_id in p.main)
        loop = Loop(p, lambda eid: eid in entries and eid != exclude_id, in_main)
        try:
            while (eid := loop.next_victim()) is not None:
                yield eid
            small, main = p.small, p.main
            yield from sorted(
                eid for eid in entries if eid != exclude_id and eid not in small and eid not in main
            )
        finally:
            self.num_visits += loop.num_steps

    def select(self, bytes_needed: int, now_us: int, exclude_id: int) -> list[CacheEntry]:
        """What `prepare` then greedy by key would evict among the candidates but `exclude_id`:
        the loop's victims in its order until the bytes are covered."""
        entries = self.entries
        if bytes_needed <= 0 or len(entries) - (exclude_id in entries) == 0:
            return []
        victims: list[CacheEntry] = []
        freed = 0
        ranked = self.ranks(exclude_id)
        for eid in ranked:
            victims.append(entries[eid])
            freed += entries[eid].num_bytes
            if freed >= bytes_needed:
                break
        ranked.close()
        return victims
