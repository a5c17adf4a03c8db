"""Adding a policy is one module + one import + one YAML: a toy policy declared and registered
here only (its YAML written to a temporary config dir) composes through Hydra and runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import POLICIES, PolicyConfig, bounded, register_configs, to_config
from cachepilot_sim.policies import CacheEntry, RankingPolicy, register
from cachepilot_sim.policies.reuse import GapEstimator
from cachepilot_sim.sim import build

CONF = CONF_DIR


@dataclass
class ToyConfig(PolicyConfig):
    """The toy's own knob: evict the largest entries first when true."""

    name: str = "toy_largest"
    largest_first: bool = True
    weight: float = bounded(1.0, gt=0)


class ToyPolicy(RankingPolicy):
    """Largest (or smallest) entry first."""

    name = "toy_largest"

    def __init__(self, cfg: PolicyConfig, estimator: GapEstimator) -> None:
        super().__init__(cfg, estimator)
        assert isinstance(cfg, ToyConfig)
        self.sign = -1 if cfg.largest_first else 1

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (self.sign * entry.num_bytes, entry.entry_id)


TOY_YAML = """defaults:
  - /policy_schema/toy_largest@_here_
  - _self_
name: toy_largest
largest_first: true
"""


@pytest.fixture
def toy_registered(tmp_path: Path) -> Iterator[Path]:
    """Registers the toy (as its module's decorator would) and writes its YAML; undone after."""
    register("toy_largest", config=ToyConfig)(ToyPolicy)
    register_configs()
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "toy_largest.yaml").write_text(TOY_YAML)
    try:
        yield tmp_path
    finally:
        POLICIES.remove("toy_largest")


def compose_toy(search_dir: Path, *overrides: str):  # noqa: ANN201
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            config_name="config",
            overrides=[f"hydra.searchpath=[file://{search_dir}]", "+experiment=smoke", *overrides],
        )


def test_a_toy_policy_composes_validates_and_runs(toy_registered: Path) -> None:
    cfg = to_config(
        compose_toy(
            toy_registered,
            "policy=toy_largest",
            "policy.weight=2",
            "compare_policies=[toy_largest,lru]",
            "workload.num_requests=30",
            "vram_gb=9.6",
            "trace.enabled=false",
        )
    )
    assert isinstance(cfg.policy, ToyConfig) and cfg.policy.weight == 2.0
    result = build(cfg.sim_for("toy_largest", 0)).run()
    req = result.requests
    assert req.height == 30 and set(req["outcome"].unique()) <= {"completed", "rejected"}
    assert result.metrics["policy"] == "toy_largest" and result.metrics["evictions"] > 0
    with pytest.raises(ConfigCompositionException, match=r"'policy\.weight'"):
        compose_toy(toy_registered, "policy=lru", "policy.weight=2")
