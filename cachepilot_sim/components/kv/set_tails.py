"""Chained decisions of a SET policy with an exact set index (SLRU, ARC), without the forest.

On the forest path such a policy's `prepare` reads every idle GPU block whose GPU subtree is idle
(every idle GPU block: the referenced blocks are closed under parents) and greedy on chains then
cuts the smallest key among the current tails, step by step. Here the policy's `set_index()`
holds every candidate (fed by `PrefixTree.changed`, which records each block whose idle state,
tail state or hooks may have moved) and computes `prepare`'s snapshot as one cut per segment
(`chain_cuts`: O(log n) with equal block sizes); the tails sit in one `SortedList` per segment in
the index's order, and the smallest key among them is read at each lane's two ranges (before and
after its cut): O(log n) per victim. A parent exposed by this decision's cuts joins its lane's
tails at once, as greedy on chains pushes it. `KeyedTails` drives an index that orders the tails
itself (Marconi's, `policies/marconi_index.py`) the same way: candidates and tails from
`PrefixTree.changed`, then the index's next tail, step by step.

A candidate is an idle GPU block, the forest's blocks while the referenced blocks are closed under
parents. A shared tier that writes on eviction (`remote.py`) breaks that while a cut block is held
for its write (pinned, FLIGHT_OUT, still its parent's GPU child): the forest leaves the idle blocks
above it out, while the indexes count them (SLRU's room, ARC's T1 bytes and c, Marconi's ranges),
and the decisions differ (`tests/property/test_held_blocks.py`). While any block is held, a
decision takes the forest path (`HeldFallback`, shared with `rank_tails.py`; counted in
`num_full`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.policies import CacheEntry, EvictionPolicy
from cachepilot_sim.policies.set_indexes import Item, LaneCut


class ChainedSetIndex(Protocol):
    """A set index that also answers chained decisions (`policies/set_indexes.py`)."""

    descending: tuple[bool, ...]

    def __len__(self) -> int: ...

    def add(self, entry: CacheEntry) -> None:
        """Index an idle candidate (again: its segment may have moved)."""

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""

    def lane_item(self, entry_id: int) -> tuple[int, Item] | None:
        """The candidate's lane and its item in the lane's order; None for a non-candidate."""

    def chain_cuts(self) -> list[LaneCut]:
        """`prepare` over every candidate (with its side effects), as one cut per lane."""

    def record(self, victims: list[tuple[CacheEntry, int]]) -> None:
        """The decision's victims with their segments: what the policy's key reads after it."""


class HeldFallback:
    """What every chained index of the tails shares (`SetTails`, `KeyedTails`, `RankTails`): the
    tree whose changed blocks it drains, the manager's exposed-parent rule and policy, its blocks
    by entry id; and the blocks a shared tier holds on the GPU for their writes, with the forest
    path that a decision takes while any is held (the idle blocks above one are not the
    forest's)."""

    def __init__(
        self,
        tree: PrefixTree,
        exposed_parent: Callable[[HashBlock, dict[int, int]], HashBlock | None],
        policy: EvictionPolicy,
    ) -> None:
        self.tree = tree
        self.exposed_parent = exposed_parent
        self.policy = policy  # the manager's, for the forest path
        self.blocks: dict[int, HashBlock] = {}  # entry id -> its block (the subclass says which)
        self.held: dict[int, None] = {}  # hash ids of blocks held for their write
        self.num_full = 0  # decisions that took the forest path (a block was held)
        tree.changed = {}  # the tree now records the blocks it changes, for `drain`

    def drain(self) -> None:
        """Bring the candidates (and tails) up to date with the blocks the tree recorded."""
        tree = self.tree
        changed = tree.changed
        assert changed is not None
        evictable = tree.evictable
        for h, b in changed.items():
            cur = tree.blocks.get(h)
            self.note_held(h, cur)
            if cur is None:
                self.update(h, b.entry.entry_id, None, False, False)
            else:
                idle = cur.refcount == 0 and cur.tier == Tier.GPU
                self.update(h, b.entry.entry_id, cur, idle, evictable.get(h) is cur)
        changed.clear()

    def update(
        self, hash_id: int, entry_id: int, cur: HashBlock | None, idle: bool, tail: bool
    ) -> None:
        """One changed block (`cur`, None when gone; one entry id per hash, kept across
        evictions): an idle GPU block (`idle`, a candidate) and whether it is a tail."""
        raise NotImplementedError

    def note_held(self, hash_id: int, cur: HashBlock | None) -> None:
        """Record whether the tree's block `hash_id` (`cur`, None when gone) is held."""
        if cur is not None and cur.refcount and cur.tier == Tier.FLIGHT_OUT:
            self.held[hash_id] = None
        else:
            self.held.pop(hash_id, None)

    def forest_path(
        self, num_blocks: int, now_us: int, prepare: Callable[[HashBlock], CacheEntry]
    ) -> list[HashBlock]:
        """The forest path (`PrefixKvManager._choose`), while a block is held for its write."""
        self.num_full += 1
        forest = self.tree.forest()
        entries = [prepare(b) for b in forest.blocks]
        if not entries:
            return []
        num_bytes = num_blocks * entries[0].num_bytes  # prefix blocks are one size
        victims = self.policy.select_victims(
            entries, num_bytes, now_us, forest.chains, forest.parents
        )
        return forest.cut_order(victims, self.policy.name)


class SetTails(HeldFallback):
    """The idle tails of `tree` per segment of `index`, and its candidates kept current."""

    def __init__(
        self,
        tree: PrefixTree,
        index: ChainedSetIndex,
        exposed_parent: Callable[[HashBlock, dict[int, int]], HashBlock | None],
        policy: EvictionPolicy,
    ) -> None:
        super().__init__(tree, exposed_parent, policy)  # blocks: the tails
        self.index = index
        self.lanes = [SortedList() for _ in index.descending]
        self.where: dict[int, tuple[int, Item]] = {}  # hash id -> lane, item of a tail
        self.num_visits = 0  # tail lookups by decisions (a complexity probe for tests)

    def _put(self, b: HashBlock) -> None:
        self._drop(b.hash_id)
        where = self.index.lane_item(b.entry.entry_id)
        assert where is not None, b.hash_id  # a tail is an idle GPU block: a candidate
        self.lanes[where[0]].add(where[1])
        self.where[b.hash_id] = where
        self.blocks[where[1][2]] = b

    def _drop(self, hash_id: int) -> None:
        where = self.where.pop(hash_id, None)
        if where is not None:
            self.lanes[where[0]].remove(where[1])
            self.blocks.pop(where[1][2], None)

    def update(
        self, hash_id: int, entry_id: int, cur: HashBlock | None, idle: bool, tail: bool
    ) -> None:
        """A candidate is (re)indexed (its hooks may have moved its segment); a tail laned."""
        if idle:
            assert cur is not None
            self.index.add(cur.entry)
        else:
            self.index.discard(entry_id)
        if tail:
            assert cur is not None
            self._put(cur)
        else:
            self._drop(hash_id)

    def _smallest(self, lane: int, lo: int, hi: int) -> Item:
        """The smallest (last use, id) among items lo..hi-1 of a lane (ids may descend)."""
        order = self.lanes[lane]
        self.num_visits += 1
        if not self.index.descending[lane]:
            return order[lo]  # type: ignore[no-any-return]
        first = order[lo]
        end = min(hi, order.bisect_left((first[0] + 1,)))
        return order[end - 1]  # type: ignore[no-any-return]

    def _best(self, cuts: list[LaneCut]) -> tuple[tuple[int, int, int], int] | None:
        """The smallest (segment, last use, id) among the tails, and its lane."""
        best: tuple[tuple[int, int, int], int] | None = None
        for lane, (cut, before, after) in enumerate(cuts):
            order = self.lanes[lane]
            k = len(order) if cut is None else order.bisect_left(cut)
            for lo, hi, seg in ((0, k, before), (k, len(order), after)):
                if lo < hi:
                    item = self._smallest(lane, lo, hi)
                    key = (seg, item[0], item[2])
                    if best is None or key < best[0]:
                        best = (key, lane)
        return best

    def select(
        self, num_blocks: int, now_us: int, prepare: Callable[[HashBlock], CacheEntry]
    ) -> list[HashBlock]:
        """Up to `num_blocks` tails in the order the forest path cuts them (see `TailIndex`)."""
        self.drain()
        if num_blocks <= 0 or not len(self.index):
            return []
        if self.held:
            return self.forest_path(num_blocks, now_us, prepare)
        cuts = self.index.chain_cuts()
        victims: list[HashBlock] = []
        segs: list[tuple[CacheEntry, int]] = []
        cut_children: dict[int, int] = {}
        while len(victims) < num_blocks:
            best = self._best(cuts)
            if best is None:
                break
            (seg, _, eid), _ = best
            b = self.blocks[eid]
            self._drop(b.hash_id)  # the caller evicts it (and the tree records that)
            victims.append(b)
            segs.append((b.entry, seg))
            p = self.exposed_parent(b, cut_children)
            if p is not None:
                self._put(p)
        self.index.record(segs)
        for b in victims:  # ranked without the manager's estimates: read them now
            prepare(b)
        return victims


class KeyedTailIndex(Protocol):
    """A set index that keeps the tails it searches itself (`policies/marconi_index.py`)."""

    num_visits: int

    def add_candidate(self, entry: CacheEntry) -> None:
        """An idle GPU block: a candidate of `prepare` (again: its key may have moved)."""

    def discard_candidate(self, entry_id: int) -> None:
        """No longer a candidate (no-op when absent)."""

    def add_tail(self, entry: CacheEntry) -> None:
        """A tail: searched by decisions."""

    def drop_tail(self, entry_id: int) -> None:
        """No longer a tail (no-op when absent)."""

    def start(self) -> bool:
        """Begin a decision (`prepare` over the candidates); False when there is none."""

    def pop_tail(self) -> int | None:
        """The next tail in the decision's order (an entry id); None when none is left."""

    def push_tail(self, entry: CacheEntry) -> None:
        """A block this decision's cuts made a tail: searched from now on in this decision."""


class KeyedTails(HeldFallback):
    """Chained decisions of a SET policy whose index orders the tails itself (Marconi): the
    candidates and the tails kept current from `PrefixTree.changed`, as `SetTails` keeps them,
    and greedy on chains over the index's order. The candidates are every idle GPU block, the
    forest's blocks while the referenced blocks are closed under parents; a block a shared tier
    holds on the GPU for its write breaks that, and while one is held a decision takes the
    forest path (`HeldFallback`)."""

    def __init__(
        self,
        tree: PrefixTree,
        index: KeyedTailIndex,
        exposed_parent: Callable[[HashBlock, dict[int, int]], HashBlock | None],
        policy: EvictionPolicy,
    ) -> None:
        super().__init__(tree, exposed_parent, policy)  # blocks: the tails
        self.index = index

    @property
    def num_visits(self) -> int:
        """Items the index's searches looked at (a complexity probe for tests)."""
        return self.index.num_visits

    def update(
        self, hash_id: int, entry_id: int, cur: HashBlock | None, idle: bool, tail: bool
    ) -> None:
        """A candidate is (re)indexed; a tail is handed to the index's own order."""
        index = self.index
        if idle:
            assert cur is not None
            index.add_candidate(cur.entry)
        else:
            index.discard_candidate(entry_id)
        if tail:
            assert cur is not None
            self.blocks[entry_id] = cur
            index.add_tail(cur.entry)
        else:
            self.blocks.pop(entry_id, None)
            index.drop_tail(entry_id)

    def select(
        self, num_blocks: int, now_us: int, prepare: Callable[[HashBlock], CacheEntry]
    ) -> list[HashBlock]:
        """Up to `num_blocks` tails in the order the forest path cuts them (see `TailIndex`)."""
        self.drain()
        if num_blocks > 0 and self.held:
            return self.forest_path(num_blocks, now_us, prepare)
        if num_blocks <= 0 or not self.index.start():
            return []
        victims: list[HashBlock] = []
        cut_children: dict[int, int] = {}
        while len(victims) < num_blocks:
            eid = self.index.pop_tail()
            if eid is None:
                break
            b = self.blocks.pop(eid)
            self.index.drop_tail(eid)  # the caller evicts it (and the tree records that)
            victims.append(b)
            p = self.exposed_parent(b, cut_children)
            if p is not None:
                self.blocks[p.entry.entry_id] = p
                self.index.push_tail(p.entry)
        for b in victims:  # ranked without the manager's estimates: read them now
            prepare(b)
        return victims
