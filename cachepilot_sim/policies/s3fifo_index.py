"""S3-FIFO's decisions without copying its queues: the eviction loop read lazily off the live ones.

The full path (`S3FifoPolicy.prepare`) runs S3-FIFO's loop on copies of S and M, ranks every
candidate in the order the loop evicts it and records the loop's steps; greedy by that rank picks
the victims and `on_evict` replays the recorded moves (promotions, reinsertions) up to each victim.
The loop reads S from its front and never appends to it; it reads M from its front and appends
only to M's copy. So no copy is needed: `Loop` walks S by place from a cursor and reads M through
an iterator over the live queue followed by a deque of what the loop appended, and runs only as
far as the decision's victims reach. It records the same moves in the policy's plan, up to where
it stopped, and each ranked entry's `plan_at` (the moves before it), and `on_evict` applies them
for real as before: the moves up to the last victim, which is all the full path's replay ever
applies. Nothing changes the queues during a decision (the managers call `on_evict` after
`select`), so the iterators stay valid.

What the loop reads of the candidates is kept in `Marks` by the policy's hooks and by the index:
which entries are candidates (and tails), how many of them sit in M, and S's entries by place with
the lively ones (a step must look at them: promotable, or a candidate that is a tail) in a
`SortedList`. A run of other S entries changes nothing the loop reads (an entry in use stays in S;
a prefix block that is not a tail takes a rank but cannot be cut unless this decision's cuts
expose it), so it is passed at once. A candidate that is in no queue (evicted after its access,
then reloaded idle) is ranked by the full path after every queued one, by id: `Ranking` yields
those from one pass over the candidates, only once the loop has run out (every queued candidate
ranked).

A decision costs the loop's steps up to its last victim: the victims, the moves (which the full
path's replay applies as well), entries in use or excluded that the loop reaches, and an O(log n)
search per skipped run; on prefix chains, also blocks in M that are not tails yet
(`components/kv/rank_tails.py`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.policies.base import CacheEntry

MAX_FREQ = 3  # the 2-bit counter's ceiling in M (libCacheSim: MIN(freq, 3) - 1 on reinsertion)


class Marks:
    """What the lazy loop reads of the candidates, kept by the policy's hooks and the index.

    `marked`: the candidates; `in_main`: how many of them sit in M. S's entries get increasing
    places (`seq`: S only appends), and `lively` holds, by place, the S entries a loop step must
    look at: those hit often enough to be promoted and the candidates that are tails. Any other S
    entry is a step that changes nothing the loop reads: an entry in use that stays in S, or a
    candidate that is not a tail (a prefix block below which blocks are cached), which takes a
    rank but cannot be cut unless this decision's cuts expose it.
    """

    __slots__ = ("threshold", "marked", "tails", "in_main", "seq", "next_seq", "lively")

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.marked: dict[int, None] = {}
        self.tails: dict[int, None] = {}  # candidates that are tails
        self.in_main = 0
        self.seq: dict[int, int] = {}  # S entry id -> its place in S
        self.next_seq = 0
        self.lively = SortedList()  # (place, entry id)

    def _lively(self, eid: int, hits: int) -> bool:
        return hits >= self.threshold or eid in self.tails

    def entered_small(self, eid: int) -> None:
        """`eid` entered S (no hits yet)."""
        self.seq[eid] = self.next_seq
        self.next_seq += 1
        if eid in self.tails:
            self.lively.add((self.seq[eid], eid))

    def left_small(self, eid: int, hits: int) -> None:
        """`eid` (with `hits`) left S."""
        place = self.seq.pop(eid)
        if self._lively(eid, hits):
            self.lively.remove((place, eid))

    def hit_small(self, eid: int, hits: int) -> None:
        """`eid`, in S with `hits`, is hit once more."""
        if not self._lively(eid, hits) and hits + 1 >= self.threshold:
            self.lively.add((self.seq[eid], eid))

    def entered_main(self, eid: int) -> None:
        """`eid` entered M."""
        self.in_main += eid in self.marked

    def left_main(self, eid: int) -> None:
        """`eid` left M."""
        self.in_main -= eid in self.marked

    def mark(self, eid: int, candidate: bool, tail: bool, hits: int | None, in_main: bool) -> None:
        """`eid` is a candidate (a tail) or not; `hits` its hits if in S, else None."""
        tail = tail and candidate
        was = hits is not None and self._lively(eid, hits)
        if candidate != (eid in self.marked):
            if candidate:
                self.marked[eid] = None
            else:
                del self.marked[eid]
            if in_main:
                self.in_main += 1 if candidate else -1
        if tail:
            self.tails[eid] = None
        else:
            self.tails.pop(eid, None)
        if hits is not None and was != self._lively(eid, hits):
            if was:
                self.lively.remove((self.seq[eid], eid))
            else:
                self.lively.add((self.seq[eid], eid))


class S3FifoQueues(Protocol):
    """What the lazy loop reads and records of S3-FIFO (`S3FifoPolicy`; no import of it)."""

    small: OrderedDict[int, int]  # entry id -> hits, oldest first
    main: OrderedDict[int, int]  # entry id -> counter, oldest first
    size: dict[int, int]
    queue_bytes: list[int]
    small_fraction: float
    threshold: int
    capacity_bytes: int
    marks: Marks
    plan: list[tuple[str, int]]
    plan_at: dict[int, int]
    rank: dict[int, int]
    replayed: int

    def mark(self, entry_id: int, candidate: bool, tail: bool) -> None: ...


class Loop:
    """S3-FIFO's eviction loop over the live queues, one victim at a time: `prepare`'s loop
    without its copies. Its moves go into the policy's plan as `prepare` records them; a ranked
    entry's `plan_at` is the number of moves before it (`on_evict` replays up to there)."""

    __slots__ = (
        "policy",
        "marks",
        "is_candidate",
        "cursor",
        "last_seq",
        "ahead",
        "main",
        "main_left",
        "appended",
        "main_bytes",
        "main_limit",
        "idle_in_main",
        "num_steps",
    )

    def __init__(
        self, policy: S3FifoQueues, is_candidate: Callable[[int], bool], idle_in_main: int
    ) -> None:
        self.policy = policy
        self.marks = policy.marks
        self.is_candidate = is_candidate
        # S's copy: the live entries placed after `cursor`, up to the last one.
        self.cursor = -1
        self.last_seq = self.marks.seq[next(reversed(policy.small))] if policy.small else -1
        self.ahead: list[tuple[int, int]] = []  # S entries this decision's cuts made tails
        self.main = iter(policy.main.items())
        self.main_left = len(policy.main)
        self.appended: deque[tuple[int, int]] = deque()  # M's copy past the live queue
        self.main_bytes = policy.queue_bytes[1]
        self.main_limit = (1 - policy.small_fraction) * policy.capacity_bytes
        self.idle_in_main = idle_in_main  # candidates in M's copy
        self.num_steps = 0  # steps and skipped runs (a complexity probe for tests)
        policy.plan, policy.plan_at, policy.rank, policy.replayed = [], {}, {}, 0

    def _take_main(self) -> tuple[int, int]:
        if self.main_left:
            self.main_left -= 1
            return next(self.main)
        return self.appended.popleft()

    def _next_small(self) -> tuple[int, int] | None:
        """The first lively S entry (or one exposed by this decision) after the cursor."""
        lively = self.marks.lively
        i = lively.bisect_left((self.cursor + 1, -1))
        nxt: tuple[int, int] | None = lively[i] if i < len(lively) else None
        if self.ahead and (nxt is None or self.ahead[0] < nxt):
            return heapq.heappop(self.ahead)
        return nxt

    def next_victim(self) -> int | None:
        """The next candidate the loop ranks (a tail, or in M); None when it stops."""
        p = self.policy
        plan, size, is_candidate = p.plan, p.size, self.is_candidate
        while self.cursor < self.last_seq or self.idle_in_main:
            self.num_steps += 1
            small_left = self.cursor < self.last_seq
            if self.idle_in_main and (self.main_bytes > self.main_limit or not small_left):
                eid, freq = self._take_main()
                if freq == 0 and is_candidate(eid):
                    self.idle_in_main -= 1
                    self.main_bytes -= size[eid]
                else:  # used since it was last passed (or in use now): round again
                    self.appended.append((eid, max(min(freq, MAX_FREQ) - 1, 0)))
                    plan.append(("rotate", eid))
                    continue
            else:
                nxt = self._next_small()
                end = self.last_seq if nxt is None else nxt[0] - 1
                self.cursor = max(self.cursor, end)  # steps that change nothing it reads: at once
                if nxt is None:
                    continue
                self.cursor, eid = nxt
                if p.small[eid] >= p.threshold:  # to M's head, its counter cleared
                    self.main_bytes += size[eid]
                    self.appended.append((eid, 0))
                    self.idle_in_main += is_candidate(eid)
                    plan.append(("promote", eid))
                    continue
                if not is_candidate(eid):  # in use (excluded) and not promoted: stays in S
                    continue
            p.rank[eid] = len(p.rank)
            p.plan_at[eid] = len(plan)
            return eid
        return None

    def passed(self, eid: int) -> bool:
        """True when `eid` is an S candidate the loop ranked in a skipped run (not a tail)."""
        place = self.marks.seq.get(eid)
        p = self.policy
        return (
            place is not None
            and place <= self.cursor
            and p.small[eid] < p.threshold
            and self.is_candidate(eid)
        )

    def expose(self, eid: int) -> None:
        """This decision's cuts made `eid` a tail: the loop stops at it if it is ahead in S."""
        place = self.marks.seq.get(eid)
        p = self.policy
        if place is not None and place > self.cursor and p.small[eid] < p.threshold:
            heapq.heappush(self.ahead, (place, eid))


