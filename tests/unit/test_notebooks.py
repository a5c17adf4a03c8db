"""The notebooks run top to bottom on a tiny run and a tiny sweep (jupytext + nbclient)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
from nbclient import NotebookClient

from cachepilot_sim.config import RunConfig
from cachepilot_sim.experiment.runner import run_experiment
from tests.conftest import make_sim_config, make_workload

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.py"))
# notebook -> (figures it draws, text that proves it read the folder it was given)
EXPECT = {
    "run_overview.py": (4, "under {run}"),
    "sweep_overview.py": (2, "8 jobs, 8 rows under {sweep}"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nb")
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=50))
    values = {k: getattr(sim, k) for k in ("seed", "vram_gb", "model", "workload", "kv")}
    run_experiment(RunConfig(**values, compare_policies=["perc", "lru"]), root / "run")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cachepilot_sim",
            "--multirun",
            "policy=perc,lru",
            "vram_gb=10,16",
            "seed=0,1",
            "seeds=1",
            "workload.num_requests=20",
            "workload.max_active_sessions=4",
            "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={root / 'sweep'}",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {"run": root / "run", "sweep": root / "sweep"}


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
