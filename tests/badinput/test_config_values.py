"""Every numeric config key refuses NaN and negative values (where a sign makes no sense), naming
the key; unknown keys and ignored choices are refused too (issue 15). In-process (compose and
to_config), the path `python -m cachepilot_sim` takes before anything is written."""

from __future__ import annotations

from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError, register_configs, to_config
from cachepilot_sim.config.store import fill_unread_engine_keys
from cachepilot_sim.experiment.lifecycle import refuse_ignored_overrides

CONF = CONF_DIR
register_configs()


def _compose(*overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _numeric_keys() -> list[str]:
    def leaves(node: dict, prefix: str = "") -> list[str]:
        out = []
        for k, v in node.items():
            if isinstance(v, dict):
                out += leaves(v, f"{prefix}{k}.")
            elif isinstance(v, int | float) and not isinstance(v, bool):
                out.append(f"{prefix}{k}")
        return out

    cfg = _compose()
    fill_unread_engine_keys(cfg.engine)  # the keys engine=default does not read, still numeric
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return leaves(container)


KEYS = _numeric_keys()
SIGNED = ("priority",)  # an ordering, not a quantity: any integer is meaningful


def _refused(*overrides: str) -> str:
    with pytest.raises((ConfigError, HydraException, OmegaConfBaseException)) as err:
        cfg = _compose(*overrides)
        refuse_ignored_overrides(cfg, list(overrides))
        to_config(cfg)
    return str(err.value)


def test_the_key_list_covers_every_section() -> None:
    sections = {k.split(".")[0] for k in KEYS}
    assert {"seed", "vram_gb", "kv", "scheduler", "workload", "replay", "model"} <= sections
    assert len(KEYS) >= 90


@pytest.mark.parametrize("key", KEYS)
def test_nan_is_refused_naming_the_key(key: str) -> None:
    assert key.split(".")[-1] in _refused(f"{key}=nan")


@pytest.mark.parametrize("key", [k for k in KEYS if not k.endswith(SIGNED)])
def test_a_negative_value_is_refused_naming_the_key(key: str) -> None:
    assert key.split(".")[-1] in _refused(f"{key}=-1")


OTHER_BAD = [
    ("seed=-1", "seed"),
    ("seed=1.5", "seed"),
    ("+foo=1", "foo"),
    ("+workload.foo=2", "foo"),
    ("+kv.nonsense=true", "nonsense"),
    ("scheduler.queue_timeout_s=4e-7", "queue_timeout_s"),
    ("scheduler.queue_timeout_s=1e-9", "queue_timeout_s"),
    ("replay.time_scale=0", "time_scale"),
    ("replay.time_scale=inf", "time_scale"),
    ("vram_gb=1e400", "vram_gb"),
    ("policy=nonesuch", "policy"),
    ("policy.name=belady2", "belady2"),
    ("seeds=0", "seeds"),
    ("replay.format=PARQUET", "format"),
    ("replay.on_error=IGNORE", "on_error"),
    ("cluster.replicas=0", "cluster.replicas"),
    ("cluster.replicas=2.5", "cluster.replicas"),
    ("cluster.prefill_replicas=2", "cluster.decode_replicas"),
    ("cluster.decode_replicas=2", "cluster.prefill_replicas"),
    ("cluster.cross_node_link=ethernet", "cross_node_link"),
    ("router=nonesuch", "router"),
    ("router.name=nonesuch", "router.name"),
    ("router=round_robin router.cache_threshold=0.3", "cache_threshold"),
    ("router=prefix_aware router.cache_threshold=2", "router.cache_threshold"),
    # A session workload's KV is keyed by session id: turns of a session must stay on a replica.
    ("cluster.replicas=2 router=round_robin", "router.name"),
]


@pytest.mark.parametrize(("override", "named"), OTHER_BAD)
def test_other_bad_values_are_refused_naming_the_key(override: str, named: str) -> None:
    assert named in _refused(*override.split())


@pytest.mark.parametrize("policy", ["lru", "perc", "priority"])
def test_policy_choice_ignored_by_compare_policies_is_refused(policy: str) -> None:
    message = _refused("+experiment=mixed_spike", f"policy={policy}")
    assert f"policy={policy}" in message and "compare_policies" in message


def test_compare_policies_empty_runs_the_chosen_policy() -> None:
    cfg = _compose("+experiment=mixed_spike", "policy=lru", "compare_policies=[]")
    refuse_ignored_overrides(cfg, ["policy=lru", "compare_policies=[]"])
    assert to_config(cfg).policy_names() == ["lru"]
