"""PERC variants: +1 (a 2-approximation of the 0/1 cover), hazard (survival-estimated resume
probability per workload class) and clairvoyant (fed each session's true next arrival).

All price an eviction as P(resume within delta) x restore_us and differ in P or in the selection.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cachepilot_sim.config import PolicyConfig, bounded
from cachepilot_sim.policies.base import CacheEntry, Chains, KeyScope, RankingPolicy, register
from cachepilot_sim.policies.hazard_curve import WindowSurvival
from cachepilot_sim.policies.hazard_index import HazardIndex, hazard_p
from cachepilot_sim.policies.knapsack import CoverProblem
from cachepilot_sim.policies.knapsack_greedy import greedy_by_ratio, greedy_plus_one
from cachepilot_sim.policies.lanes import Lane, LanedPolicy, Walk, in_lane
from cachepilot_sim.policies.oracle import cover_problem, expected_costs
from cachepilot_sim.policies.perc import PercPolicy
from cachepilot_sim.policies.plus1_chains import PlusOneChainIndex
from cachepilot_sim.policies.plus1_index import PlusOneIndex
from cachepilot_sim.policies.reuse import GapEstimator


@register("perc_plus1")
class PercPlusOnePolicy(PercPolicy):
    """Greedy by PERC's ratio, also trying to finish with the cheapest single covering entry."""

    name = "perc_plus1"
    key_scope = KeyScope.SET  # its own select: the +1 step looks at every entry
    # On whole entries the session manager keeps `time_index()` per restore regime, and that
    # index answers `select_victims` exactly (`policies/plus1_index.py`); on prefix chains the
    # prefix manager keeps the tails in `chain_index()` (`components/kv/plus1_tails.py`).
    key_scope_on_entries = KeyScope.DECISION

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
        costs = expected_costs(self.estimator, entries, now_us)
        problem = cover_problem(entries, costs, bytes_needed, chains, parents)
        if not problem.parents and all(len(c) == 1 for c in problem.chains):
            chosen = greedy_plus_one(problem)
        else:
            chosen = _plus_one_on_chains(problem)
        return [entries[i] for i in chosen]

    def time_index(self) -> PlusOneIndex:  # type: ignore[override]
        """An exact index of the whole decision over whole entries (`policies/plus1_index.py`)."""
        return PlusOneIndex(self.estimator)

    def chain_index(self) -> PlusOneChainIndex:
        """The chain tails of one restore regime by ratio and position, with the exact costs of
        a chained decision (`policies/plus1_chains.py`)."""
        return PlusOneChainIndex(self.estimator)


def _plus_one_on_chains(p: CoverProblem) -> list[int]:
    """Chained form: greedy by ratio over the current tails, or the cheapest tail of a single
    chain with nothing below it that covers the need alone, whichever costs less. No factor-2
    guarantee (docs/perc_proof.md section 6): it is the +1 idea carried over, not its proof."""
    best = greedy_by_ratio(p)
    best_cost = p.cost_of(best)
    has_below = set(p.parents)
    for g, chain in enumerate(p.chains):
        if g in has_below:
            continue
        size = 0
        for k in range(len(chain) - 1, -1, -1):
            size += p.sizes[chain[k]]
            if size >= p.need:
                tail = list(chain[k:])
                if p.cost_of(tail) < best_cost:
                    best, best_cost = tail, p.cost_of(tail)
                break
    return best


