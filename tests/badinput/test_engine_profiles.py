"""An engine file states every key its engine reads (issue 30, item 2): its batching rules for
every engine, its step cost's terms, and its lazy captures' terms; an omitted one is an error
naming the key and the file, never the project's own engine's default. A hardware file states
every calibrated figure (never the H200's calibration). Each figure is physical and bounded."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError, register_configs, to_config
from cachepilot_sim.config.engine_profile import (
    ENGINE_RULE_KEYS,
    EngineConfig,
    GraphMode,
    StepCost,
    required_engine_keys,
)
from cachepilot_sim.config.store import REQUIRED_HARDWARE_KEYS, load_profile
from cachepilot_sim.experiment.lifecycle import checked_config

register_configs()
ENGINES = sorted(p.stem for p in (CONF_DIR / "engine").glob("*.yaml"))


@pytest.fixture(scope="module")
def conf_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conf") / "conf"
    shutil.copytree(CONF_DIR, out)
    return out


def _compose(conf: Path, overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _engine_section(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The file's YAML and its engine keys (a `# @package _global_` file nests them)."""
    data = yaml.safe_load((CONF_DIR / "engine" / f"{name}.yaml").read_text())
    return data, (data["engine"] if "engine" in data else data)


def _required(name: str) -> tuple[str, ...]:
    _, engine = _engine_section(name)
    return required_engine_keys(str(engine["step_cost"]), str(engine["graph_mode"]))


CASES = [(name, key) for name in ENGINES for key in _required(name)]


@pytest.mark.parametrize(("engine", "key"), CASES, ids=[f"{e}-{k}" for e, k in CASES])
def test_a_shipped_engine_file_without_a_key_it_reads_is_refused_naming_it(
    conf_copy: Path, engine: str, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data, section = _engine_section(engine)
    del section[key]
    text = (CONF_DIR / "engine" / f"{engine}.yaml").read_text()
    header = "# @package _global_\n" if text.startswith("# @package _global_") else ""
    (conf_copy / "engine" / f"{engine}_no_{key}.yaml").write_text(header + yaml.safe_dump(data))
    cfg = _compose(conf_copy, [f"engine={engine}_no_{key}"])
    with pytest.raises(SystemExit) as exit_:  # the run command's path: one line, exit 2
        checked_config(cfg, [], {"engine": f"{engine}_no_{key}"})
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line
    assert f"'engine.{key}'" in line and f"conf/engine/{engine}_no_{key}.yaml" in line, line


def test_every_engine_rule_is_required_of_every_engine() -> None:
    for cost in StepCost:
        for mode in GraphMode:
            assert set(ENGINE_RULE_KEYS) <= set(required_engine_keys(cost.name, mode.name))


def test_a_roofline_engine_may_omit_the_terms_it_never_reads(conf_copy: Path) -> None:
    _, section = _engine_section("default")
    assert "request_us" not in section and "gpu_profile" not in section
    run = to_config(_compose(conf_copy, ["engine=default"]))
    assert run.engine.request_us == 0.0 and run.engine.step_cost == StepCost.ROOFLINE


def test_an_override_to_a_fitted_cost_must_state_its_terms(conf_copy: Path) -> None:
    cfg = _compose(conf_copy, ["engine=vllm_v1", "engine.step_cost=FITTED"])
    with pytest.raises(ConfigError, match=r"'engine\.const_us' is not set"):
        to_config(cfg)


def test_an_override_to_lazy_graphs_must_state_the_capture_stall(conf_copy: Path) -> None:
    cfg = _compose(conf_copy, ["engine=hf_cb", "engine.graph_mode=LAZY"])
    with pytest.raises(ConfigError, match=r"'engine\.graph_capture_us' is not set"):
        to_config(cfg)


FITTED = {"step_cost": StepCost.FITTED, "request_us": 50.0, "fitted_on": "NVIDIA H200"}


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"request_us": 1e12}, "request_us"),  # beyond 10^9 us: a typo that overflows
        ({"request_us": math.inf}, "request_us"),
        ({"const_us": math.nan}, "const_us"),
        ({"q_shape_us": [100.0, math.inf]}, "q_shape_us"),
        ({"q_shape_us": [100.0, 0.0]}, "q_shape_us"),
        ({"fitted_on": ""}, "fitted_on"),  # a fitted cost names the GPU it was measured on
        ({"kv_pool_blocks": 2**40}, "kv_pool_blocks"),
        ({"q_pad_tokens": 2**40}, "q_pad_tokens"),
        ({"prompt_room_tokens": -1}, "prompt_room_tokens"),
        ({"graph_mode": GraphMode.LAZY, "graph_capture_us": 0}, "graph_capture_us"),
    ],
)
def test_an_unphysical_engine_term_is_refused_by_its_key(changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"'engine\.{key}'"):
        EngineConfig(**{**FITTED, **changes})


def test_a_physical_cost_without_attention_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'engine\.physical_attention_scale'"):
        EngineConfig(
            step_cost=StepCost.PHYSICAL,
            gpu_profile="x.json",
            physical_gemm_scale=1.0,
            fitted_on="NVIDIA H100",
        )


@pytest.mark.parametrize("key", REQUIRED_HARDWARE_KEYS)
def test_a_hardware_file_without_a_calibrated_figure_is_refused(tmp_path: Path, key: str) -> None:
    hardware = yaml.safe_load((CONF_DIR / "hardware" / "h200.yaml").read_text())
    del hardware[key]
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(hardware))
    with pytest.raises(ConfigError, match=rf"'hardware\.{key}' is not set \(in {path}\)"):
        load_profile("hardware", path)


def test_every_shipped_hardware_file_loads_as_a_profile() -> None:
    for path in sorted((CONF_DIR / "hardware").glob("*.yaml")):
        assert load_profile("hardware", path).hbm_bytes_per_us > 0
