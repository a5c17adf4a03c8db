"""The eviction-policy contract: a policy orders idle cached KV; the smallest key is evicted first.

Modelled on SGLang's mem_cache (a policy is a sort key) with a registry that rejects unknown and
duplicate names. Policies never import simpy: the KV manager calls them with plain data.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, cast, runtime_checkable

from cachepilot_sim.config.policy import POLICIES, PolicyConfig
from cachepilot_sim.policies.reuse import GapEstimator


@dataclass(slots=True)
class CacheEntry:
    """A session's cached KV on the GPU, as a policy sees it.

    restore_us is the cheaper way back if this entry is evicted now: reload over PCIe when a CPU
    copy will exist, else recompute; the KV manager fills it in just before a decision.
    """

    entry_id: int
    session_id: int
    model_index: int
    class_index: int
    priority: int
    num_tokens: int
    num_bytes: int
    created_us: int
    last_used_us: int
    num_uses: int = 1
    gap_ema_us: float = -1.0  # EMA of this session's observed idle gaps; < 0 when none seen yet
    recompute_us: float = 0.0
    reload_us: float = 0.0
    restore_us: float = 0.0
    # The session's true next arrival (µs), filled only for clairvoyant studies: -1 when it will
    # not come back (or the simulation does not know).
    next_arrival_us: int = -1


# Positions in a decision's `entries`, grouped root first: from a chain only a tail may be cut
# (prefix-sharing blocks: evicting block j makes every later block of its chain useless). With
# `parents` (one per chain: the chain whose tail is the parent of its root, -1 for none), a
# chain's items may go only once every chain below it is cut whole (a prefix tree's branches).
Chains = Sequence[Sequence[int]]


class KeyScope(StrEnum):
    """What a policy's ranking reads; it tells a KV manager how to keep the candidates.

    ENTRY: `key` reads only the entry and the policy's record of that entry, and changes only when
    the entry is released or hooked (`on_access`): the manager keeps idle entries in a heap by key
    (`policies/candidates.py`, the prefix manager's tail heap), a decision costs O(log n).
    DECISION: the key also reads the time or the restore estimate of the decision (PERC's resume
    probability decays with idle time), but each entry alone: the prefix manager keys only the
    current chain tails at the decision. SET: the decision needs every candidate (an exact oracle,
    a rule relative to the set, read in `prepare`): `select_victims` sees them all.
    """

    ENTRY = "entry"
    DECISION = "decision"
    SET = "set"


@runtime_checkable
class EvictionPolicy(Protocol):
    """Orders evictable cache entries: the smallest key is evicted first.

    Callers (the KV managers) call `on_evict` for every victim they evict, `on_access` when an
    entry is used again (a hit, or a return after eviction) and `on_release` when it becomes idle.
    With `chains` (and `parents`), `select_victims` must return, per chain, a tail (possibly
    empty), and cut into a chain only when the chains below it are cut whole.
    """

    name: str
    key_scope: KeyScope

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]: ...

    def select_victims(
        self,
        entries: Sequence[CacheEntry],
        bytes_needed: int,
        now_us: int,
        chains: Chains | None = None,
        parents: Sequence[int] | None = None,
    ) -> list[CacheEntry]: ...

    def on_access(self, entry: CacheEntry, now_us: int) -> None: ...

    def on_release(self, entry: CacheEntry, now_us: int) -> None: ...

    def on_evict(self, entry: CacheEntry, now_us: int) -> None: ...

    def metrics(self) -> dict[str, float]: ...


class RankingPolicy:
    """The key is the ranking: greedy by key until `bytes_needed` are freed.

    Keys must end with the unique entry_id. A rule stated relative to the candidates (SLRU's and
    ARC's segment shares of the idle bytes, Marconi's min-max normalisation) reads them in
    `prepare`, once per decision; the key then ranks each entry alone, as SGLang's one-method
    strategies do, and sorting by it gives the decision exactly (tests/property checks every
    registered ranking policy). Outside a decision (a trace score, say) a key uses the state of
    the last one.
    """

    name = "ranking"
    # Safe default: a subclass that ranks each entry alone by `key` says so (ENTRY or DECISION).
    key_scope = KeyScope.SET

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        self.cfg = cfg
        self.estimator = estimator

    def prepare(self, entries: Sequence[CacheEntry], now_us: int) -> None:
        """Read what a rule relative to the candidates needs, before any key of this decision;
        most policies need nothing."""

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        raise NotImplementedError

    def order(self, entries: Sequence[CacheEntry], now_us: int) -> list[CacheEntry]:
        """All entries, first victim first: `prepare`, then sorted by key. Override only to get
        the same order faster (PERC vectorises its keys)."""
        self.prepare(entries, now_us)
        return sorted(entries, key=lambda e: self.key(e, now_us))

    def select_victims(
        self,
        entries: Sequence[CacheEntry],
        bytes_needed: int,
        now_us: int,
        chains: Chains | None = None,
        parents: Sequence[int] | None = None,
    ) -> list[CacheEntry]:
        victims: list[CacheEntry] = []
        freed = 0
        if bytes_needed <= 0:
            return victims
        if chains is not None:  # the policy's order, restricted to what is a tail at each step
            ranked = self.order(entries, now_us)
            rank = {e.entry_id: r for r, e in enumerate(ranked)}
            picks = greedy_on_chains(
                [rank[e.entry_id] for e in entries], entries, chains, bytes_needed, parents
            )
            return [entries[i] for i in picks]
        for entry in self.order(entries, now_us):
            victims.append(entry)
            freed += entry.num_bytes
            if freed >= bytes_needed:
                break
        return victims

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        """Called when a session's next turn arrives; most policies need nothing here."""

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        """Called when a turn ends and its KV becomes idle (a gap starts); most need nothing."""

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        """Called by the KV manager for each victim it evicts; most policies need nothing."""

    def metrics(self) -> dict[str, float]:
        """Run metrics the policy keeps (an oracle's gaps, say); merged into the run's metrics."""
        return {}


def greedy_on_chains(
    rank: Sequence[Any],
    entries: Sequence[CacheEntry],
    chains: Chains,
    bytes_needed: int,
    parents: Sequence[int] | None = None,
) -> list[int]:
    """Positions cut greedily, smallest rank first among the chains' current tails.

    Cutting a chain's tail exposes the item before it; a chain's tail is exposed once every chain
    below it is cut whole. Ranks are comparable and distinct (a policy's order position, or a key
    ending with the entry id). Takes every item when all of them free less than `bytes_needed`:
    the caller sees that it could not free enough.
    """
    below = [0] * len(chains)
    for up in parents or ():
        if up >= 0:
            below[up] += 1
    heap = [(rank[c[-1]], g, len(c) - 1) for g, c in enumerate(chains) if c and below[g] == 0]
    heapq.heapify(heap)
    picks: list[int] = []
    freed = 0
    while heap and freed < bytes_needed:
        _, g, k = heapq.heappop(heap)
        item = chains[g][k]
        picks.append(item)
        freed += entries[item].num_bytes
        if k > 0:
            heapq.heappush(heap, (rank[chains[g][k - 1]], g, k - 1))
        elif parents is not None and parents[g] >= 0:
            up = parents[g]
            below[up] -= 1
            if below[up] == 0:
                heapq.heappush(heap, (rank[chains[up][-1]], up, len(chains[up]) - 1))
    return picks


PolicyFactory = Callable[[PolicyConfig, GapEstimator], EvictionPolicy]


def register(
    name: str, config: type[PolicyConfig] = PolicyConfig
) -> Callable[[PolicyFactory], PolicyFactory]:
    """Class decorator: make a policy available as `policy=<name>`, reading `config` (a
    PolicyConfig subclass declared beside it when it has knobs of its own). Duplicates are an
    error. The registry is config's (config/registry.py), so configs validate names without
    importing policies."""

    def wrap(factory: PolicyFactory) -> PolicyFactory:
        POLICIES.add(name, factory, config)
        return factory

    return wrap


def make_policy(cfg: PolicyConfig, estimator: GapEstimator) -> EvictionPolicy:
    """The registered policy `cfg.name`, built from `cfg` (a ValueError lists the known names)."""
    factory = POLICIES.entry(cfg.name).factory
    return cast(EvictionPolicy, factory(cfg, estimator))