class Ranking:
    """The candidates but one in the full path's order, lazily: the loop's ranks, then the
    candidates in no queue by id. A prefix block ranked in a skipped run is not yielded: the
    caller asks `passed` when a cut exposes it."""

    def __init__(self, index: S3FifoIndex, exclude_id: int) -> None:
        p, entries = index.policy, index.entries
        self.index, self.exclude_id = index, exclude_id
        in_main = p.marks.in_main - (exclude_id in entries and exclude_id in p.main)
        self.loop = Loop(p, lambda eid: eid in entries and eid != exclude_id, in_main)
        self.rest: Iterator[int] | None = None

    def __iter__(self) -> Ranking:
        return self

    def __next__(self) -> int:
        if self.rest is None:
            eid = self.loop.next_victim()
            if eid is not None:
                return eid
            p, exclude_id = self.index.policy, self.exclude_id
            self.rest = iter(
                sorted(
                    eid
                    for eid in self.index.entries
                    if eid != exclude_id and eid not in p.small and eid not in p.main
                )
            )
        return next(self.rest)

    def passed(self, eid: int) -> bool:
        """`eid` was ranked in a skipped run. Exposed by the cut just made, it is the next victim;
        it needs no place in the plan: `on_evict` of that cut's block, evicted just before it,
        replays the moves up to a later step than its rank."""
        return self.loop.passed(eid)

    def expose(self, eid: int) -> None:
        """This decision's cuts made `eid` a tail."""
        self.loop.expose(eid)

    def close(self) -> None:
        """The decision is done: count its steps."""
        self.index.num_visits += self.loop.num_steps


class S3FifoIndex:
    """S3-FIFO's candidates for a KV manager: the session manager's `set_index()`
    (`policies/candidates.py`); the prefix manager feeds it from the tree (`rank_tails.py`)."""

    __slots__ = ("policy", "entries", "num_visits")

    def __init__(self, policy: S3FifoQueues) -> None:
        self.policy = policy
        self.entries: dict[int, CacheEntry] = {}  # the candidates
        self.num_visits = 0  # loop steps taken by decisions (a complexity probe for tests)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: CacheEntry, tail: bool = True) -> None:
        """`entry` is a candidate (again: a tail or not, on prefix chains)."""
        self.entries[entry.entry_id] = entry
        self.policy.mark(entry.entry_id, True, tail)

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""
        if self.entries.pop(entry_id, None) is not None:
            self.policy.mark(entry_id, False, False)

    def ranks(self, exclude_id: int = -1) -> Ranking:
        """The candidates but `exclude_id` in the full path's order, lazily."""
        return Ranking(self, exclude_id)

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
