"""Victim selection over the idle tails of the prefix tree, without building the candidate forest.

Only a chain's tail is evictable, and cutting it exposes its parent once every GPU child of the
parent is cut. Greedy by key over the forest (`greedy_on_chains`) takes the smallest key among the
current tails, step by step; a heap of the tails does the same. For a policy whose key reads only
the entry (`KeyScope.ENTRY`) the tails stay ordered between decisions (a `SortedList`, whose front
stays in cache where a heap's root-to-leaf paths do not; `policies/candidates.py`) and the tree
reports the tails it exposes (`PrefixTree.exposed`): a decision costs O(log n) per victim. For
`KeyScope.DECISION` the tails are keyed at each decision: O(tails), not O(blocks), except for a
policy with an exact index of its decaying key (PERC's `time_index`, `policies/perc_index.py`):
its tails stay in that index (one per restore regime, fed by `PrefixTree.exposed`, re-keyed when
their group's gap EMA moves: `regroup`) and a decision pops from it, whenever every tail's restore
estimate is fixed while it is idle (no offload, or a store whose residency is at least δ; else
the decision keys every tail, counted in `num_full`). A SET policy with an exact set index
(`set_index()`: SLRU, ARC; Marconi, whose index orders the tails itself: `KeyedTails`) decides
through `set_tails.py`, one whose set index yields the full path's order lazily (S3-FIFO's loop)
through `rank_tails.py`, T-LRU's suffix restores (`suffix_index()`) through `suffix_tails.py`,
perc_plus1's greedy and +1 suffix (`chain_index()`) through `plus1_tails.py`; other policies
that need the chains (`KeyScope.SET`: the oracle) keep the forest path.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

from sortedcontainers import SortedList

from cachepilot_sim.components.kv.cpu_store import CpuStore
from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.plus1_tails import PlusOneTails
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.components.kv.rank_tails import RankTails
from cachepilot_sim.components.kv.set_tails import KeyedTails, SetTails
from cachepilot_sim.components.kv.suffix_tails import SuffixTails
from cachepilot_sim.policies import CacheEntry, EvictionPolicy, GapEstimator, KeyScope
from cachepilot_sim.policies.candidates import TimeIndex

# Rebuild the persistent order when stale items outnumber the tails by this factor (amortized).
_COMPACT_FACTOR = 2

Item = tuple[tuple[float | int, ...], int, HashBlock]


class Pricing(Protocol):
    """What the prefix manager prices a tail with (`PrefixKvManager._prepare` reads the same)."""

    group_entries: dict[int, CacheEntry]
    reload_block_us: float
    offload_enabled: bool
    cpu: CpuStore
    cpu_hash_bytes: int
    estimator: GapEstimator


class TailIndex:
    """The idle tails of `tree` in the order `policy` evicts them (ENTRY and DECISION scopes)."""

    def __init__(
        self, tree: PrefixTree, policy: EvictionPolicy, pricing: Pricing | None = None
    ) -> None:
        self.tree = tree
        self.policy = policy
        scope = getattr(policy, "key_scope", KeyScope.SET)
        self.persistent = scope == KeyScope.ENTRY
        self.enabled = scope in (KeyScope.ENTRY, KeyScope.DECISION)
        self.num_visits = 0  # heap items looked at by decisions (a complexity probe for tests)
        self.num_full = 0  # decisions of a time-indexed policy that keyed every tail
        self._order: SortedList = SortedList()  # of Item, when persistent
        self._stamp: dict[int, int] = {}  # hash id -> stamp of its live heap item
        self._next_stamp = 0
        self.pricing = pricing
        self.timed = scope == KeyScope.DECISION and pricing is not None
        self.timed = self.timed and hasattr(policy, "time_index")
        # restore regime (offload?) -> index, made on use: PERC's and the lanes' time indexes, and
        # T-LRU's suffix lanes (`SuffixTails` reads them as `regime_indexes`, `regime_blocks`)
        self._timed: dict[bool, TimeIndex] = {}
        self._blocks: dict[int, HashBlock] = {}  # entry id -> block, as last indexed
        self.regime_indexes, self.regime_blocks = self._timed, self._blocks
        self._make_regime_index = getattr(policy, "time_index", None)
        self._groups: dict[int, dict[int, None]] = {}  # group -> entry ids indexed with its gap
        self._group_of: dict[int, int] = {}  # entry id -> its group when indexed
        self._dirty: dict[int, None] = {}  # groups whose gap EMA moved since
        # A key that reads no restore estimate: one index (regime False) serves every decision.
        self.reads_restore = getattr(policy, "time_index_reads_restore", True)
        if self.persistent or self.timed:
            tree.exposed = {}  # the tree records every block that becomes (or is again) a tail
        make_set = getattr(policy, "set_index", None) if scope == KeyScope.SET else None
        self.set_tails: SetTails | RankTails | KeyedTails | None = None
        if make_set is not None:
            index = make_set()
            if hasattr(index, "ranks"):  # it yields the full path's order (S3-FIFO's loop)
                self.set_tails = RankTails(tree, index, self._exposed_parent, policy)
            elif hasattr(index, "pop_tail"):  # it orders the tails itself (Marconi)
                self.set_tails = KeyedTails(tree, index, self._exposed_parent, policy)
            else:  # it cuts its segments (SLRU, ARC)
                self.set_tails = SetTails(tree, index, self._exposed_parent, policy)
        make_suffix = getattr(policy, "suffix_index", None) if scope == KeyScope.SET else None
        if make_suffix is not None:
            self._make_regime_index = make_suffix
        self.suffix_tails = (  # T-LRU's suffix restores on chains
            None
            if make_suffix is None or pricing is None
            else SuffixTails(tree, make_suffix, self, self._exposed_parent)
        )
        make_plus1 = getattr(policy, "chain_index", None) if scope == KeyScope.SET else None
        self.plus1_tails = (  # perc_plus1's greedy and +1 suffix on chains
            None
            if make_plus1 is None or pricing is None
            else PlusOneTails(tree, make_plus1, self, self._exposed_parent, policy)
        )
        self.enabled = self.enabled or any(
            x is not None for x in (self.set_tails, self.suffix_tails, self.plus1_tails)
        )

    # -- the exact time index (PERC) -------------------------------------------------------
    def regroup(self, group: int) -> None:
        """`group`'s gap EMA moved: its indexed tails are re-keyed at the next decision."""
        if self.timed:
            self._dirty[group] = None
        if self.plus1_tails is not None:
            self.plus1_tails.regroup(group)

    def static_restore(self, b: HashBlock, offload: bool) -> tuple[float, float]:
        """(restore, gap EMA) of tail `b` as `PrefixKvManager._prepare` gives them in a regime
        where they stay fixed while `b` is idle (`restore_mode`)."""
        p = self.pricing
        assert p is not None
        e = b.entry
        s = p.group_entries.get(e.session_id)
        restore = min(p.reload_block_us, e.recompute_us) if offload else e.recompute_us
        return restore, (s.gap_ema_us if s is not None else -1.0)

    def restore_mode(self, allow_offload: bool) -> bool | None:
        """True/False: this decision's estimates are `static_restore(b, mode)`; None: the
        estimate moves with idle time (a store whose residency is below δ)."""
        p = self.pricing
        assert p is not None
        if not (allow_offload and p.offload_enabled and p.cpu.can_take(p.cpu_hash_bytes)):
            return False
        return True if p.cpu.residency_us >= p.estimator.delta_us else None

    def _index(self, b: HashBlock, only: TimeIndex | None = None) -> None:
        eid = b.entry.entry_id
        for offload, index in self._timed.items():
            if only is None or index is only:
                restore, gap = self.static_restore(b, offload)
                index.add(b.entry, restore, gap)
        self._blocks[eid] = b
        group, old = b.entry.session_id, self._group_of.get(eid)
        if old != group:
            if old is not None:
                self._groups[old].pop(eid, None)
            self._groups.setdefault(group, {})[eid] = None
            self._group_of[eid] = group

    def forget(self, eid: int) -> None:
        """Tail `eid` is stale (used, evicted or no longer a tail): out of every regime's index."""
        for index in self._timed.values():
            index.discard(eid)
        self._blocks.pop(eid, None)
        group = self._group_of.pop(eid, None)
        if group is not None:
            self._groups[group].pop(eid, None)

    def drain_regimes(self) -> None:
        """Index the tails exposed since the last decision and re-key dirty groups' tails."""
        exposed = self.tree.exposed
        assert exposed is not None
        evictable = self.tree.evictable
        for b in exposed.values():
            if evictable.get(b.hash_id) is b:
                self._index(b)
        exposed.clear()
        for group in self._dirty:
            for eid in list(self._groups.get(group, ())):
                b = self._blocks[eid]
                if evictable.get(b.hash_id) is b:
                    self._index(b)
                else:
                    self.forget(eid)
        self._dirty.clear()
        if len(self._blocks) > _COMPACT_FACTOR * len(evictable) + 64:
            for eid, b in list(self._blocks.items()):
                if evictable.get(b.hash_id) is not b:
                    self.forget(eid)

    def regime_index(self, offload: bool) -> TimeIndex:
        """The persistent index of a restore regime, built from every tail at its first use."""
        index = self._timed.get(offload)
        if index is None:
            assert self._make_regime_index is not None
            index = self._timed[offload] = self._make_regime_index()
            for b in self.tree.evictable.values():
                self._index(b, only=index)
        return index

    def _select_timed(
        self,
        offload: bool,
        num_blocks: int,
        now_us: int,
        prepare: Callable[[HashBlock], CacheEntry],
    ) -> list[HashBlock]:
        """Smallest keys first from the exact time index of this regime (see `select`)."""
        index = self.regime_index(offload)
        evictable, blocks = self.tree.evictable, self._blocks
        local: dict[int, None] = {}  # parents exposed by this decision's own cuts
        cut_children: dict[int, int] = {}
        victims: list[HashBlock] = []
        while len(victims) < num_blocks:
            eid = index.pop_min(now_us)
            if eid is None:
                break
            self.num_visits += 1
            got = blocks.get(eid)
            if got is None or (eid not in local and evictable.get(got.hash_id) is not got):
                self.forget(eid)  # stale: used, evicted or no longer a tail
                continue
            victims.append(got)
            p = self._exposed_parent(got, cut_children)
            if p is not None:
                self._index(p, only=index)
                local[p.entry.entry_id] = None
        for b in victims:  # the index's estimates are the manager's now, or it is not exact
            e = prepare(b)
            if self.reads_restore:
                assert (e.restore_us, e.gap_ema_us) == self.static_restore(b, offload)
        return victims

    def _item(self, b: HashBlock, key: tuple[float | int, ...]) -> Item:
        stamp = self._next_stamp
        self._next_stamp += 1
        self._stamp[b.hash_id] = stamp
        return (key, stamp, b)

    def _drain(self, now_us: int) -> None:
        """Index the tails the tree exposed (or re-keyed) since the last decision."""
        exposed = self.tree.exposed
        assert exposed is not None
        evictable, order, key = self.tree.evictable, self._order, self.policy.key
        for b in exposed.values():
            if evictable.get(b.hash_id) is b:
                order.add(self._item(b, key(b.entry, now_us)))
        exposed.clear()
        if len(order) > _COMPACT_FACTOR * len(evictable) + 64:
            stamps = self._stamp
            self._order = SortedList(
                it
                for it in order
                if stamps.get(it[2].hash_id) == it[1] and evictable.get(it[2].hash_id) is it[2]
            )

    def _exposed_parent(self, b: HashBlock, cut_children: dict[int, int]) -> HashBlock | None:
        """`b`'s parent when cutting `b` makes it a tail (every GPU child of it now cut), else
        None; `cut_children` counts the children cut so far in this decision."""
        p = b.parent
        if (
            p is None
            or p.refcount
            or p.tier != Tier.GPU
            or self.tree.blocks.get(p.hash_id) is not p
        ):
            return None
        done = cut_children.get(p.hash_id, 0) + 1
        cut_children[p.hash_id] = done
        return p if done == p.num_children else None

    def select(
        self,
        num_blocks: int,
        now_us: int,
        prepare: Callable[[HashBlock], CacheEntry],
        allow_offload: bool | None = None,
    ) -> list[HashBlock]:
        """Up to `num_blocks` tails in the order the forest path would cut them; each victim (and,
        for DECISION keys, each tail ranked) is passed through `prepare` before the policy reads
        it, and before anything is evicted. The caller evicts all of them, in this order.
        `allow_offload` (what `prepare` was built with) lets a time-indexed policy use its index."""
        if self.set_tails is not None:
            return self.set_tails.select(num_blocks, now_us, prepare)
        if self.suffix_tails is not None:
            return self.suffix_tails.select(num_blocks, now_us, prepare, allow_offload)
        if self.plus1_tails is not None:
            return self.plus1_tails.select(num_blocks, now_us, prepare, allow_offload)
        if self.timed and allow_offload is not None:
            self.drain_regimes()
            mode = self.restore_mode(allow_offload) if num_blocks > 0 else None
            if num_blocks > 0 and not self.reads_restore:
                mode = False
            if mode is not None:
                return self._select_timed(mode, num_blocks, now_us, prepare)
            self.num_full += num_blocks > 0
        key = self.policy.key
        main: SortedList | list[Item]
        if self.persistent:
            self._drain(now_us)
            main = self._order
            take_main: Callable[[], Item] = lambda: main.pop(0)  # noqa: E731
        else:  # keys of this decision: every current tail, prepared now (a heap: built in O(t))
            self._stamp.clear()
            main = [self._item(b, key(prepare(b), now_us)) for b in self.tree.evictable.values()]
            heapq.heapify(main)
            take_main = lambda: heapq.heappop(main)  # type: ignore[arg-type]  # noqa: E731
        local: list[Item] = []  # parents exposed by this decision's own cuts
        cut_children: dict[int, int] = {}
        victims: list[HashBlock] = []
        stamps, evictable = self._stamp, self.tree.evictable
        while len(victims) < num_blocks and (main or local):
            from_local = bool(local) and (not main or local[0] < main[0])
            _, stamp, b = heapq.heappop(local) if from_local else take_main()
            self.num_visits += 1
            if not from_local and (
                stamps.get(b.hash_id) != stamp or evictable.get(b.hash_id) is not b
            ):
                continue  # stale: re-keyed, used or evicted since it was pushed
            if not from_local:
                del stamps[b.hash_id]
            victims.append(b)
            p = self._exposed_parent(b, cut_children)
            if p is not None:
                entry = prepare(p) if not self.persistent else p.entry
                heapq.heappush(local, (key(entry, now_us), -1, p))
        if self.persistent:
            for b in victims:  # ranked without the manager's estimates: read them now
                prepare(b)
        return victims
