"""The CUDA kernels: every .cu in kernels_cuda/ compiles for sm_90 with the ptxas resource report
and no register spills (a kernel that does not build fails CI, GPU or not); on a GPU host the CuPy
launchers match the NumPy reference."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cachepilot_sim.kernels.cuda import CUDA_SOURCES, KERNEL_DIR

NVCC = shutil.which("nvcc")


def test_every_cu_file_is_listed_for_loading() -> None:
    assert sorted(p.name for p in KERNEL_DIR.glob("*.cu")) == sorted(CUDA_SOURCES)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: cannot compile the CUDA sources")
@pytest.mark.parametrize("source", CUDA_SOURCES)
def test_cu_file_compiles_for_sm90_without_spills(source: str, tmp_path: Path) -> None:
    cmd = [
        str(NVCC),
        "-arch=sm_90",
        "-Xptxas",
        "-v",
        "-cubin",
        "-o",
        str(tmp_path / "k.cubin"),
        str(KERNEL_DIR / source),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.stderr
    assert "Compiling entry function" in report
    spills = re.findall(r"(\d+) bytes spill stores", report)
    stack = re.findall(r"(\d+) bytes stack frame", report)
    assert spills and all(s == "0" for s in spills), report[-2000:]
    assert all(s == "0" for s in stack), report[-2000:]


def _gpu_available() -> bool:
    try:
        import cupy
        import torch

        return bool(cupy.is_available() and torch.cuda.is_available())
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_available(), reason="needs cupy and a CUDA GPU (cupy.is_available())")
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_kernels_match_numpy_reference(backend: str) -> None:
    from cachepilot_sim.kernels.check import make_backend, run_checks

    results = run_checks(make_backend(backend, "cuda"), seed=3)
    failed = [r for r in results if not r.passed]
    assert results and not failed, failed
