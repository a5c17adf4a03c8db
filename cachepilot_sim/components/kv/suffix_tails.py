"""T-LRU's chained decisions without the candidate forest: two LRU lanes of tails, suffix restores.

On the forest path (`TailLruPolicy.select_victims`) every idle block whose GPU subtree is idle is
ranked (matters, last use, id): a block matters when its suffix restore, its own restore plus the
longest restore path through the forest below it, exceeds the threshold. The sums follow the
forest's chains (cut at branch points): inside a chain, from its tail up, starting from the longest
path below the chain; a chain's path, for the chain above it, is that start plus its blocks summed
from its root down (float sums in this order: the same bits). Greedy on chains then cuts the
smallest rank among the current tails, with the ranks of the decision's snapshot.

Two facts make it cheap, and exact. A current tail has no GPU child, so its suffix restore is its
own restore: between decisions the tails sit in the policy's `suffix_index()` (two LRU lanes of the
shared lane index, one per restore regime, kept by `TailIndex` as it keeps every time-indexed
policy's tails, fed by `PrefixTree.exposed`) by their restore alone. A block that this
decision's cuts expose had, at the snapshot, only this decision's victims below it (every GPU child
of it was cut), so its suffix restore is computed from theirs when it is exposed, and it waits in
the decision's own heap, ranked by the index's `rank`. No other block is ranked: a decision costs
O(log n) per victim, plus one sum over each chain it cuts whole. Where the restore estimate moves
with idle time (a CPU store whose residency is below δ) a fresh index of the current tails is
built for the decision (O(t log t) in t tails, counted in `num_full`). The lanes read the restore
alone, not the gap EMA: nothing is re-keyed when a group's gap moves.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol, cast

from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.policies import CacheEntry
from cachepilot_sim.policies.candidates import TimeIndex

ExposedParent = Callable[[HashBlock, dict[int, int]], "HashBlock | None"]
Rank = tuple[float | int, ...]  # (class, last use, entry id): the order of T-LRU's key
Restore = Callable[[HashBlock], tuple[float, float]]  # block -> (restore, gap EMA) of the decision


class SuffixIndex(TimeIndex, Protocol):
    """A time index whose order is a rank of (entry, restore): T-LRU's `LaneIndex`."""

    def rank(self, entry: CacheEntry, restore_us: float) -> Rank:
        """Where the entry, indexed with `restore_us`, sits in `pop_min`'s order."""
        ...


class RestoreRegimes(Protocol):
    """The tail index's restore regimes and the tails it keeps per regime (`TailIndex`)."""

    regime_indexes: dict[bool, TimeIndex]  # restore regime (offload?) -> its index, made on use
    regime_blocks: dict[int, HashBlock]  # entry id -> its tail, as last indexed

    def static_restore(self, b: HashBlock, offload: bool) -> tuple[float, float]:
        """(restore, gap EMA) of `b` in a regime where they stay fixed while `b` is idle."""
        ...

    def restore_mode(self, allow_offload: bool) -> bool | None:
        """The decision's regime; None: the estimate moves with idle time."""
        ...

    def regime_index(self, offload: bool) -> TimeIndex:
        """The regime's persistent index, built from every tail at its first use."""
        ...

    def drain_regimes(self) -> None:
        """Index the tails exposed since the last decision; sweep forgotten ones."""
        ...

    def forget(self, entry_id: int) -> None:
        """A stale tail (used, evicted or no longer a tail) leaves every regime's index."""
        ...


class _Chain:
    """A chain of the decision's snapshot forest, cut so far from its tail up to its last victim."""

    __slots__ = ("below_us", "suffix_us", "restores")

    def __init__(self, below_us: float, restore_us: float) -> None:
        self.below_us = below_us  # the longest path below the chain (0.0: it starts at a tail)
        self.suffix_us = below_us + restore_us  # the suffix restore of its last victim
        self.restores = [restore_us]  # tail first

    def extend(self, restore_us: float) -> float:
        """The block above the last victim joins: its suffix restore."""
        self.restores.append(restore_us)
        self.suffix_us += restore_us
        return self.suffix_us

    def path_us(self) -> float:
        """The chain's path as the chain above it reads it: the blocks summed from the root."""
        return self.below_us + sum(reversed(self.restores))


