"""Exact per-decision oracle: the least-expected-cost set of idle KV that frees the bytes asked.

The cost of evicting an entry is what PERC's score prices: P(resume within delta) x restore_us, with
P from the shared GapEstimator. The oracle solves that 0/1 covering knapsack exactly (policies/
knapsack.py). It runs as a policy (`policy=oracle`) or as a shadow (`policy.shadow_oracle=true`)
that lets another policy decide and scores each decision against the exact minimum. A shadow's
gap is per decision on the same state; it does not say what the oracle would have paid over a
run (the states diverge after the first different choice): that is `policy=oracle`'s realized cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cachepilot_sim.config import PolicyConfig
from cachepilot_sim.policies.base import CacheEntry, Chains, EvictionPolicy, KeyScope, register
from cachepilot_sim.policies.knapsack import CoverProblem, CoverSolution, solve_exact
from cachepilot_sim.policies.perc import PercPolicy
from cachepilot_sim.policies.reuse import GapEstimator


def expected_costs(
    estimator: GapEstimator, entries: Sequence[CacheEntry], now_us: int
) -> np.ndarray:
    """P(resume within delta) x restore_us per entry (µs), vectorised."""
    n = len(entries)
    gap = np.fromiter((e.gap_ema_us for e in entries), dtype=np.float64, count=n)
    idle = np.fromiter((now_us - e.last_used_us for e in entries), dtype=np.float64, count=n)
    restore = np.fromiter((e.restore_us for e in entries), dtype=np.float64, count=n)
    return estimator.resume_probabilities(gap, idle) * restore


def cover_problem(
    entries: Sequence[CacheEntry],
    costs: np.ndarray,
    bytes_needed: int,
    chains: Chains | None = None,
    parents: Sequence[int] | None = None,
) -> CoverProblem:
    """The decision as a covering knapsack over `entries`.

    chains: positions in `entries` grouped root first, where only a tail may be evicted (blocks
    of a prefix-sharing chain, as trace replay's KV manager passes them); None: one chain per
    entry (whole-session entries). parents: as in policies/base.py (a prefix tree's branches).
    """
    sizes = [max(e.num_bytes, 1) for e in entries]
    return CoverProblem.of(sizes, costs.tolist(), bytes_needed, chains, parents)


@register("oracle")
class OraclePolicy(PercPolicy):
    """Evicts the exact minimum-expected-cost cover; ranks (for traces) like PERC."""

    name = "oracle"
    key_scope = KeyScope.SET  # the exact cover needs every candidate

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        self.num_decisions = 0
        self.num_not_proven = 0
        self.worst_bound_gap = 0.0

    def solve(
        self,
        entries: Sequence[CacheEntry],
        bytes_needed: int,
        now_us: int,
        chains: Chains | None = None,
        parents: Sequence[int] | None = None,
    ) -> CoverSolution:
        """Exact least-expected-cost cover; `chains`, `parents` as in `cover_problem`."""
        costs = expected_costs(self.estimator, entries, now_us)
        return solve_exact(
            cover_problem(entries, costs, bytes_needed, chains, parents),
            self.cfg.oracle_time_limit_s,
        )

    def select_victims(
        self,
        entries: Sequence[CacheEntry],
        bytes_needed: int,
        now_us: int,
        chains: Chains | None = None,
        parents: Sequence[int] | None = None,
    ) -> list[CacheEntry]:
        if bytes_needed <= 0 or not entries:
            return []
        sol = self.solve(entries, bytes_needed, now_us, chains, parents)
        self.num_decisions += 1
        if not sol.optimal:
            self.num_not_proven += 1
            self.worst_bound_gap = max(self.worst_bound_gap, sol.gap)
        return [entries[i] for i in sol.chosen]

    def metrics(self) -> dict[str, float]:
        return {
            "oracle_decisions": self.num_decisions,
            "oracle_not_proven": self.num_not_proven,
            "oracle_worst_bound_gap": self.worst_bound_gap,
        }


class ShadowOracle:
    """Wraps a policy: it decides; every decision is scored against the exact minimum.

    Per decision: gap = policy's expected cost / oracle's - 1 (the oracle's floored at 1 µs), and
    whether the policy freed the bytes asked (or took every candidate when that is too little).
    """

    def __init__(self, inner: EvictionPolicy, estimator: GapEstimator, cfg: PolicyConfig) -> None:
        self.inner = inner
        self.name = inner.name
        self.key_scope = KeyScope.SET  # the oracle it scores against sees every candidate
        self.estimator = estimator
        self.oracle = OraclePolicy(cfg, estimator)
        self.gaps: list[float] = []
        self.policy_cost_us = 0.0
        self.oracle_cost_us = 0.0
        self.num_short = 0  # decisions that freed less than asked while more was available
        self.num_not_proven = 0

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return self.inner.key(entry, now_us)

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        self.inner.on_access(entry, now_us)

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        self.inner.on_release(entry, now_us)

    def on_evict(self, entry: CacheEntry, now_us: int) -> None:
        self.inner.on_evict(entry, now_us)

    def select_victims(
        self,
        entries: Sequence[CacheEntry],
        bytes_needed: int,
        now_us: int,
        chains: Chains | None = None,
        parents: Sequence[int] | None = None,
    ) -> list[CacheEntry]:
        # Score on the state the policy sees; the oracle must not change the policy's inputs.
        victims = self.inner.select_victims(entries, bytes_needed, now_us, chains, parents)
        if bytes_needed <= 0 or not entries:
            return victims
        costs = expected_costs(self.estimator, entries, now_us)
        best = solve_exact(
            cover_problem(entries, costs, bytes_needed, chains, parents),
            self.oracle.cfg.oracle_time_limit_s,
        )
        index = {e.entry_id: i for i, e in enumerate(entries)}
        chosen = [index[v.entry_id] for v in victims]
        paid = float(costs[chosen].sum()) if chosen else 0.0
        freed = sum(entries[i].num_bytes for i in chosen)
        if freed < bytes_needed and len(chosen) < len(entries):
            self.num_short += 1
        if not best.optimal:
            self.num_not_proven += 1
        self.policy_cost_us += paid
        self.oracle_cost_us += best.cost
        self.gaps.append(paid / max(best.cost, 1.0) - 1.0 if paid > best.cost else 0.0)
        return victims

    def metrics(self) -> dict[str, float]:
        gaps = np.array(self.gaps) if self.gaps else np.zeros(1)
        return self.inner.metrics() | {
            "shadow_decisions": len(self.gaps),
            "oracle_gap_mean": float(gaps.mean()),
            "oracle_gap_worst": float(gaps.max()),
            "oracle_gap_frac_suboptimal": float((gaps > 1e-9).mean()),
            "shadow_policy_expected_s": self.policy_cost_us / 1e6,
            "shadow_oracle_expected_s": self.oracle_cost_us / 1e6,
            "shadow_short_decisions": self.num_short,
            "shadow_not_proven": self.num_not_proven,
        }
