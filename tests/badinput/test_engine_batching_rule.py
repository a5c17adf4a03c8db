"""A captured engine's batching rule is the engine's: a batcher choice it would override is refused
(run command and planner), never run under the engine's rule with the user's label on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError, register_configs, to_config
from cachepilot_sim.experiment.lifecycle import refuse_ignored_overrides
from cachepilot_sim.plan import Cell, load_plan
from cachepilot_sim.plan.search import compose_run

register_configs()
HF_CB = ["+experiment=smoke", "engine=hf_cb", "model=llama3_8b"]


def _compose(overrides: list[str]):  # noqa: ANN202
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("override", ["batcher=adaptive", "batcher=low_latency"])
def test_a_batcher_the_engine_profile_overrides_is_refused(override: str) -> None:
    overrides = [*HF_CB, override]
    node = _compose(overrides)
    assert str(node.batcher.mode).lower() == "max_throughput"  # the profile won: refuse
    with pytest.raises(ConfigError, match=rf"{override} is ignored: engine=hf_cb"):
        refuse_ignored_overrides(node, overrides)


def test_the_engines_own_batcher_and_the_default_engine_are_accepted() -> None:
    overrides = [*HF_CB, "batcher=max_throughput"]
    refuse_ignored_overrides(_compose(overrides), overrides)
    plain = ["+experiment=smoke", "batcher=low_latency"]
    refuse_ignored_overrides(_compose(plain), plain)


def test_a_captured_engine_in_another_batching_mode_is_refused() -> None:
    node = _compose([*HF_CB, "batcher.mode=ADAPTIVE"])  # a key override wins over the profile
    with pytest.raises(ConfigError, match=r"batcher\.mode.*one token budget"):
        to_config(node)


def test_a_plan_cell_whose_batcher_the_engine_overrides_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "name: t\nsimulation: ['+experiment=smoke', 'engine=hf_cb', 'model=llama3_8b']\n"
        "space: {gpus: [h200], policies: [mru], batchers: [adaptive]}\n"
    )
    plan = load_plan(path, [])
    cell = Cell("h200", 1, "mru", "least_outstanding", "adaptive", 0.0, "colocated")
    with pytest.raises(ConfigError, match=r"space\.batchers.*max_throughput"):
        compose_run(plan, cell, 1)
    ok = Cell("h200", 1, "mru", "least_outstanding", "max_throughput", 0.0, "colocated")
    assert str(compose_run(plan, ok, 1).batcher.mode) == "max_throughput"
