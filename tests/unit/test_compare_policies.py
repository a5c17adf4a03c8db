"""Policies compared as configured (issue 32): `policies.<name>.<field>=v` sets a compared policy's
own field inside a comparison, `policy=X policy.*` next to a `compare_policies` that names X
configures X there, and every setting that would be lost is refused in one line naming its key."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError, RunConfig, register_configs, to_config
from cachepilot_sim.experiment.lifecycle import refuse_ignored_overrides
from cachepilot_sim.experiment.outdir import run_id

register_configs()


def composed(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_config(*overrides: str) -> RunConfig:
    cfg = composed(*overrides)
    refuse_ignored_overrides(cfg, list(overrides))
    return to_config(cfg)


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        run_config(*overrides)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_compared_policy_takes_its_own_setting_and_the_others_keep_their_defaults() -> None:
    cfg = run_config("policies.marconi.flop_weight=2", "compare_policies=[marconi,lru]")
    marconi = cfg.sim_for("marconi", seed=0).policy
    assert marconi.name == "marconi" and getattr(marconi, "flop_weight") == 2.0  # noqa: B009
    assert cfg.sim_for("lru", seed=0).policy == run_config("policy=lru").policy


def test_shared_fields_still_apply_to_every_compared_policy() -> None:
    cfg = run_config(
        "policy.delta_s=60",
        "policies.slru.slru_protected_fraction=0.6",
        "compare_policies=[slru,lru]",
    )
    slru, lru = cfg.policy_for("slru"), cfg.policy_for("lru")
    assert slru.delta_s == lru.delta_s == 60.0
    assert getattr(slru, "slru_protected_fraction") == 0.6  # noqa: B009


def test_a_tuned_policy_compared_with_others_runs_as_configured() -> None:
    # The refused example: `policy=marconi policy.<field>=...` with the comparison given.
    cfg = run_config("policy=marconi", "policy.flop_weight=2", "compare_policies=[marconi,lru]")
    assert getattr(cfg.policy_for("marconi"), "flop_weight") == 2.0  # noqa: B009
    assert cfg.policy_names() == ["marconi", "lru"]


def test_choosing_a_policy_of_an_experiments_comparison_says_how_to_tune_it_there() -> None:
    message = refusal("+experiment=mixed_spike", "policy=perc")
    assert "policy=perc" in message and "policies.perc.<key>" in message
    assert "compare_policies=[perc]" in message


def test_the_same_field_set_two_ways_is_refused() -> None:
    message = refusal(
        "policy=slru",
        "policy.slru_protected_fraction=0.5",
        "policies.slru.slru_protected_fraction=0.6",
    )
    assert "policies.slru.slru_protected_fraction" in message and "set it once" in message


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["policies.marconi.flop_weight=2", "compare_policies=[perc,lru]"], "policies.marconi",
         "not compared"),
        (["policies.lru.flop_weight=2", "compare_policies=[marconi,lru]"],
         "policies.lru.flop_weight", "not a setting of policy 'lru'"),
        (["policies.marconi.delta_s=2", "compare_policies=[marconi,lru]"],
         "policies.marconi.delta_s", "policy.<key>"),
        (["policies.marconi.flop_weight=abc", "compare_policies=[marconi,lru]"],
         "policies.marconi.flop_weight", "could not be converted"),
        (["policies.marconi.flop_weight=-1", "compare_policies=[marconi,lru]"],
         "policies.marconi.flop_weight", ">= 0"),
        (["policies.nonesuch.x=1", "compare_policies=[marconi,lru]"], "policies.nonesuch",
         "unknown policy"),
    ],
)  # fmt: skip
def test_a_setting_that_would_be_lost_is_refused_naming_its_key(
    overrides: list[str], key: str, says: str
) -> None:
    message = refusal(*overrides)
    assert f"config key '{key}'" in message and says in message


def test_run_ids_change_with_a_setting_and_not_without_one() -> None:
    plain = run_config("compare_policies=[marconi,lru]")
    assert ", policies=" not in repr(plain)  # every run id from before the field is kept
    tuned = run_config("policies.marconi.flop_weight=2", "compare_policies=[marconi,lru]")
    retuned = run_config("policies.marconi.flop_weight=3", "compare_policies=[marconi,lru]")
    assert len({run_id(plain), run_id(tuned), run_id(retuned)}) == 3


@pytest.mark.parametrize(
    ("experiment", "table"),
    [("mooncake_synthetic", "mooncake_synthetic"), ("mixed_spike", "mixed_spike"),
     ("azure_conv", "mixed_spike")],
)  # fmt: skip
def test_each_compared_policy_gets_the_table_trained_on_the_experiments_workload(
    experiment: str, table: str
) -> None:
    # compare_policies=[all] on a Mooncake replay ran reuse_forecast with mixed_spike's table.
    cfg = run_config(f"+experiment={experiment}", "compare_policies=[all]")
    assert getattr(cfg.sim_for("reuse_forecast", 0).policy, "forecast_model") == table  # noqa: B009


def test_a_table_named_in_the_comparison_is_the_one_used() -> None:
    cfg = run_config(
        "+experiment=mooncake_synthetic", "policies.reuse_forecast.forecast_model=mixed_spike"
    )
    assert getattr(cfg.policy_for("reuse_forecast"), "forecast_model") == "mixed_spike"  # noqa: B009
    chosen = run_config(
        "policy=reuse_forecast", "policies.reuse_forecast.forecast_model=mooncake_synthetic"
    )  # the resolved default of policy= is not a second setting of the same field
    assert getattr(chosen.policy_for("reuse_forecast"), "forecast_model") == "mooncake_synthetic"  # noqa: B009


def test_a_synthetic_run_of_reuse_forecast_keeps_its_config_and_run_id() -> None:
    cfg = run_config("policy=reuse_forecast")
    assert "forecast_model='mixed_spike'" in repr(cfg)  # as before `auto`: the same run id