class SurvivalEstimate:
    """Kaplan-Meier estimate of the idle-gap distribution from returned and still-idle sessions.

    A session that has not come back is a censored observation at its idle time so far, so
    sessions that never return keep the survival curve above zero instead of being ignored.
    """

    def __init__(self, max_subjects: int) -> None:
        self.max_subjects = max_subjects
        # One record per gap (not per session: a session's finished gaps must stay observations
        # after its next turn starts a new one), oldest first: gap id -> [release_us, gap_us].
        self.released: OrderedDict[int, list[int]] = OrderedDict()
        self.open_gap: dict[int, int] = {}  # entry -> id of its gap in progress
        self._next_gap = 0

    def release(self, entry_id: int, now_us: int) -> None:
        self.open_gap[entry_id] = self._next_gap
        self.released[self._next_gap] = [now_us, -1]
        self._next_gap += 1
        while len(self.released) > self.max_subjects:
            self.released.popitem(last=False)

    def returned(self, entry_id: int, now_us: int) -> None:
        rec = self.released.get(self.open_gap.pop(entry_id, -1))
        if rec is not None and rec[1] < 0:
            rec[1] = now_us - rec[0]

    def curve(self, now_us: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Event times (ascending) and S just after each; None without any returned gap."""
        # Not scipy.stats.ecdf(CensoredData): the same curve (tests/unit/test_survival_estimate.py
        # checks it against scipy) at twice the cost, and this runs inside eviction decisions.
        if not self.released:
            return None
        recs = np.array(list(self.released.values()), dtype=np.int64)
        event = recs[:, 1] >= 0
        if not event.any():
            return None
        dur = np.where(event, recs[:, 1], now_us - recs[:, 0])
        order = np.lexsort((~event, dur))  # events before censorings at equal times
        dur, event = dur[order], event[order]
        at_risk = len(dur) - np.arange(len(dur))
        factors = np.where(event, 1.0 - 1.0 / at_risk, 1.0)
        surv = np.cumprod(factors)
        times, surv = dur[event].astype(np.float64), surv[event]
        last = np.append(times[1:] != times[:-1], True)  # one point per distinct event time
        return times[last], surv[last]


@dataclass
class PercHazardConfig(PolicyConfig):
    """PERC-hazard's knob: idle gaps kept per workload class for the survival estimate (oldest
    dropped)."""

    name: str = "perc_hazard"
    hazard_max_gaps: int = bounded(512, gt=0)


@register("perc_hazard", config=PercHazardConfig)
class PercHazardPolicy(RankingPolicy):
    """PERC with P(resume within delta | idle t) = 1 - S(t + delta) / S(t) per workload class."""

    name = "perc_hazard"
    key_scope = KeyScope.DECISION  # a key per entry, from state shared by the decision

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, PercHazardConfig), type(cfg)  # the registry pairs them
        self.max_gaps = cfg.hazard_max_gaps
        # Per class: `SurvivalEstimate`'s window and curve, without a sort per curve.
        self.classes: dict[int, WindowSurvival] = {}
        self.version = 0  # counts releases and returns: the curves at a time change with it
        # (now, version) -> class -> its curve: the keys of one decision share them.
        self._curves: tuple[tuple[int, int], dict[int, Any]] = ((-1, -1), {})

    def _estimate(self, class_index: int) -> WindowSurvival:
        if class_index not in self.classes:
            self.classes[class_index] = WindowSurvival(self.max_gaps)
        return self.classes[class_index]

    def on_release(self, entry: CacheEntry, now_us: int) -> None:
        self.version += 1
        self._estimate(entry.class_index).release(entry.entry_id, now_us)

    def on_access(self, entry: CacheEntry, now_us: int) -> None:
        self.version += 1
        self._estimate(entry.class_index).returned(entry.entry_id, now_us)

    def curve(self, class_index: int, now_us: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The class's survival curve at `now_us`, computed once per (now, version)."""
        at, cache = self._curves
        if at != (now_us, self.version):
            cache = {}
            self._curves = ((now_us, self.version), cache)
        if class_index not in cache:
            cache[class_index] = self._estimate(class_index).curve(now_us)
        curve: tuple[np.ndarray, np.ndarray] | None = cache[class_index]
        return curve

    def probabilities(self, entries: Sequence[CacheEntry], now_us: int) -> np.ndarray:
        """Per entry; the exponential EMA model stands in until its class has a returned gap."""
        out = np.empty(len(entries))
        delta = self.estimator.delta_us
        for ci in sorted({e.class_index for e in entries}):
            idx = [i for i, e in enumerate(entries) if e.class_index == ci]
            curve = self.curve(ci, now_us)
            if curve is None:
                out[idx] = [self.estimator.resume_probability(entries[i], now_us) for i in idx]
                continue
            idle = np.array([now_us - entries[i].last_used_us for i in idx], dtype=np.float64)
            out[idx] = hazard_p(*curve, idle, delta)
        return out

    def order(self, entries: Sequence[CacheEntry], now_us: int) -> list[CacheEntry]:
        p = self.probabilities(entries, now_us)
        score = [p[i] * e.restore_us / max(e.num_bytes, 1) for i, e in enumerate(entries)]
        ranked = sorted(range(len(entries)), key=lambda i: (score[i], entries[i].entry_id))
        return [entries[i] for i in ranked]

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        p = float(self.probabilities([entry], now_us)[0])
        return (p * entry.restore_us / max(entry.num_bytes, 1), entry.entry_id)

    def time_index(self) -> HazardIndex:
        """An exact index of this key (`policies/hazard_index.py`)."""
        return HazardIndex(self)


@register("perc_clairvoyant")
class PercClairvoyantPolicy(LanedPolicy, RankingPolicy):
    """PERC with the true next arrival: P is 1 when it falls within delta, else 0; among the rest,
    the session returning last goes first (Belady's rule). An upper bound on better prediction."""

    name = "perc_clairvoyant"
    key_scope = KeyScope.DECISION

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return self.key_at(entry, entry.restore_us, now_us)

    def key_at(self, entry: CacheEntry, restore_us: float, now_us: int) -> tuple[float | int, ...]:
        if entry.next_arrival_us < 0:
            return (0.0, -float("inf"), entry.entry_id)
        until = max(entry.next_arrival_us - now_us, 0)
        p = 1.0 if until <= self.estimator.delta_us else 0.0
        return (p * restore_us / max(entry.num_bytes, 1), -float(until), entry.entry_id)

    def lane(self, entry: CacheEntry, restore_us: float, now_us: int) -> Lane:
        """No known arrival: lane 0, keyed by id alone (its order is its key). Beyond δ (P = 0):
        lane 1 by the latest arrival, until it comes within δ; then lane 2 by (restore / bytes,
        latest arrival) until it is due; then lane 3, whose key (restore / bytes, time to arrival
        0, id) is its order."""
        eid, arrival = entry.entry_id, entry.next_arrival_us
        if arrival < 0:
            return in_lane(0, (0.0, -math.inf, eid), Walk.STATIC)
        near_us = arrival - math.floor(self.estimator.delta_us)  # from then on, until <= delta
        if now_us < near_us:
            return in_lane(1, (-arrival, eid), until_us=near_us)
        weight = 1.0 * restore_us / max(entry.num_bytes, 1)  # as the key computes it (p = 1)
        if now_us <= arrival:
            return in_lane(2, (weight, -arrival, eid), until_us=arrival + 1)
        return in_lane(3, (weight, -0.0, eid), Walk.STATIC)
