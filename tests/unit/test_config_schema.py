"""The registries are the config schema: a policy's or controller's YAML picks its registered
class, a field of another choice is an unknown key, and bounds come from field metadata."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import (
    ADMISSION,
    POLICIES,
    ConfigError,
    KVConfig,
    PolicyConfig,
    Registry,
    RunConfig,
    bounded,
    register_configs,
    to_config,
)
from cachepilot_sim.policies.classic import SlruConfig
from cachepilot_sim.policies.utility import MarconiConfig

ROOT = Path(__file__).resolve().parents[2]
CONF = CONF_DIR
PACKAGE = ROOT / "cachepilot_sim"
POLICY_YAMLS = sorted(p.stem for p in (CONF / "policy").glob("*.yaml"))
ADMISSION_YAMLS = sorted(p.stem for p in (CONF / "admission").glob("*.yaml"))

register_configs()


def compose_run(*overrides: str):  # noqa: ANN201
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_every_registered_choice_has_a_yaml_and_every_yaml_a_registered_choice() -> None:
    assert POLICY_YAMLS == POLICIES.names()
    assert ADMISSION_YAMLS == ADMISSION.names()


@pytest.mark.parametrize("name", POLICY_YAMLS)
def test_every_policy_yaml_composes_to_its_registered_class(name: str) -> None:
    cfg = to_config(compose_run(f"policy={name}"))
    assert type(cfg.policy) is POLICIES.entry(name).config
    assert cfg.policy.name == name


@pytest.mark.parametrize("name", ADMISSION_YAMLS)
def test_every_admission_yaml_composes_to_its_registered_class(name: str) -> None:
    cfg = to_config(
        compose_run(
            f"admission={name}",
            "admission.weights=w.npz" if name == "learned" else f"admission.name={name}",
        )
    )
    assert type(cfg.admission) is ADMISSION.entry(name).config
    assert cfg.admission.name == name


def test_another_policys_field_is_an_unknown_key_at_compose() -> None:
    with pytest.raises(ConfigCompositionException, match=r"override 'policy\.flop_weight'"):
        compose_run("policy=lru", "policy.flop_weight=9")
    cfg = to_config(compose_run("policy=marconi", "policy.flop_weight=9"))
    assert isinstance(cfg.policy, MarconiConfig) and cfg.policy.flop_weight == 9.0


def test_another_controllers_field_is_an_unknown_key_at_compose() -> None:
    with pytest.raises(ConfigCompositionException, match=r"'admission\.threshold_queue_depth'"):
        compose_run("admission=all", "admission.threshold_queue_depth=3")


def test_renaming_the_choice_without_its_yaml_is_refused_by_to_config() -> None:
    with pytest.raises(ConfigError, match=r"^config key 'policy\.name' = 'marconi': .*Marconi"):
        to_config(compose_run("policy=lru", "policy.name=marconi"))
    with pytest.raises(ConfigError, match=r"'policy\.name' = 'belady2': unknown eviction policy"):
        to_config(compose_run("policy.name=belady2"))


def test_cli_rejects_another_policys_field_naming_the_key(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "policy=lru",
            "policy.flop_weight=9",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1  # one line, naming the key (issue 15)
    assert "Could not override 'policy.flop_weight'" in proc.stderr
    assert not (tmp_path / "metrics.json").exists()


def test_compared_policies_get_their_own_config_and_share_the_common_fields() -> None:
    cfg = to_config(
        compose_run(
            "policy=marconi",
            "policy.flop_weight=3",
            "policy.delta_s=12",
            "policy.shadow_oracle=true",
            "compare_policies=[marconi,slru,lru]",
        )
    )
    marconi, slru, lru = (cfg.sim_for(n, 0).policy for n in ("marconi", "slru", "lru"))
    assert isinstance(marconi, MarconiConfig) and marconi.flop_weight == 3.0
    assert isinstance(slru, SlruConfig) and slru.slru_protected_fraction == 0.8
    assert type(lru) is PolicyConfig
    assert {(p.delta_s, p.shadow_oracle) for p in (marconi, slru, lru)} == {(12.0, True)}


def test_compare_all_runs_every_registered_policy() -> None:
    cfg = to_config(compose_run("compare_policies=[all]"))
    assert cfg.policy_names() == POLICIES.names()
    assert [type(cfg.sim_for(n, 0).policy) for n in POLICIES.names()] == [
        POLICIES.entry(n).config for n in POLICIES.names()
    ]


def test_field_metadata_bounds_name_the_full_key_and_value() -> None:
    with pytest.raises(ConfigError, match=r"'kv\.watermark_fraction' = 0\.5: .*< 0\.5"):
        KVConfig(watermark_fraction=0.5)
    with pytest.raises(ConfigError, match=r"'policy\.slru_protected_fraction' = 1\.5"):
        SlruConfig(slru_protected_fraction=1.5)
    with pytest.raises(ConfigError, match=r"'seeds' = 0"):
        RunConfig(seeds=0)
    with pytest.raises(ConfigError, match=r"'policy\.ema_weight' = nan"):
        PolicyConfig(ema_weight=float("nan"))


def test_bounded_refuses_metadata_it_does_not_check() -> None:
    with pytest.raises(TypeError, match="minimum"):
        bounded(1, minimum=0)


def test_registry_rejects_duplicates_and_foreign_config_classes() -> None:
    @dataclass
    class Other(KVConfig):
        pass

    registry: Registry[PolicyConfig, object] = Registry("eviction policy", "policy", PolicyConfig)
    registry.add("a", object())
    with pytest.raises(ValueError, match="'a' is already registered"):
        registry.add("a", object())
    with pytest.raises(TypeError, match="does not derive from PolicyConfig"):
        registry.add("b", object(), Other)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown eviction policy 'c'; known: \['a'\]"):
        registry.entry("c")


def _function_level_package_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "cachepilot_sim"
                ):
                    found.append(f"{path.name}:{node.lineno} {node.module}")
    return found


def _module_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


def test_config_and_policies_import_one_way_without_hidden_imports() -> None:
    files = [
        *(PACKAGE / "config").glob("*.py"),
        *(PACKAGE / "policies").glob("*.py"),
        *(PACKAGE / "admission").glob("*.py"),
    ]
    assert [hit for f in files for hit in _function_level_package_imports(f)] == []
    for f in (PACKAGE / "config").glob("*.py"):
        imported = _module_imports(f)
        assert not any(
            m.startswith(("cachepilot_sim.policies", "cachepilot_sim.admission")) for m in imported
        ), f
