"""The covering knapsack's data: items in chains (and chains in a tree), costs, sizes, the need,
and a solver's answer. See `knapsack.py` for the problem and the solvers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CoverProblem:
    """Sizes (bytes, > 0) and costs (>= 0) per item; chains partition the items, root first.

    parents[g] is the chain whose tail item is the parent of chain g's root (-1: none); empty when
    every chain is free-standing.
    """

    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    need: int
    chains: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...] = ()

    @staticmethod
    def of(
        sizes: Sequence[int],
        costs: Sequence[float],
        need: int,
        chains: Sequence[Sequence[int]] | None = None,
        parents: Sequence[int] | None = None,
    ) -> CoverProblem:
        """Build and check a problem; chains default to one per item (whole-session entries)."""
        n = len(sizes)
        if len(costs) != n:
            raise ValueError(f"{n} sizes but {len(costs)} costs")
        if any(s <= 0 for s in sizes) or any(not c >= 0 for c in costs):
            raise ValueError("sizes must be > 0 and costs >= 0 (and not NaN)")
        groups = (
            tuple(tuple(c) for c in chains) if chains is not None else tuple((i,) for i in range(n))
        )
        flat = sorted(i for g in groups for i in g)
        if flat != list(range(n)) or any(len(g) == 0 for g in groups):
            raise ValueError("chains must partition the item indices 0..n-1 without empty chains")
        links = tuple(int(p) for p in parents) if parents is not None else ()
        if links and (len(links) != len(groups) or not _is_forest(links)):
            raise ValueError("parents must give one chain index (or -1) per chain, without cycles")
        if all(p < 0 for p in links):
            links = ()
        return CoverProblem(
            tuple(int(s) for s in sizes), tuple(float(c) for c in costs), int(need), groups, links
        )

    @property
    def total_size(self) -> int:
        return sum(self.sizes)

    def is_feasible_set(self, chosen: Sequence[int]) -> bool:
        """True when `chosen` respects the chains (each chain's chosen items form a tail, and a
        chain with a chosen item has every chain below it chosen whole)."""
        picked = set(chosen)
        for chain in self.chains:
            flags = [i in picked for i in chain]
            if any(flags) and not all(flags[flags.index(True) :]):
                return False
        for g, p in enumerate(self.parents):
            if p >= 0 and self.chains[p][-1] in picked and self.chains[g][0] not in picked:
                return False
        return True

    def cost_of(self, chosen: Sequence[int]) -> float:
        return math.fsum(self.costs[i] for i in chosen)

    def size_of(self, chosen: Sequence[int]) -> int:
        return sum(self.sizes[i] for i in chosen)


@dataclass(frozen=True, slots=True)
class CoverSolution:
    """chosen: item indices; covers: frees >= need (False only when even every item is too little).

    bound is a proven lower bound on the optimal cost: equal to `cost` when `optimal`.
    """

    chosen: tuple[int, ...]
    cost: float
    covers: bool
    optimal: bool
    bound: float
    method: str

    @property
    def gap(self) -> float:
        """Relative gap of `cost` over the proven bound (0 when optimal)."""
        return 0.0 if self.optimal else (self.cost - self.bound) / max(self.cost, 1e-12)


def _is_forest(parents: Sequence[int]) -> bool:
    n = len(parents)
    for g in range(n):
        seen, h = 0, g
        while h >= 0:
            if h >= n or seen > n:
                return False
            h, seen = parents[h], seen + 1
    return True
