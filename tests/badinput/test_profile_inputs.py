"""GPU, model, hardware and engine profiles are schemas (issue 30): a GPU file states every
datasheet figure (an omitted one, or an empty file, no longer runs as the H200), and every figure
is physical: bandwidths and costs > 0 and finite, a KV element of 1, 2 or 4 bytes, no more KV
heads than query heads, TP within a node; a figure that would overflow is refused by its key."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError, register_configs, to_config
from cachepilot_sim.config.engine_profile import EngineConfig, StepCost
from cachepilot_sim.config.store import REQUIRED_GPU_KEYS
from cachepilot_sim.tools import scorecard
from tests.badinput.refusal import assert_refused

register_configs()


@pytest.fixture(scope="module")
def conf_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conf") / "conf"
    shutil.copytree(CONF_DIR, out)
    return out


def _compose(conf: Path, overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=overrides))


def _gpu_file(conf: Path, file_name: str, **changes: Any) -> str:
    gpu = yaml.safe_load((CONF_DIR / "gpu" / "l40s.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            del gpu[key]
        else:
            gpu[key] = value
    (conf / "gpu" / f"{file_name}.yaml").write_text(yaml.safe_dump(gpu))
    return file_name


@pytest.mark.parametrize("key", REQUIRED_GPU_KEYS)
def test_a_gpu_file_without_a_datasheet_figure_is_refused_not_the_h200s(
    conf_copy: Path, key: str
) -> None:
    name = _gpu_file(conf_copy, f"no_{key}", **{key: None})
    with pytest.raises(ConfigError, match=rf"gpu\.{key}.*conf/gpu"):
        _compose(conf_copy, [f"gpu={name}", "vram_gb=40"])


def test_an_empty_gpu_file_is_refused(conf_copy: Path) -> None:
    (conf_copy / "gpu" / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(ConfigError, match=r"required key 'gpu\."):
        _compose(conf_copy, ["gpu=empty", "vram_gb=40"])


def test_every_shipped_gpu_file_states_every_required_key() -> None:
    for path in sorted((CONF_DIR / "gpu").glob("*.yaml")):
        assert set(REQUIRED_GPU_KEYS) <= set(yaml.safe_load(path.read_text())), path


FIGURES: list[tuple[str, str]] = [
    ("gpu.hbm_gbps=0", "gpu.hbm_gbps"),
    ("gpu.hbm_gbps=-4800", "gpu.hbm_gbps"),
    ("gpu.hbm_gbps=1e300", "gpu.hbm_gbps"),
    ("gpu.hbm_gb=1e300", "gpu.hbm_gb"),
    ("gpu.bf16_dense_tflops=0", "gpu.bf16_dense_tflops"),
    ("gpu.interconnect_gbps=0", "gpu.interconnect_gbps"),
    ("gpu.interconnect_gbps=1e300", "gpu.interconnect_gbps"),
    ("gpu.pcie_lanes=1000000", "gpu.pcie_lanes"),
    ("hardware.hbm_bytes_per_us=1e300", "hardware.hbm_bytes_per_us"),
    ("hardware.pcie_h2d_bytes_per_us=1e300", "hardware.pcie_h2d_bytes_per_us"),
    ("hardware.step_overhead_us=1e300", "hardware.step_overhead_us"),
    ("model.kv_dtype_bytes=3", "model.kv_dtype_bytes"),
    ("model.kv_dtype_bytes=8", "model.kv_dtype_bytes"),
    ("model.num_kv_heads=64", "model.num_kv_heads"),
    ("model.num_layers=1180591620717411303424", "model.num_layers"),
    ("model.weight_bytes=1180591620717411303424", "model.weight_bytes"),
    ("model.head_dim=10000000", "model.head_dim"),
    ("tp=16", "tp"),
]


@pytest.mark.parametrize(("override", "key"), FIGURES, ids=[f[0] for f in FIGURES])
def test_an_unphysical_figure_is_refused_naming_its_key(
    conf_copy: Path, override: str, key: str
) -> None:
    with pytest.raises(ConfigError, match=rf"'{key}'"):
        _compose(conf_copy, [override])


@pytest.mark.parametrize("key", ["name", "step_cost"])
def test_an_engine_file_without_its_name_or_step_cost_is_refused(conf_copy: Path, key: str) -> None:
    engine = {"name": "mine", "step_cost": "ROOFLINE"}
    del engine[key]
    (conf_copy / "engine" / f"no_{key}.yaml").write_text(yaml.safe_dump(engine))
    with pytest.raises(ConfigError, match=rf"engine\.{key}.*conf/engine"):
        _compose(conf_copy, [f"engine=no_{key}"])


def test_a_fitted_step_cost_of_zeros_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'engine.step_cost'.*positive coefficient"):
        EngineConfig(step_cost=StepCost.FITTED)
    fitted = EngineConfig(step_cost=StepCost.FITTED, request_us=50.0, fitted_on="NVIDIA H200")
    assert fitted.request_us == 50.0


def test_the_shipped_engine_profiles_still_compose(conf_copy: Path) -> None:
    for path in sorted((CONF_DIR / "engine").glob("*.yaml")):
        measured_on_h100 = "physical" in path.stem or path.stem.endswith("_h100")
        gpu = "h100_sxm" if measured_on_h100 else "h200"  # where each was measured
        assert _compose(conf_copy, [f"engine={path.stem}", f"gpu={gpu}"]).engine.name


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--context-tokens", str(2**70)], "'context_tokens'"),
        (["--batch", str(2**40)], "'batch'"),
        (["--activation-reserve-gb", "inf"], "'activation_reserve_gb'"),
        (["--activation-reserve-gb", "nan"], "'activation_reserve_gb'"),
    ],
)
def test_scorecard_argument_out_of_range_is_named(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    assert_refused(scorecard.main, argv, capsys, named)


def test_scorecard_prints_no_decode_bound_for_a_batch_that_fits_no_gpu() -> None:
    model = scorecard.load_model("llama3_8b")
    gpus = scorecard.load_gpus([])
    for gpu in gpus:  # 10^6 sequences of 2048 tokens: no tier holds their KV
        assert scorecard.score(gpu, model, 2048, 10**6, 0).bound is None
    h200 = next(g for g in gpus if g.name == "h200")
    assert scorecard.score(h200, model, 2048, 8, 0).bound is not None


def test_scorecard_gpu_profile_without_a_figure_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    _gpu_file(conf, "l40s", hbm_gbps=None)
    monkeypatch.setattr(scorecard, "CONF_DIR", conf)
    assert_refused(scorecard.main, ["--gpus", "l40s"], capsys, "l40s.yaml", "hbm_gbps")
