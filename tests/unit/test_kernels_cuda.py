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


def test_host_runs_merge_consecutive_host_blocks() -> None:
    from cachepilot_sim.kernels.cuda import host_runs

    ids = [5, 6, 7, 2, 3, 9]
    assert host_runs(ids, 0, 6) == [(0, 5, 3), (3, 2, 2), (5, 9, 1)]
    assert host_runs(ids, 1, 4) == [(1, 6, 2), (3, 2, 1)]
    assert host_runs(ids, 2, 2) == []


def test_every_launcher_kernel_name_is_defined_in_the_sources() -> None:
    from cachepilot_sim.kernels import bench_quant
    from cachepilot_sim.kernels.cuda import (
        DEFAULT_TOK_VARIANT,
        SPLIT_KERNELS,
        quant_tok_kernel,
    )
    from cachepilot_sim.kernels.formats import HalfFormat
    from cachepilot_sim.kernels.layout import QuantFormat

    quant_src = (KERNEL_DIR / "kv_quant.cu").read_text()
    swap_src = (KERNEL_DIR / "kv_swap.cu").read_text()
    for variant in [DEFAULT_TOK_VARIANT, *bench_quant.TOK_VARIANTS]:
        for half in HalfFormat:
            for fmt in QuantFormat:
                for row_len in (96, 1024, 2048):
                    name = quant_tok_kernel(variant, row_len, half, fmt)
                    assert name in quant_src or (
                        # names built by token pasting in QUANT_TOK_V2_SET
                        name.startswith(("quant_tok2", "quant_tok3"))
                        and name.replace(f"_{fmt.value}_{half.value}", "_##FMTN##_##DTN##")
                        in quant_src
                    ), name
    for name in SPLIT_KERNELS:
        assert f"KV_SWAP_IN_SPLIT({name}," in swap_src


def test_swap_in_plan_covers_every_size() -> None:
    from cachepilot_sim.kernels.cuda import swap_in_plan

    assert swap_in_plan(1) == ("zero_copy", 0)
    assert swap_in_plan(4) == ("hybrid", 3)
    for n in range(2, 9):
        kind, k = swap_in_plan(n)
        assert kind == "hybrid" and 0 < k < n
    assert swap_in_plan(16) == ("staged", 4)
    assert swap_in_plan(1024) == ("staged", 16)
