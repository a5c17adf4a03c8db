"""One colour per policy in every figure, grey beyond the top k, and figures drawn without pyarrow
(seaborn gets numpy columns, not a converted polars frame)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cachepilot_sim.config import POLICIES
from cachepilot_sim.plotting import GREY, policy_colour, policy_palette, seaborn_data, top_k

ROOT = Path(__file__).resolve().parents[2]


def test_a_policy_keeps_its_colour_whatever_the_figure_lists() -> None:
    one = policy_palette(["perc", "lru", "fifo"])
    other = policy_palette(["fifo", "s3fifo", "perc", "lru", "arc"])
    assert all(one[p] == other[p] == policy_colour(p) for p in one)


def test_every_registered_policy_has_its_own_colour() -> None:
    names = POLICIES.names()
    colours = [policy_colour(p) for p in names]
    assert len(set(colours)) == min(len(names), 20) and GREY not in colours


def test_beyond_the_top_k_policies_are_grey() -> None:
    ttft = {"lru": 5.0, "perc": 3.0, "fifo": 9.0, "arc": 4.0}
    best = top_k(ttft, 2)
    assert best == ["perc", "arc"]
    palette = policy_palette(list(ttft), highlight=best)
    assert palette["lru"] == palette["fifo"] == GREY
    assert palette["perc"] == policy_colour("perc")
    assert top_k({"a": 1.0, "b": 2.0}, 1, higher_is_better=True) == ["b"]


def test_seaborn_data_is_numpy_columns() -> None:
    import polars as pl

    data = seaborn_data(pl.DataFrame({"x": [1, 2], "policy": ["a", "b"]}))
    assert list(data) == ["x", "policy"] and data["x"].tolist() == [1, 2]


def test_the_run_report_and_plots_draw_without_pyarrow(tmp_path: Path) -> None:
    probe = (
        "import sys; sys.modules['pyarrow'] = None\n"  # importing pyarrow now fails
        "sys.argv = ['cachepilot-sim', '+experiment=smoke', 'seeds=1', "
        f"'workload.num_requests=30', 'hydra.run.dir={tmp_path / 'run'}']\n"
        "from cachepilot_sim.tools.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "from cachepilot_sim.tools.plot import main as plot\n"
        f"assert plot([{str(tmp_path / 'run')!r}]) == 0\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "headline.png").stat().st_size > 0
    assert any((tmp_path / "run").rglob("*.png"))
