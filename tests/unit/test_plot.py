"""`python -m cachepilot_sim.tools.plot` draws the run figures from the traces of a tiny run."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.config import RunConfig, SimConfig
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.tools.figures import tier_timeline
from cachepilot_sim.tools.plot import main
from cachepilot_sim.trace.derive import load_trace
from tests.conftest import make_sim_config, make_workload


def tiny_run(out: Path) -> None:
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=60))
    values = {f.name: getattr(sim, f.name) for f in fields(SimConfig)}
    run_experiment(RunConfig(**values, compare_policies=["perc", "lru"]), out)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny run that the tests below read (the plot test draws into its plots/)."""
    out = tmp_path_factory.mktemp("plot") / "run"
    tiny_run(out)
    return out


def test_plot_writes_every_run_figure(run_dir: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main([str(run_dir), "--format", "svg"]) == 0
    names = {p.name for p in (run_dir / "plots").iterdir()}
    figures = ["headline_by_config", "vram_by_tier_p1of2", "vram_by_tier_p2of2",
               "latency_cdfs", "restore_by_class", "gap_estimates"]  # fmt: skip
    assert names == {f"{f}.{ext}" for f in figures for ext in ("svg", "csv")}  # 10 traces, 6 a page
    # one run: one configuration, each policy its own curve over the run's 5 seeds
    cdf = pl.read_csv(run_dir / "plots" / "latency_cdfs.csv")
    points = cdf.filter(pl.col("ecdf").is_not_null())
    assert set(cdf["config"]) == {"one configuration"} and set(points["n_seeds"]) == {5}
    assert set(points["policy"]) == {"perc", "lru"}
    # perc and lru lie on top of each other here: the figure adds perc's difference to lru
    diffs = cdf.filter(pl.col("difference_pct").is_not_null())
    assert set(diffs["policy"]) == {"perc"} and set(diffs["baseline"]) == {"lru"}
    assert "vram_by_tier_p2of2.svg" in capsys.readouterr().out
    one = run_dir / "trace" / "lru_seed0"  # a single trace folder works too
    assert main([str(one), "--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "gap_estimates.png").stat().st_size > 5000


def test_tier_timeline_ends_with_every_copy_landed(run_dir: Path) -> None:
    lf, _ = load_trace(run_dir / "trace" / "perc_seed0")
    line = tier_timeline(lf)
    flight = line.filter(pl.col("tier") == "flight")["bytes"]
    assert flight.len() > 0 and flight[-1] == 0 and flight.min() >= 0
    assert line.filter(pl.col("tier") == "cpu")["bytes"].min() >= 0


def test_plot_of_a_folder_without_traces_names_it(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main([str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err
