"""The policy lab on prefix chains (Mooncake sample): stateful baselines get their hooks and are
deterministic, the oracle and the shadow oracle decide on the chains, a bad selection is refused."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cachepilot_sim.components.kv.tails import TailIndex
from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    ReplayConfig,
    TraceConfig,
    TraceFormat,
    policy_config,
)
from cachepilot_sim.policies import CacheEntry, KeyScope
from cachepilot_sim.policies.classic import ArcPolicy, GdsfPolicy
from cachepilot_sim.policies.lru import LruPolicy
from cachepilot_sim.sim import Simulation, build
from tests.conftest import make_sim_config

SAMPLE = "samples:mooncake_synthetic/synthetic_trace.jsonl"


def make_replay(policy: str, offload: bool = True, shadow: bool = False) -> Simulation:
    """The Mooncake sample with a 96-block prefix cache: hundreds of chained eviction decisions."""
    cfg = make_sim_config(
        vram_gb=141.0,
        model=ModelConfig(max_context_tokens=262_144),
        policy=policy_config(policy, shadow_oracle=shadow),
        trace=TraceConfig(enabled=False),
        kv=KVConfig(offload_enabled=offload, cpu_store_bytes=32 * 64 * 1024 * 1024),
        replay=ReplayConfig(format=TraceFormat.MOONCAKE, path=SAMPLE, prefix_cache_max_blocks=96),
    )
    return build(cfg)


@pytest.mark.parametrize("policy", ["arc", "slru", "gdsf", "perc_hazard", "wild", "fifo"])
def test_stateful_baselines_are_deterministic_on_replay(policy: str) -> None:
    first, second = make_replay(policy).run(), make_replay(policy).run()
    assert first.metrics == second.metrics
    assert first.requests.equals(second.requests)
    assert first.metrics["prefix_cap_evictions"] > 0


def test_arc_and_gdsf_learn_from_block_evictions_and_accesses() -> None:
    arc_sim, gdsf_sim = make_replay("arc"), make_replay("gdsf")
    arc_sim.run()
    gdsf_sim.run()
    arc, gdsf = arc_sim.policy, gdsf_sim.policy
    assert isinstance(arc, ArcPolicy) and isinstance(gdsf, GdsfPolicy)
    assert arc.frequent and (arc.ghost1 or arc.ghost2)  # hits promoted, victims remembered
    assert arc.ghost_bytes == [sum(arc.ghost1.values()), sum(arc.ghost2.values())]
    assert gdsf.inflation > 0  # victims raised L: idle blocks age


def test_oracle_and_shadow_decide_on_chains() -> None:
    oracle = make_replay("oracle", shadow=True).run().metrics
    assert oracle["oracle_decisions"] > 0 and oracle["shadow_decisions"] > 0
    assert oracle["oracle_gap_worst"] < 1e-9 and oracle["shadow_short_decisions"] == 0
    lru = make_replay("lru", shadow=True).run().metrics
    assert lru["shadow_decisions"] > 0 and lru["shadow_short_decisions"] == 0
    assert lru["oracle_gap_mean"] >= 0.0
    assert lru["shadow_oracle_expected_s"] <= lru["shadow_policy_expected_s"] * (1 + 1e-9)


class _CutsRoots(LruPolicy):
    """Breaks the contract: evicts chain roots. It selects by its own rule, so it must see the whole
    set (a ranking index would never ask it)."""

    key_scope = KeyScope.SET

    def select_victims(
        self,
        entries: Sequence[CacheEntry],
        bytes_needed: int,
        now_us: int,
        chains: Sequence[Sequence[int]] | None = None,
        parents: Sequence[int] | None = None,
    ) -> list[CacheEntry]:
        assert chains is not None
        return [entries[c[0]] for c in chains if len(c) > 1][:1] or [entries[chains[0][-1]]]


def test_a_selection_that_is_not_a_tail_is_refused() -> None:
    sim = make_replay("lru", offload=False)
    bad = _CutsRoots(sim.policy.cfg, sim.estimator)  # type: ignore[attr-defined]
    sim.policy = sim.kv.policy = bad
    sim.kv.tails = TailIndex(sim.kv.tree, bad)  # the manager's index follows its policy
    with pytest.raises(ValueError, match="not tails"):
        sim.run()
