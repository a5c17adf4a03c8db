"""The GPU kernels stand alone (issue 32): `python3 -m cachepilot_sim.kernels.bench` and `check`
start on a host that has NumPy (and CuPy, Triton, torch for the kernels themselves) but not the
simulator's dependencies. Checked in a fresh venv that holds NumPy alone (SciPy too for `fit`,
whose bounded least squares is SciPy's), with the checkout on PYTHONPATH: an import of simpy,
Hydra, OmegaConf or polars there fails, as on a bare GPU host."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIMULATOR_ONLY = ["simpy", "hydra", "omegaconf", "polars", "sortedcontainers", "rich"]


def _site_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with only the named packages (linked from this environment) and no pip."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    here = Path(sysconfig.get_paths()["purelib"])
    for package in ("numpy", "scipy"):
        src = _site_dir(package)
        (site / package).symlink_to(src)
        libs = here / f"{package}.libs"  # the wheels' bundled shared libraries
        if libs.is_dir():
            (site / libs.name).symlink_to(libs)
    return python


def run_bare(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONNOUSERSITE": "1"},
    )  # fmt: skip


def test_the_bare_venv_lacks_the_simulators_dependencies(bare_python: Path) -> None:
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    run = run_bare(bare_python, "-c", probe, *SIMULATOR_ONLY, "numpy")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['numpy']"


def test_kernel_modules_import_on_a_host_without_the_simulator(bare_python: Path) -> None:
    modules = ["bench", "check", "fit", "reference", "layout", "formats", "profile_gpu", "timing"]
    code = "; ".join(f"import cachepilot_sim.kernels.{m}" for m in modules)
    code += "; import sys; print(sorted(m.split('.')[0] for m in sys.modules if '.' not in m))"
    run = run_bare(bare_python, "-c", code)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = set(eval(run.stdout))  # the top-level modules loaded
    assert not loaded & set(SIMULATOR_ONLY)


@pytest.mark.parametrize("tool", ["bench", "check", "profile_gpu"])
def test_the_documented_gpu_commands_start_on_a_host_without_the_simulator(
    bare_python: Path, tool: str
) -> None:
    run = run_bare(bare_python, "-m", f"cachepilot_sim.kernels.{tool}", "--help")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout
