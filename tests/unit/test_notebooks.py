"""The notebooks run top to bottom on a tiny run and a tiny sweep (jupytext + nbclient)."""

from __future__ import annotations

from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

from cachepilot_sim.tools.examples import tiny_run, tiny_sweep

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.py"))
# notebook -> (figures it draws, text that proves it read the folder it was given)
EXPECT = {
    "run_overview.py": (4, "under {run}"),
    "sweep_overview.py": (2, "8 jobs, 8 rows under {sweep}"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The run and sweep that the notebooks simulate by themselves when given no folder."""
    root = tmp_path_factory.mktemp("nb")
    return {"run": tiny_run(root / "run"), "sweep": tiny_sweep(root / "sweep")}


def test_every_notebook_is_listed_with_what_it_draws() -> None:
    assert {p.name for p in NOTEBOOKS} == set(EXPECT)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_a_tiny_run(
    path: Path, folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CACHEPILOT_RUN_DIR", str(folders["run"]))
    monkeypatch.setenv("CACHEPILOT_SWEEP_DIR", str(folders["sweep"]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = jupytext.read(path)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()  # raises on any cell error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    num_figures, proof = EXPECT[path.name]
    assert len(images) == num_figures
    assert proof.format(**folders) in "".join(o.get("text", "") for o in outputs)
