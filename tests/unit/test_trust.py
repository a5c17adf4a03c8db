"""How far to trust an answer (trust.py): the four kinds decided from a run's config,
their bounds read back against the committed error tables, the registry that holds them
regenerated from those tables, and the label on the terminal, metrics.json and the reports."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from rich.console import Console

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import (
    ConfigError,
    EngineConfig,
    GpuSpecConfig,
    StepCost,
    register_configs,
    to_config,
)
from cachepilot_sim.config.trust_registry import REGISTRY_PATH
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.tools.trust_table import REPO_ROOT, registry_text
from cachepilot_sim.trust import TrustKind, engine_label, trust_for, trust_of

H200_ERRORS = REPO_ROOT / "experiments/validation/hf_cb/2026-12-01/errors.json"
H100_ERRORS = REPO_ROOT / "experiments/validation/hf_cb/2026-12-06-h100/errors_hf_cb_transfer.json"

register_configs()


def config(*overrides: str):  # noqa: ANN201
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


def gpu(name: str) -> GpuSpecConfig:
    return GpuSpecConfig(**yaml.safe_load((CONF_DIR / "gpu" / f"{name}.yaml").read_text()))


def worst_mean_percent(path: Path, family: str) -> str:
    """The label's number, computed here from the errors.json itself: max |mean error| over the
    workloads where the engine preempted nothing (below memory pressure)."""
    workloads = json.loads(path.read_text())["workloads"].values()
    calm = [w for w in workloads if not w["preemptions_real"]]
    return f"±{100 * max(abs(w[f'{family}_mean_err']) for w in calm):.1f}"


def test_the_committed_registry_is_what_the_error_tables_give() -> None:
    # A new or changed errors.json must come with `python -m cachepilot_sim.tools.trust_table`.
    assert REGISTRY_PATH.read_text() == registry_text(REPO_ROOT)


def test_hf_cb_on_the_h200_it_was_fitted_on_is_measured_with_its_committed_errors() -> None:
    t = trust_for(config("engine=hf_cb"))
    assert t.kind == TrustKind.MEASURED and t.source.endswith("2026-12-01/errors.json")
    label = engine_label(t)
    nums = "/".join(worst_mean_percent(H200_ERRORS, f) for f in ("ttft", "tpot", "e2e"))
    assert label.startswith("engine hf_cb (transformers-continuous-batching 5.17.0), hardware h200")
    assert f"measured on this GPU, mean TTFT/TPOT/E2E within {nums} %" in label
    assert "8 workloads below memory pressure" in label  # the 4 pressure_* ones left out


def test_hf_cb_on_the_h100_is_transferred_from_the_h200_with_the_h100_errors() -> None:
    t = trust_for(config("engine=hf_cb", "gpu=h100_sxm"))
    assert t.kind == TrustKind.TRANSFERRED and t.fitted_on == "NVIDIA H200"
    assert worst_mean_percent(H100_ERRORS, "tpot") == "±10.6"
    assert "transferred from NVIDIA H200" in engine_label(t)
    assert "mean TTFT/TPOT/E2E within ±7.5/±10.6/±10.4 %" in engine_label(t)


def test_hf_cb_on_a_gpu_without_captures_is_datasheet_only_and_refused_with_its_floor() -> None:
    t = trust_of(config("engine=hf_cb").engine, gpu("a100_80gb"))
    assert t.kind == TrustKind.DATASHEET and t.lower_bound and not t.p99
    assert "datasheet only" in engine_label(t) and "at least ±7.5/±10.6/±10.4 %" in engine_label(t)
    with pytest.raises(ConfigError, match=r"'gpu' = 'a100_80gb'.*datasheet only, error at least"):
        config("engine=hf_cb", "gpu=a100_80gb")
    with pytest.raises(ConfigError, match=r"'tp' = 2"):
        config("engine=hf_cb", "tp=2")


@pytest.mark.parametrize("engine", ["default", "vllm_v1"])
def test_roofline_engines_are_unvalidated_wherever_they_answer(engine: str) -> None:
    on_h200 = engine_label(trust_for(config(f"engine={engine}")))
    assert on_h200.startswith(f"engine {engine} (roofline step cost), hardware h200")
    assert on_h200.endswith("unvalidated (idealised engine, no real-engine captures)")
    on_h100 = trust_for(config(f"engine={engine}", "gpu=h100_sxm", "vram_gb=80"))
    assert on_h100.kind == TrustKind.UNVALIDATED and not on_h100.mean
    assert "scaled by datasheet ratios, not measured" in engine_label(on_h100)


def test_a_new_fit_without_committed_errors_is_unvalidated_and_stays_on_the_h200() -> None:
    fresh = EngineConfig(
        name="my_engine", step_cost=StepCost.FITTED, fitted_on="NVIDIA H200", request_us=50.0
    )
    t = trust_of(fresh, GpuSpecConfig())
    assert t.kind == TrustKind.UNVALIDATED and "no committed real-engine errors" in t.reason
    with pytest.raises(ConfigError, match=r"'gpu' = 'h100_sxm': engine my_engine"):
        config("engine=hf_cb", "engine.name=my_engine", "gpu=h100_sxm")


@pytest.fixture
def run_dir(smoke_cli_run: tuple[Path, subprocess.CompletedProcess[str]]) -> Path:
    out, proc = smoke_cli_run  # `python -m cachepilot_sim +experiment=smoke`, run once
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_run_puts_its_label_on_the_terminal_metrics_summary_and_report(
    run_dir: Path, smoke_cli_run: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    label = engine_label(trust_for(config("+experiment=smoke")))
    assert "unvalidated" in label
    assert f"trust: {label}\n" in smoke_cli_run[1].stdout  # one line, before the tables
    trust = json.loads((run_dir / "metrics.json").read_text())["trust"]
    assert trust["kind"] == "unvalidated" and trust["label"] == label
    assert f"Trust: {label}" in (run_dir / "summary.md").read_text()
    assert f"**Trust:** {label}" in (run_dir / "report.md").read_text()
    assert json.loads((run_dir / "run_meta.json").read_text())["trust"] == label


def test_a_cluster_run_of_the_transferred_profile_carries_its_label(tmp_path: Path) -> None:
    cfg = config(
        "+experiment=azure_conv",
        "replay.path=samples:azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "replay.limit=30",
        "seeds=1",
        "compare_policies=[]",
        "cluster=disaggregated",
        "engine=hf_cb",
        "gpu=h100_sxm",
        "telemetry.progress=false",
        "trace.enabled=false",
    )
    screen = io.StringIO()
    report = run_experiment(cfg, tmp_path, Console(file=screen, width=120))
    label = engine_label(trust_for(cfg))
    assert report["trust"]["kind"] == "transferred" and report["trust"]["label"] == label
    assert f"trust: {label}\n" in screen.getvalue()
    assert json.loads((tmp_path / "metrics.json").read_text())["trust"]["label"] == label
