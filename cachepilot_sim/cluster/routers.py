"""Routers: which replica serves a request. A router is a strategy behind a registry
(`router=<name>`); it reads the replicas' load through a `ClusterView` and never touches an
engine. No simpy here: the `Router` process (cluster/router.py) calls `choose`.

`prefix_aware` follows the SGLang router's cache-aware policy (sgl-project/sglang, sgl-router
`src/policies/cache_aware.rs`, defaults from its `CacheAwareConfig`): an approximate prefix tree
per worker, built from the requests the router itself sent there; while the load is balanced a
request goes to the worker with the longest cached prefix if the match covers more than
`cache_threshold` of the prompt, else to the worker with the smallest tree; while it is not
(max - min outstanding > `balance_abs_threshold` and max > `balance_rel_threshold` x min), to the
least loaded worker. llm-d's precise scorer differs in reading the engines' real KV events; ours
is SGLang's approximate one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cachepilot_sim.components.request import Request
from cachepilot_sim.config.base import bounded
from cachepilot_sim.config.cluster import ROUTERS, RouterConfig


class ClusterView(Protocol):
    """What a router may read about the replicas it places on."""

    @property
    def num_replicas(self) -> int:
        """Replicas this router places on."""

    def outstanding(self, replica: int) -> int:
        """Requests routed to `replica` that have not completed or been rejected."""

    def kv_load(self, replica: int) -> float:
        """(Used + in-flight KV bytes) / pool bytes of `replica`."""


class Router(Protocol):
    """Places each request on one replica."""

    def choose(self, req: Request, view: ClusterView) -> int:
        """The replica index (0 .. num_replicas - 1) that serves `req`."""


RouterFactory = Callable[[RouterConfig, int], Router]


def register(
    name: str, config: type[RouterConfig] = RouterConfig, keeps_sessions: bool = False
) -> Callable[[RouterFactory], RouterFactory]:
    """Make a router available as `router=<name>`, reading `config`. `keeps_sessions`: every
    turn of a session goes to one replica (the session KV manager needs that; config checks)."""

    def wrap(factory: RouterFactory) -> RouterFactory:
        factory.keeps_sessions = keeps_sessions  # type: ignore[attr-defined]
        ROUTERS.add(name, factory, config)
        return factory

    return wrap


def make_router(cfg: RouterConfig, num_replicas: int) -> Router:
    """The router `cfg.name` names, for `num_replicas` replicas."""
    router: Router = ROUTERS.entry(cfg.name).factory(cfg, num_replicas)
    return router


def least_outstanding(view: ClusterView) -> int:
    """The replica with the fewest outstanding requests; ties go to the lowest index."""
    return min(range(view.num_replicas), key=view.outstanding)


@register("round_robin")
class RoundRobin:
    """Replica 0, 1, ..., N-1, 0, ... in arrival order, blind to load and cache."""

    def __init__(self, cfg: RouterConfig, num_replicas: int) -> None:
        self.num_replicas, self.next = num_replicas, 0

    def choose(self, req: Request, view: ClusterView) -> int:
        """The next replica in turn."""
        r = self.next
        self.next = (r + 1) % self.num_replicas
        return r


@register("least_outstanding")
class LeastOutstanding:
    """Join the shortest queue: fewest requests routed and not yet done (SGLang's and vLLM's
    production-stack load balancing)."""

    def __init__(self, cfg: RouterConfig, num_replicas: int) -> None:
        pass

    def choose(self, req: Request, view: ClusterView) -> int:
        """The least loaded replica."""
        return least_outstanding(view)


@register("least_kv")
class LeastKv:
    """The replica whose KV pool is least full (llm-d's kv-cache-utilization scorer alone);
    ties by outstanding requests, then index."""

    def __init__(self, cfg: RouterConfig, num_replicas: int) -> None:
        pass

    def choose(self, req: Request, view: ClusterView) -> int:
        """The replica with the lowest KV load."""
        return min(range(view.num_replicas), key=lambda i: (view.kv_load(i), view.outstanding(i)))


@register("session_affinity", keeps_sessions=True)
class SessionAffinity:
    """Sticky sessions: a session's first turn goes to the least loaded replica, every later turn
    to the same one (the session id is the inferred session in trace replay)."""

    def __init__(self, cfg: RouterConfig, num_replicas: int) -> None:
        self.home: dict[int, int] = {}

    def choose(self, req: Request, view: ClusterView) -> int:
        """The session's replica, chosen by load on its first turn."""
        r = self.home.get(req.group_id)
        if r is None:
            r = self.home[req.group_id] = least_outstanding(view)
        return r


@dataclass
class PrefixAwareConfig(RouterConfig):
    """SGLang cache-aware router's knobs (defaults as in its CacheAwareConfig)."""

    cache_threshold: float = bounded(0.5, ge=0, le=1)
    balance_abs_threshold: int = bounded(32, ge=0, integer=True)
    balance_rel_threshold: float = bounded(1.1, ge=1)
    # Prefix blocks the router remembers per replica (least recently routed forgotten first):
    # SGLang's max_tree_size, here in hash blocks.
    max_tree_blocks: int = bounded(10_000, gt=0, integer=True)


@register("prefix_aware", config=PrefixAwareConfig)
class PrefixAware:
    """Cache-aware routing over an approximate per-replica prefix index (module docstring).

    One dict maps a prefix-block hash to a bitmask of the replicas believed to hold it, so a
    lookup costs O(prompt blocks), whatever the number of replicas; per replica an LRU of its
    hashes bounds what it is believed to hold.
    """

    def __init__(self, cfg: RouterConfig, num_replicas: int) -> None:
        assert isinstance(cfg, PrefixAwareConfig)
        self.cfg = cfg
        self.owners: dict[int, int] = {}
        self.trees: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self.num_cache_routed = 0  # requests placed by prefix match (the rest by load or size)

    def choose(self, req: Request, view: ClusterView) -> int:
        """Least loaded while imbalanced; else the longest match above the threshold; else the
        replica with the smallest tree."""
        n = view.num_replicas
        loads = [view.outstanding(i) for i in range(n)]
        lo, hi = min(loads), max(loads)
        c = self.cfg
        if hi - lo > c.balance_abs_threshold and hi > c.balance_rel_threshold * lo:
            r = loads.index(lo)
        else:
            depth, mask = self._match(req.hash_ids)
            if req.hash_ids and depth / len(req.hash_ids) > c.cache_threshold:
                holders = [i for i in range(n) if mask >> i & 1]
                r = min(holders, key=lambda i: (loads[i], i))
                self.num_cache_routed += 1
            else:
                r = min(range(n), key=lambda i: (len(self.trees[i]), loads[i], i))
        self._insert(r, req.hash_ids)
        return r

    def _match(self, hashes: list[int]) -> tuple[int, int]:
        """(blocks matched, bitmask of the replicas matching that many): the hashes are chained
        (each names its whole prefix), so a replica matches k blocks when it holds the first k."""
        mask, depth = -1, 0
        for h in hashes:
            m = mask & self.owners.get(h, 0)
            if not m:
                break
            mask, depth = m, depth + 1
        return depth, (mask if depth else 0)

    def _insert(self, r: int, hashes: list[int]) -> None:
        tree, bit = self.trees[r], 1 << r
        for h in hashes:
            if h in tree:
                tree.move_to_end(h)
            else:
                tree[h] = None
                self.owners[h] = self.owners.get(h, 0) | bit
        while len(tree) > self.cfg.max_tree_blocks:
            old, _ = tree.popitem(last=False)
            left = self.owners[old] & ~bit
            if left:
                self.owners[old] = left
            else:
                del self.owners[old]
