"""The Triton kernels: checked against the NumPy reference under TRITON_INTERPRET=1 (in a child
process, because the variable must be set before Triton is first imported), and compiled ahead of
time for sm_90 (no GPU needed) so that code the interpreter accepts but the compiler rejects fails
here, not on the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (dev extra)")
pytest.importorskip("torch", reason="torch is not installed (dev extra)")

REPO = Path(__file__).resolve().parents[2]

SWAP_SIG = {"base_ptr": "*bf16", "layer_offs": "*i64", "device_ids": "*i64", "host_ids": "*i64"}
CHUNK_INTS = {"num_chunks": "i32", "num_layers": "i32", "num_device_blocks": "i32"}


def _run_interpreter_checks(seed: int, quick: bool) -> list[dict[str, object]]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [
        sys.executable,
        "-m",
        "cachepilot_sim.kernels.check",
        "--backend",
        "triton",
        "--device",
        "cpu",
        "--seed",
        str(seed),
    ] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout, proc.stderr[-3000:]
    return list(json.loads(proc.stdout.splitlines()[-1]))


@pytest.mark.parametrize(("seed", "quick"), [(0, False), (1, True)])
def test_triton_kernels_match_numpy_reference_under_interpreter(seed: int, quick: bool) -> None:
    results = _run_interpreter_checks(seed, quick)
    failed = [r for r in results if not r["passed"]]
    assert results and not failed, failed


def _compile(fn: object, signature: dict[str, str], constexprs: dict[str, object]) -> str:
    from triton.backends.compiler import GPUTarget

    sig = {**signature, **{k: "constexpr" for k in constexprs}}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return str(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"])


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("fp8", [True, False])
def test_triton_quant_kernels_compile_for_sm90(native: bool, fp8: bool) -> None:
    from cachepilot_sim.kernels import triton_kernels as tk

    qmax = 448.0 if fp8 else 127.0
    rows = {"num_rows": "i32", "row_len": "i32"}
    tile = {"ROWS": 4, "COLS": 1024}
    ptx = _compile(
        tk._quant_tok_kernel,
        {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*fp32", **rows},
        {**tile, "QMAX": qmax, "FP8": fp8, "NATIVE": native},
    )
    assert "div.rn.f32" in ptx  # the scale division must round like the reference
    _compile(
        tk._quant_chan_kernel,
        {"x_ptr": "*bf16", "amax_ptr": "*fp32", "q_ptr": "*u8", "s_ptr": "*fp32", **rows},
        {**tile, "QMAX": qmax, "FP8": fp8, "NATIVE": native},
    )
    _compile(
        tk._dequant_kernel,
        {"q_ptr": "*u8", "s_ptr": "*fp32", "x_ptr": "*bf16", **rows},
        {**tile, "FP8": fp8, "PER_TOKEN": True, "NATIVE": native},
    )
    fused = {
        "BLOCK_SIZE": 16,
        "ROW_LEN": 1024,
        "TOKS": 16,
        "COLS": 1024,
        "FP8": fp8,
        "NATIVE": native,
    }
    addrs = {"codes_addr": "i64", "scales_addr": "i64"}
    _compile(
        tk._swap_out_quant_kernel, {**SWAP_SIG, **addrs, **CHUNK_INTS}, {**fused, "QMAX": qmax}
    )
    _compile(tk._swap_in_dequant_kernel, {**SWAP_SIG, **addrs, **CHUNK_INTS}, fused)


@pytest.mark.parametrize("out", [True, False])
def test_triton_swap_kernel_compiles_for_sm90(out: bool) -> None:
    from cachepilot_sim.kernels import triton_kernels as tk

    _compile(
        tk._swap_kernel,
        {**SWAP_SIG, "host_addr": "i64", **CHUNK_INTS},
        {"CHUNK_WORDS": 4096, "BLOCK": 2048, "OUT": out},
    )
    _compile(
        tk._col_absmax_kernel,
        {"x_ptr": "*bf16", "amax_ptr": "*fp32", "num_rows": "i32", "row_len": "i32"},
        {"ROWS": 64, "COLS": 128},
    )
