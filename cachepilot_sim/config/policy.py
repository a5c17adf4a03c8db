"""The eviction policy's config: what every policy run reads, and the registry of policies.

`PolicyConfig` holds the fields every run reads whichever policy ranks: the reuse estimator that
the KV manager feeds and prices evictions with (delta_s, ema_weight, prior_gap_s) and the shadow
oracle that can score any policy's decisions. A policy with its own knobs declares a subclass next
to its code and registers it (`@register("slru", config=SlruConfig)` in policies/), so
`policy=lru policy.slru_protected_fraction=0.5` is an unknown key, not a silently ignored one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from cachepilot_sim.config.base import Sealed, bounded
from cachepilot_sim.config.registry import Registry

if TYPE_CHECKING:
    from cachepilot_sim.config.workload import ReplayConfig

ALL_POLICIES = "all"  # compare_policies: [all] runs every registered policy


@dataclass
class PolicyConfig(Sealed):
    """Which eviction policy runs, with the fields every policy run reads."""

    section: ClassVar[str | None] = "policy"
    name: str = "perc"
    # The shared reuse estimator (policies/reuse.py): horizon, EMA weight, population prior.
    delta_s: float = bounded(30.0, gt=0)
    ema_weight: float = bounded(0.3, gt=0, le=1)
    prior_gap_s: float = bounded(20.0, gt=0)
    # Shadow: score every decision of the running policy against the exact oracle, whose HiGHS
    # time limit per decision is oracle_time_limit_s (policy=oracle uses the same limit).
    shadow_oracle: bool = False
    oracle_time_limit_s: float = bounded(1.0, gt=0)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        POLICIES.check(f"{prefix}.name", self)

    def for_workload(self, replay: ReplayConfig) -> PolicyConfig:
        """This config for a run whose requests come from `replay` (SimConfig calls it as it
        is built): a policy with a setting that depends on the workload (a table trained on
        it) resolves it here; the others are as they are."""
        return self


# Filled by policies/ (each module registers its policies when imported); the factory's type,
# (PolicyConfig, GapEstimator) -> EvictionPolicy, is policies.base.PolicyFactory.
POLICIES: Registry[PolicyConfig, Any] = Registry(
    "eviction policy", "policy", PolicyConfig, provider="cachepilot_sim.policies"
)


def known_policies() -> list[str]:
    return POLICIES.names()


def policy_config(name: str, **values: Any) -> PolicyConfig:
    """The registered config class of policy `name`, built with `values` (validated)."""
    return POLICIES.entry(name).config(name=name, **values)
