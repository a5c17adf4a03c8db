"""The prefix tree of cached hash blocks and a decision's candidate forest.

A request's input is a chain of prefix blocks named by hash (Mooncake `hash_ids`); equal hashes
are one cached object. Evicting block j makes every later block of its chain useless, so only a
chain's tail is evictable: a block is a candidate when nothing references it and no block on the
GPU extends it. The set of referenced blocks is closed under parents (a request pins a prefix of
its chain), so every idle GPU block is evictable once the idle blocks below it are gone.
"""

from __future__ import annotations

from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.policies import CacheEntry
from cachepilot_sim.policies.knapsack import CoverProblem


class HashBlock:
    """One cached prefix block: a node of the prefix tree."""

    __slots__ = (
        "hash_id",
        "parent",
        "children",
        "num_children",
        "refcount",
        "entry",
        "computed",
        "tier",
        "cpu_since_us",
    )

    def __init__(self, hash_id: int, parent: HashBlock | None, entry: CacheEntry) -> None:
        self.hash_id = hash_id
        self.parent = parent
        self.children: dict[int, HashBlock] = {}  # cached blocks that extend this one
        self.num_children = 0  # of those, the ones on the GPU or coming back to it
        self.refcount = 0  # running (or reloading) requests using it
        self.entry = entry
        self.computed = False  # some request finished computing it
        self.tier = Tier.GPU
        self.cpu_since_us = 0  # when it landed in the CPU store


class CandidateForest:
    """A decision's candidates: blocks, chains of their positions (root first) and, per chain,
    the chain whose tail is its root's parent (-1: none), as `select_victims` takes them."""

    def __init__(self) -> None:
        self.blocks: list[HashBlock] = []
        self.chains: list[list[int]] = []
        self.parents: list[int] = []
        self.kids: list[list[int]] = []

    def add(self, run: list[HashBlock], kids: list[int]) -> int:
        """Add a chain (root first) whose child chains are `kids`; returns its index."""
        g = len(self.chains)
        self.chains.append(list(range(len(self.blocks), len(self.blocks) + len(run))))
        self.blocks.extend(run)
        self.parents.append(-1)
        self.kids.append(kids)
        for h in kids:
            self.parents[h] = g
        return g

    def cut_order(self, victims: list[CacheEntry], policy_name: str) -> list[HashBlock]:
        """The victims in the policy's order, each chain cut from its end after the chains below
        it; a selection that is not a tail of the forest breaks the policy contract and raises."""
        index = {b.entry.entry_id: i for i, b in enumerate(self.blocks)}
        chosen = [index[v.entry_id] for v in victims]
        problem = CoverProblem.of(
            [1] * len(self.blocks), [0.0] * len(self.blocks), 0, self.chains, self.parents
        )
        if len(set(chosen)) != len(chosen) or not problem.is_feasible_set(chosen):
            raise ValueError(f"policy {policy_name!r} cut blocks that are not tails")
        chain_of = {i: g for g, c in enumerate(self.chains) for i in c}
        end = [len(c) for c in self.chains]  # items still on the GPU per chain
        cut: list[HashBlock] = []

        def cut_to(g: int, pos: int) -> None:
            if end[g] > pos and end[g] == len(self.chains[g]):
                for h in self.kids[g]:  # the chains below go first, whole
                    cut_to(h, 0)
            while end[g] > pos:
                end[g] -= 1
                cut.append(self.blocks[self.chains[g][end[g]]])

        for i in chosen:
            g = chain_of[i]
            cut_to(g, self.chains[g].index(i))
        return cut