class SuffixTails:
    """The idle tails of `tree` in T-LRU's chained order (see the module docstring)."""

    def __init__(
        self,
        tree: PrefixTree,
        make_index: Callable[[], SuffixIndex],
        regimes: RestoreRegimes,
        exposed_parent: ExposedParent,
    ) -> None:
        self.tree = tree
        self.make_index = make_index
        self.regimes = regimes
        self.exposed_parent = exposed_parent
        self.fresh: dict[int, HashBlock] = {}  # the same for a decision's fresh index
        self.num_visits = 0  # items popped by decisions (a complexity probe for tests)
        self.num_full = 0  # decisions that indexed every tail (the estimate moves with time)
        tree.exposed = {}  # the tree records every block that becomes (or is again) a tail

    @property
    def indexes(self) -> dict[bool, TimeIndex]:
        """The persistent index of each restore regime used so far (the tail index's)."""
        return self.regimes.regime_indexes

    @property
    def blocks(self) -> dict[int, HashBlock]:
        """Entry id -> its tail, as last indexed (the tail index's)."""
        return self.regimes.regime_blocks

    def drain(self) -> None:
        """Index the tails the tree exposed since the last decision; sweep forgotten ones."""
        self.regimes.drain_regimes()

    def select(
        self,
        num_blocks: int,
        now_us: int,
        prepare: Callable[[HashBlock], CacheEntry],
        allow_offload: bool | None,
    ) -> list[HashBlock]:
        """Up to `num_blocks` tails in the order the forest path cuts them; every victim is passed
        through `prepare` before anything is evicted."""
        self.drain()
        evictable = self.tree.evictable
        if num_blocks <= 0 or not evictable:
            return []
        mode = None if allow_offload is None else self.regimes.restore_mode(allow_offload)
        if mode is None:  # the decision's estimates: every tail prepared now
            self.num_full += 1
            index, self.fresh = self.make_index(), {}
            for b in evictable.values():
                e = prepare(b)
                index.add(e, e.restore_us, e.gap_ema_us)
                self.fresh[e.entry_id] = b
            victims = self._cut(index, True, num_blocks, now_us, _prepared(prepare))
            self.fresh = {}
        else:
            regimes, offload = self.regimes, mode
            victims = self._cut(
                cast(SuffixIndex, regimes.regime_index(offload)),
                False,
                num_blocks,
                now_us,
                lambda b: regimes.static_restore(b, offload),
            )
        for b in victims:  # the index's estimates are the manager's now, or it is not exact
            e = prepare(b)
            assert mode is None or e.restore_us == self.regimes.static_restore(b, mode)[0]
        return victims

    def _pop(
        self, index: SuffixIndex, fresh: bool, now_us: int, restore: Restore
    ) -> tuple[Rank, HashBlock] | None:
        """The index's smallest current tail, removed, with its rank (None: no tail left)."""
        blocks, evictable = self.blocks, self.tree.evictable
        while (eid := index.pop_min(now_us)) is not None:
            self.num_visits += 1
            b = self.fresh.get(eid) if fresh else blocks.get(eid)
            if b is not None and evictable.get(b.hash_id) is b:
                return index.rank(b.entry, restore(b)[0]), b
            if not fresh:
                self.regimes.forget(eid)  # stale: used, evicted or no longer a tail
        return None

    def _cut(
        self, index: SuffixIndex, fresh: bool, num_blocks: int, now_us: int, restore: Restore
    ) -> list[HashBlock]:
        """Greedy on chains: the smaller of the index's smallest tail and the smallest parent
        this decision's cuts exposed (a local heap, ranked by its snapshot suffix restore)."""
        local: list[tuple[Rank, HashBlock, _Chain]] = []
        below: dict[int, float] = {}  # branch block -> longest path of its chains cut so far
        cut_children: dict[int, int] = {}
        victims: list[HashBlock] = []
        head: tuple[Rank, HashBlock] | None = None  # popped from the index, not yet cut
        while len(victims) < num_blocks:
            if head is None:
                head = self._pop(index, fresh, now_us, restore)
            if local and (head is None or local[0][0] < head[0]):
                _, b, chain = heapq.heappop(local)
                self.num_visits += 1
            elif head is not None:
                b, head = head[1], None
                chain = _Chain(0.0, restore(b)[0])  # a tail of the snapshot: nothing below it
            else:
                break
            victims.append(b)
            p = b.parent
            if p is not None and p.num_children > 1:  # b is its chain's root: the chain is whole
                below[p.hash_id] = max(below.get(p.hash_id, 0.0), chain.path_us())
            p = self.exposed_parent(b, cut_children)
            if p is not None:
                restore_us = restore(p)[0]
                if p.num_children == 1:  # the forest's chain runs on through p
                    suffix_us = chain.extend(restore_us)
                else:  # p heads a chain above its children's chains
                    chain = _Chain(below.pop(p.hash_id), restore_us)
                    suffix_us = chain.suffix_us
                heapq.heappush(local, (index.rank(p.entry, suffix_us), p, chain))
        if head is not None:  # popped but not cut: back where it was
            b = head[1]
            index.add(b.entry, *restore(b))
        return victims


def _prepared(
    prepare: Callable[[HashBlock], CacheEntry],
) -> Callable[[HashBlock], tuple[float, float]]:
    """(restore, gap EMA) of a block as the decision's `prepare` gives them."""

    def restore(b: HashBlock) -> tuple[float, float]:
        e = prepare(b)
        return e.restore_us, e.gap_ema_us

    return restore
