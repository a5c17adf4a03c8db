"""Eviction policies: the protocol and registry (base.py) and one module per registered policy."""

from cachepilot_sim.config.policy import known_policies
from cachepilot_sim.policies import (  # noqa: F401  (registers the policies)
    classic,
    lrb,
    lru,
    mru,
    oracle,
    perc,
    perc_variants,
    priority,
    reuse_forecast,
    s3fifo,
    sieve,
    utility,
)
from cachepilot_sim.policies.base import (
    CacheEntry,
    Chains,
    EvictionPolicy,
    KeyScope,
    RankingPolicy,
    make_policy,
    register,
)
from cachepilot_sim.policies.reuse import GapEstimator

__all__ = [
    "CacheEntry",
    "Chains",
    "EvictionPolicy",
    "GapEstimator",
    "KeyScope",
    "RankingPolicy",
    "known_policies",
    "make_policy",
    "register",
]
