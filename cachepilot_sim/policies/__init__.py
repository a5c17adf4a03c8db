"""Eviction policies: the protocol and registry (base.py) and one module per registered policy."""

from cachepilot_sim.policies import lru, perc, priority  # noqa: F401  (registers the policies)
from cachepilot_sim.policies.base import (
    CacheEntry,
    EvictionPolicy,
    RankingPolicy,
    known_policies,
    make_policy,
    register,
)
from cachepilot_sim.policies.reuse import GapEstimator

__all__ = [
    "CacheEntry",
    "EvictionPolicy",
    "GapEstimator",
    "RankingPolicy",
    "known_policies",
    "make_policy",
    "register",
]
