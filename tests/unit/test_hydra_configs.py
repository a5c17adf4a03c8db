"""Every experiment config composes, validates and runs at a tiny size (lightning-hydra style)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.experiment.runner import run_experiment

CONF = CONF_DIR
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))

register_configs()


def compose_run(overrides: list[str]):  # noqa: ANN201
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_mixed_spike_matches_the_seed_scenario() -> None:
    cfg = to_config(compose_run(["+experiment=mixed_spike"]))
    assert cfg.compare_policies == ["perc", "lru", "priority"]
    assert cfg.seeds == 5 and cfg.vram_gb == 16.0
    wl = cfg.workload
    assert (wl.num_requests, wl.max_active_sessions) == (1000, 48)
    assert (wl.spike_multiplier, wl.spike_at_request) == (4.0, 300)
    shares = {k: c.share for k, c in wl.classes.items()}
    assert shares == {"chat": 0.4, "code": 0.3, "summarize": 0.2, "longctx": 0.1}
    assert cfg.model.weight_bytes == 8_030_000_000


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_runs_at_tiny_size(experiment: str, tmp_path: Path) -> None:
    cfg = to_config(
        compose_run(
            [
                f"+experiment={experiment}",
                "workload.num_requests=25",
                "seeds=1",
                "workload.max_active_sessions=6",
                "replay.limit=25",
            ]
        )
    )
    report = run_experiment(cfg, tmp_path)
    assert {c["policy"] for c in report["cells"]} == set(cfg.policy_names())
    for cell in report["cells"]:
        assert cell["completed"] + cell["rejected"] == cell["requests"] == 25
    assert (tmp_path / "metrics.json").exists() and (tmp_path / "summary.md").exists()


def run_cli(*overrides: str) -> subprocess.CompletedProcess[str]:
    """`python -m cachepilot_sim <overrides>` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "cachepilot_sim", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_writes_metrics_and_requests(
    smoke_cli_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = smoke_cli_run  # `python -m cachepilot_sim +experiment=smoke hydra.run.dir=...`
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "metrics.json").read_text())
    assert set(report["summary"]) == {"perc", "lru", "priority"}
    assert len(list((out / "requests").glob("*.parquet"))) == 6  # 3 policies x 2 seeds
    assert "restore s" in proc.stdout and "TTFT" in proc.stdout


def test_cli_rejects_negative_capacity_naming_the_key(tmp_path: Path) -> None:
    proc = run_cli("+experiment=smoke", "kv.cpu_store_bytes=-5", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert "kv.cpu_store_bytes" in proc.stderr and "-5" in proc.stderr
    assert not (tmp_path / "metrics.json").exists()


def test_cli_rejects_unknown_policy(tmp_path: Path) -> None:
    proc = run_cli("policy.name=belady2", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert "belady2" in proc.stderr and "known" in proc.stderr


def _kv_tier_variants() -> dict[str, list[str]]:
    import importlib.util

    path = CONF.parents[1] / "experiments" / "kv_tier.py"
    spec = importlib.util.spec_from_file_location("kv_tier", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.VARIANTS)


@pytest.mark.parametrize(("name", "overrides"), sorted(_kv_tier_variants().items()))
def test_every_kv_tier_variant_runs_at_tiny_size(
    name: str, overrides: list[str], tmp_path: Path
) -> None:
    cfg = to_config(
        compose_run(
            [
                "+experiment=mixed_spike",
                "compare_policies=[perc]",
                "seeds=1",
                "workload.num_requests=25",
                "workload.max_active_sessions=6",
                *overrides,
            ]
        )
    )
    report = run_experiment(cfg, tmp_path)
    assert report["cells"][0]["completed"] + report["cells"][0]["rejected"] == 25, name
