"""The notebooks run top to bottom on a tiny run and draw every figure (jupytext + nbclient)."""

from __future__ import annotations

from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

from cachepilot_sim.config import RunConfig
from cachepilot_sim.runner import run_experiment
from tests.conftest import make_sim_config, make_workload

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.py"))
FIGURES = {"run_overview.py": 4}


def test_every_notebook_is_listed_with_its_figure_count() -> None:
    assert {p.name for p in NOTEBOOKS} == set(FIGURES)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_a_tiny_run(path: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=50))
    values = {k: getattr(sim, k) for k in ("seed", "vram_gb", "model", "workload", "kv")}
    run_experiment(RunConfig(**values, compare_policies=["perc", "lru"]), tmp_path / "run")
    monkeypatch.setenv("CACHEPILOT_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = jupytext.read(path)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={
        "metadata": {"path": str(tmp_path)}}).execute()  # raises on any cell error
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == FIGURES[path.name]
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert f"under {tmp_path / 'run'}" in text  # it read the run it was given