class PrefixTree:
    """Every cached block on any tier, the idle GPU tails (eviction candidates) and counts.

    Bookkeeping only: the manager moves bytes in the pool and CPU store.
    """

    def __init__(self) -> None:
        self.blocks: dict[int, HashBlock] = {}
        self.evictable: dict[int, HashBlock] = {}  # idle tails: refcount 0, no GPU child
        self.num_gpu_blocks = 0  # blocks on the GPU or in flight to it
        self.num_idle_gpu_blocks = 0  # GPU blocks that nothing references (all evictable)
        # Blocks that became tails (or were re-keyed as tails) since the tail index last looked,
        # by hash (at most one record per cached block); None when no index keeps the tails
        # between decisions (`tails.py`).
        self.exposed: dict[int, HashBlock] | None = None
        # Blocks whose idle state, tail state or hooks may have changed since a set index looked
        # (`set_tails.py`: SLRU's and ARC's prepare reads every idle block); None when none does.
        self.changed: dict[int, HashBlock] | None = None
        # Per tail, a stamp taken when it last became one: `evictable`'s order, in which
        # `forest()` lists the leaf chains (`plus1_tails.py`); None when no index reads it.
        self.tail_stamps: dict[int, int] | None = None
        self._next_tail_stamp = 0

    def _note(self, b: HashBlock, parent_too: bool = False) -> None:
        if self.changed is not None:
            self.changed[b.hash_id] = b
            if parent_too and b.parent is not None:
                self.changed[b.parent.hash_id] = b.parent

    def tier(self, hash_id: int) -> Tier | None:
        """The tier of a cached block; None when the hash is not cached."""
        b = self.blocks.get(hash_id)
        return None if b is None else b.tier

    def on_gpu(self, hash_id: int) -> bool:
        """True when the block is cached and on the GPU (not in flight)."""
        b = self.blocks.get(hash_id)
        return b is not None and b.tier == Tier.GPU

    def pin(self, b: HashBlock) -> None:
        """One more running (or reloading) request uses b: it is not evictable."""
        if b.refcount == 0 and b.tier == Tier.GPU:
            self.num_idle_gpu_blocks -= 1
        b.refcount += 1
        self.evictable.pop(b.hash_id, None)
        self._note(b)

    def unpin(self, b: HashBlock) -> None:
        """A user of b is gone; an idle childless GPU block becomes a tail."""
        b.refcount -= 1
        self._note(b)
        if b.refcount == 0 and b.tier == Tier.GPU:
            self.num_idle_gpu_blocks += 1
            if b.num_children == 0:
                self._set_tail(b)

    def add(self, b: HashBlock) -> None:
        """A newly computed block, referenced once by the request computing it."""
        b.refcount = 1
        p = b.parent
        if p is not None:
            p.num_children += 1
            p.children[b.hash_id] = b
        self.blocks[b.hash_id] = b
        self.num_gpu_blocks += 1
        self._note(b, parent_too=True)

    def remove_gpu(self, b: HashBlock) -> None:
        """Forget a GPU block with no cached children (the caller frees its bytes)."""
        assert b.tier == Tier.GPU and not b.children
        if b.refcount == 0:
            self.num_idle_gpu_blocks -= 1
        self.evictable.pop(b.hash_id, None)
        del self.blocks[b.hash_id]
        if b.parent is not None:
            b.parent.num_children -= 1
            del b.parent.children[b.hash_id]
        self.num_gpu_blocks -= 1
        self._note(b, parent_too=True)

    def leave_gpu(self, b: HashBlock) -> None:
        """An idle GPU tail starts its copy to the CPU store: no longer on the GPU."""
        assert b.refcount == 0 and b.tier == Tier.GPU
        self.num_idle_gpu_blocks -= 1
        self.evictable.pop(b.hash_id, None)
        b.tier = Tier.FLIGHT_OUT
        self.num_gpu_blocks -= 1
        if b.parent is not None:
            b.parent.num_children -= 1  # the parent may be a tail now
        self._note(b, parent_too=True)

    def come_back(self, b: HashBlock) -> None:
        """A CPU block starts its copy back, pinned by the request it is for."""
        b.tier = Tier.FLIGHT_IN
        b.refcount += 1
        self.num_gpu_blocks += 1
        if b.parent is not None:
            b.parent.num_children += 1
        self._note(b, parent_too=True)

    def forget_off_gpu(self, b: HashBlock) -> None:
        """Forget a CPU or outbound block with no cached children."""
        assert b.tier in (Tier.CPU, Tier.FLIGHT_OUT) and not b.children and b.refcount == 0
        del self.blocks[b.hash_id]
        if b.parent is not None:
            del b.parent.children[b.hash_id]

    def expose_parent(self, b: HashBlock) -> None:
        """After b left the GPU: its parent is a candidate if idle, childless and on the GPU."""
        p = b.parent
        if (
            p is not None
            and self.blocks.get(p.hash_id) is p
            and p.refcount == 0
            and p.num_children == 0
            and p.tier == Tier.GPU
        ):
            self._set_tail(p)

    def tail_stamp(self, b: HashBlock) -> None:
        """Stamp `b` as the newest tail (`tail_stamps` must be kept)."""
        assert self.tail_stamps is not None
        self.tail_stamps[b.hash_id] = self._next_tail_stamp
        self._next_tail_stamp += 1

    def _set_tail(self, b: HashBlock) -> None:
        if self.tail_stamps is not None and b.hash_id not in self.evictable:
            self.tail_stamp(b)  # a tail again keeps its place in `evictable`, and its stamp
        self.evictable[b.hash_id] = b
        self._note(b)
        if self.exposed is not None:
            self.exposed[b.hash_id] = b

    def touch(self, b: HashBlock) -> None:
        """A hook may have changed an idle tail's key: the tail index looks at it again."""
        if self.exposed is not None and self.evictable.get(b.hash_id) is b:
            self.exposed[b.hash_id] = b
        self._note(b)  # a set index's segment may move whether b is a tail or not

    def forest(self) -> CandidateForest:
        """Every idle GPU block whose GPU subtree is idle, as chains cut at branch points.

        A chain runs from an idle tail up through ancestors with one GPU child each; a block with
        several GPU children starts a chain above them once all of them are candidates.
        """
        forest = CandidateForest()
        done_children: dict[int, list[int]] = {}  # branch block -> its candidate child chains
        work = list(self.evictable.values())
        for tail in work:  # grows while branch blocks complete
            run = [tail]
            p = tail.parent
            while p is not None and p.refcount == 0 and p.num_children == 1 and p.tier == Tier.GPU:
                run.append(p)
                p = p.parent
            g = forest.add(run[::-1], done_children.pop(tail.hash_id, []))
            if p is not None and p.refcount == 0 and p.tier == Tier.GPU:
                kids = done_children.setdefault(p.hash_id, [])
                kids.append(g)
                if len(kids) == p.num_children:
                    work.append(p)
        return forest
