"""Online estimate of when an idle session comes back: per-session EMA of idle gaps, population
prior.

The gap of a session is the time its KV sat idle between the end of one turn and the arrival of the
next (the user's think time plus client delays). A session with no history uses the population EMA.
The current idle time is a lower bound on the gap now in progress, so the rate used for a decision
is 1 / max(estimated gap, idle so far): a session idle far past its usual gap is treated as dormant.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np


class CacheEntry(Protocol):
    """What the estimator reads and updates of an idle entry (`base.CacheEntry`)."""

    gap_ema_us: float
    last_used_us: int


class GapEstimator:
    """EMA of observed gaps per session (kept on the entry) plus a population EMA."""

    def __init__(self, ema_weight: float, prior_gap_us: float, delta_us: float) -> None:
        self.ema_weight = ema_weight
        self.population_gap_us = prior_gap_us
        self.delta_us = delta_us

    def observe(self, entry: CacheEntry, gap_us: int) -> None:
        """Fold one observed idle gap into the session's and the population's EMA."""
        w = self.ema_weight
        gap = float(max(gap_us, 0))
        entry.gap_ema_us = gap if entry.gap_ema_us < 0 else (1 - w) * entry.gap_ema_us + w * gap
        self.population_gap_us = (1 - w) * self.population_gap_us + w * gap

    def gap_us(self, entry: CacheEntry, now_us: int) -> float:
        base = entry.gap_ema_us if entry.gap_ema_us >= 0 else self.population_gap_us
        return max(base, float(now_us - entry.last_used_us), 1.0)

    def resume_probability(self, entry: CacheEntry, now_us: int) -> float:
        """P(resume within delta) = 1 - exp(-lambda * delta), lambda = 1 / gap."""
        return -math.expm1(-self.delta_us / self.gap_us(entry, now_us))

    def resume_probabilities(self, gap_ema_us: np.ndarray, idle_us: np.ndarray) -> np.ndarray:
        """Vectorised `resume_probability` over many candidates."""
        base = np.where(gap_ema_us >= 0, gap_ema_us, self.population_gap_us)
        gap = np.maximum(np.maximum(base, idle_us), 1.0)
        return -np.expm1(-self.delta_us / gap)
