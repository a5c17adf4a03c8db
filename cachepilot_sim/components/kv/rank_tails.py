"""Chained decisions of a SET policy whose index yields the full path's order lazily (S3-FIFO).

On the forest path such a policy's `prepare` ranks every idle GPU block (S3-FIFO: in the order its
loop evicts them) and greedy on chains cuts the smallest rank among the current tails, step by
step. Here the policy's `set_index()` holds every candidate, and whether it is a tail (fed by
`PrefixTree.changed`, as for `set_tails.py`), and `ranks()` yields them in that order, lazily
(`policies/s3fifo_index.py`), but for candidates that are not tails, which it may rank without
yielding them (S3-FIFO: a run of S that changes nothing its loop reads, passed at once). The
smallest-ranked current tail is a ranked block that the last cut exposed (every GPU child of it
now cut) if there is one (every ranked block that was a tail before was cut then), else the next
ranked block that is a tail: a ranked block that is not one yet waits for the cuts that expose it
(`passed` says whether an exposed block was ranked without being yielded). A decision costs the
ranks taken up to its last victim, not the forest.

A candidate is an idle GPU block, as for `set_tails.py`: the forest's blocks while the referenced
blocks are closed under parents. A shared tier that writes on eviction (`remote.py`) breaks that
while a cut block is held for its write (pinned, still its parent's GPU child): the forest leaves
the idle blocks above it out, and S3-FIFO's loop moves such a block round in M where the index
would rank it. While any block is held, a decision takes the forest path (`num_full`;
`HeldFallback`, shared with `set_tails.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.set_tails import HeldFallback
from cachepilot_sim.policies import CacheEntry, EvictionPolicy


class Ranking(Protocol):
    """The candidates' ids in the full path's order, lazily (`policies/s3fifo_index.py`)."""

    def __next__(self) -> int: ...

    def passed(self, eid: int) -> bool:
        """True when `eid` was ranked without being yielded (it was not a tail then)."""

    def expose(self, eid: int) -> None:
        """This decision's cuts made `eid` a tail: yield it at its rank."""

    def close(self) -> None:
        """The decision is done."""


class RankedSetIndex(Protocol):
    """A set index that ranks its candidates as the full path does (`S3FifoIndex`)."""

    def add(self, entry: CacheEntry, tail: bool = True) -> None:
        """The entry is a candidate (again), a tail or not."""

    def discard(self, entry_id: int) -> None:
        """The entry is no longer a candidate (no-op when absent)."""

    def ranks(self, exclude_id: int = -1) -> Ranking:
        """The candidates' ids, first victim first, lazily."""


class RankTails(HeldFallback):
    """The idle GPU blocks of `tree` as candidates of `index`, cut in its order on chains."""

    def __init__(
        self,
        tree: PrefixTree,
        index: RankedSetIndex,
        exposed_parent: Callable[[HashBlock, dict[int, int]], HashBlock | None],
        policy: EvictionPolicy,
    ) -> None:
        super().__init__(tree, exposed_parent, policy)  # blocks: every idle GPU block
        self.index = index
        self.num_visits = 0  # ranks taken by decisions (a complexity probe for tests)

    def update(
        self, hash_id: int, entry_id: int, cur: HashBlock | None, idle: bool, tail: bool
    ) -> None:
        """Every idle GPU block is a candidate, ranked knowing whether it is a tail."""
        if idle:
            assert cur is not None
            self.blocks[entry_id] = cur
            self.index.add(cur.entry, tail)
        else:
            self.blocks.pop(entry_id, None)
            self.index.discard(entry_id)

    def select(
        self, num_blocks: int, now_us: int, prepare: Callable[[HashBlock], CacheEntry]
    ) -> list[HashBlock]:
        """Up to `num_blocks` tails in the order the forest path cuts them (see `TailIndex`)."""
        self.drain()
        if num_blocks <= 0 or not self.blocks:
            return []
        if self.held:
            return self.forest_path(num_blocks, now_us, prepare)
        blocks, evictable = self.blocks, self.tree.evictable
        ranked = self.index.ranks()
        waiting: dict[int, None] = {}  # yielded, not a tail yet
        exposed: dict[int, None] = {}  # made a tail by this decision's cuts, not ranked yet
        # A ranked block the last cut exposed: it ranks before every block not ranked yet, and
        # every other ranked tail was cut when it became one, so it is the next victim.
        ready = -1
        cut_children: dict[int, int] = {}
        victims: list[HashBlock] = []
        while len(victims) < num_blocks:
            if ready >= 0:
                eid, ready = ready, -1
            else:
                eid = next(ranked, -1)
                if eid < 0:
                    break
                self.num_visits += 1
                b = blocks[eid]
                if evictable.get(b.hash_id) is not b and eid not in exposed:
                    waiting[eid] = None
                    continue
            b = blocks[eid]
            victims.append(b)
            up = self.exposed_parent(b, cut_children)
            if up is not None:
                up_id = up.entry.entry_id
                if up_id in waiting:
                    del waiting[up_id]
                    ready = up_id
                elif ranked.passed(up_id):
                    ready = up_id
                else:
                    exposed[up_id] = None
                    ranked.expose(up_id)
        ranked.close()
        for b in victims:  # ranked without the manager's estimates: read them now
            prepare(b)
        return victims
