"""The one-page run report: report.md, a self-contained report.html, results.csv and run_meta.json,
checked by reading their contents back against metrics.json."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from cachepilot_sim.experiment.report import mean_ci


@pytest.fixture
def run_dir(smoke_cli_run: tuple[Path, subprocess.CompletedProcess[str]]) -> Path:
    out, proc = smoke_cli_run  # `python -m cachepilot_sim +experiment=smoke`, run once
    assert proc.returncode == 0, proc.stderr
    return out


def test_results_csv_has_one_row_per_policy_and_seed_matching_metrics(run_dir: Path) -> None:
    results = pl.read_csv(run_dir / "results.csv")
    cells = json.loads((run_dir / "metrics.json").read_text())["cells"]
    assert results.height == len(cells) == 6
    for cell, row in zip(cells, results.iter_rows(named=True), strict=True):
        assert (row["policy"], row["seed"]) == (cell["policy"], cell["seed"])
        assert row["realized_restore_s"] == pytest.approx(cell["realized_restore_s"])
        assert row["goodput_req_s"] == pytest.approx(cell["goodput_req_s"])
        assert row["ttft_p99_ms"] == pytest.approx(cell["ttft_p99_s"] * 1e3)


def test_run_meta_records_command_config_versions_commit_and_wall_time(run_dir: Path) -> None:
    meta = json.loads((run_dir / "run_meta.json").read_text())
    assert meta["command"].startswith("cachepilot-sim +experiment=smoke")
    assert "compare_policies" in meta["config_yaml"] and meta["wall_s"] > 0
    assert {"python", "cachepilot-sim", "simpy", "hydra-core"} <= set(meta["versions"])
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", meta["commit"])


def test_html_report_is_self_contained_with_the_figure_embedded(run_dir: Path) -> None:
    page = (run_dir / "report.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere
    for text in ("perc", "lru", "priority", "TTFT", "goodput", "compare_policies", "wall time"):
        assert text in page
    md = (run_dir / "report.md").read_text()
    assert "![headline figure](headline.png)" in md and "```yaml" in md
    # what was simulated first, then the ranking on the objective before the other tables
    assert md.splitlines()[2].startswith("Simulated: ")
    assert md.index("**Ranking: Ranked on TTFT p99") < md.index("**Outcome**")


def test_headline_interval_is_the_t_interval() -> None:
    values = np.array([2.9, 3.1, 3.5, 3.0])
    mean, half = mean_ci(values)
    low, high = stats.t.interval(0.95, 3, loc=values.mean(), scale=stats.sem(values))
    assert mean == pytest.approx(values.mean()) and half == pytest.approx((high - low) / 2)
    assert mean_ci(np.array([1.0])) == (1.0, 0.0)
