"""Victim selection over the idle tails of the prefix tree, without building the candidate forest.

Only a chain's tail is evictable, and cutting it exposes its parent once every GPU child of the
parent is cut. Greedy by key over the forest (`greedy_on_chains`) takes the smallest key among the
current tails, step by step; a heap of the tails does the same. For a policy whose key reads only
the entry (`KeyScope.ENTRY`) the tails stay ordered between decisions (a `SortedList`, whose front
stays in cache where a heap's root-to-leaf paths do not; `policies/candidates.py`) and the tree
reports the tails it exposes (`PrefixTree.exposed`): a decision costs O(log n) per victim. For
`KeyScope.DECISION` (PERC: the key decays with idle time) the tails are keyed at each decision:
O(tails), not O(blocks). Policies that need the chains (`KeyScope.SET`: the oracle) keep the
forest path.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from sortedcontainers import SortedList

from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.policies import CacheEntry, EvictionPolicy, KeyScope

# Rebuild the persistent order when stale items outnumber the tails by this factor (amortized).
_COMPACT_FACTOR = 2

Item = tuple[tuple[float | int, ...], int, HashBlock]


class TailIndex:
    """The idle tails of `tree` in the order `policy` evicts them (ENTRY and DECISION scopes)."""

    def __init__(self, tree: PrefixTree, policy: EvictionPolicy) -> None:
        self.tree = tree
        self.policy = policy
        scope = getattr(policy, "key_scope", KeyScope.SET)
        self.persistent = scope == KeyScope.ENTRY
        self.enabled = scope in (KeyScope.ENTRY, KeyScope.DECISION)
        self.num_visits = 0  # heap items looked at by decisions (a complexity probe for tests)
        self._order: SortedList = SortedList()  # of Item, when persistent
        self._stamp: dict[int, int] = {}  # hash id -> stamp of its live heap item
        self._next_stamp = 0
        if self.persistent:
            tree.exposed = {}  # the tree records every block that becomes (or is again) a tail

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

    def select(
        self, num_blocks: int, now_us: int, prepare: Callable[[HashBlock], CacheEntry]
    ) -> list[HashBlock]:
        """Up to `num_blocks` tails in the order the forest path would cut them; each victim (and,
        for DECISION keys, each tail ranked) is passed through `prepare` before the policy reads
        it, and before anything is evicted. The caller evicts all of them, in this order."""
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
            p = b.parent
            if (
                p is None
                or p.refcount
                or p.tier != Tier.GPU
                or self.tree.blocks.get(p.hash_id) is not p
            ):
                continue
            done = cut_children.get(p.hash_id, 0) + 1
            cut_children[p.hash_id] = done
            if done == p.num_children:  # every GPU child is cut: the parent is a tail now
                entry = prepare(p) if not self.persistent else p.entry
                heapq.heappush(local, (key(entry, now_us), -1, p))
        if self.persistent:
            for b in victims:  # ranked without the manager's estimates: read them now
                prepare(b)
        return victims
