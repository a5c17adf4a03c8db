"""GPU timing of per-token KV quantization of a large bf16 tensor: the CUDA and Triton kernels
against torch eager and torch.compile of the same math and the device-copy ceiling, all in one run.
Bytes counted: 2 read + 1 written per value + a 4-byte scale per row (the fewest a quantizer moves).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from cachepilot_sim.kernels import cuda as ck
from cachepilot_sim.kernels import triton_kernels as tk
from cachepilot_sim.kernels.formats import HalfFormat
from cachepilot_sim.kernels.layout import QuantFormat
from cachepilot_sim.kernels.timing import Timing, measure

NUM_ROWS = 1 << 20
ROW_LEN = 1024


def torch_quant_int8(x: Any) -> tuple[Any, Any]:
    import torch

    amax = x.abs().amax(dim=1, keepdim=True).float()
    q = torch.round(x.float() * (127.0 / amax)).clamp(-127, 127).to(torch.int8)
    return q, amax / 127.0


def torch_quant_fp8(x: Any) -> tuple[Any, Any]:
    import torch

    amax = x.abs().amax(dim=1, keepdim=True).float()
    q = (x.float() * (448.0 / amax)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, amax / 448.0


def quant_variants(
    x: Any, codes: Any, scales: Any, fmt: QuantFormat
) -> dict[str, Callable[[int], object]]:
    import torch

    rows, row_len = x.shape
    bf16 = HalfFormat.BF16
    v: dict[str, Callable[[int], object]] = {}

    def cuda_tok(i: int, threads: int = 256, rows_per_warp: int = 1, ctas: int = 1 << 20) -> None:
        ck.quantize_per_token(
            x.data_ptr(),
            codes.data_ptr(),
            scales.data_ptr(),
            rows,
            row_len,
            bf16,
            fmt,
            threads=threads,
            ctas_per_sm=ctas,
            rows_per_warp=rows_per_warp,
        )

    for cps in (4, 16, 64):
        v[f"cuda_tok_{fmt.value}_t256_ctas{cps}perSM"] = functools.partial(cuda_tok, ctas=cps)
    for r, t in ((1, 256), (2, 256), (1, 128), (2, 128)):
        v[f"cuda_tok_{fmt.value}_t{t}_r{r}_one_cta_per_{t // 32 * r}_rows"] = functools.partial(
            cuda_tok, threads=t, rows_per_warp=r
        )

    def triton_tok(i: int, rpp: int, warps: int) -> None:
        tk.quantize_per_token(x, fmt, codes, scales, rows_per_program=rpp, num_warps=warps)

    for rpp, warps in ((1, 4), (2, 4), (4, 4), (4, 8), (8, 8)):
        v[f"triton_tok_{fmt.value}_rows{rpp}_w{warps}"] = functools.partial(
            triton_tok, rpp=rpp, warps=warps
        )
    eager = torch_quant_int8 if fmt is QuantFormat.INT8 else torch_quant_fp8
    v[f"baseline_torch_eager_{fmt.value}"] = lambda i: eager(x)
    compiled = torch.compile(eager)
    v[f"baseline_torch_compile_{fmt.value}"] = lambda i: compiled(x)
    return v


def bench_quant(
    log: Callable[[str], None], num_rows: int = NUM_ROWS, row_len: int = ROW_LEN
) -> tuple[list[Timing], dict[str, Any]]:
    """Per-token quantize (INT8, FP8), dequantize and per-channel quantize timings + agreement."""
    import torch

    x = torch.randn(num_rows, row_len, dtype=torch.bfloat16, device="cuda")
    codes = torch.empty(num_rows, row_len, dtype=torch.uint8, device="cuda")
    scales = torch.empty(num_rows, dtype=torch.float32, device="cuda")
    nbytes = num_rows * row_len * 3 + num_rows * 4
    label = f"{num_rows}x{row_len}"
    results: list[Timing] = []
    agreement: dict[str, Any] = {}
    for fmt in QuantFormat:
        for name, fn in quant_variants(x, codes, scales, fmt).items():
            results.append(_safe("quantize", name, label, nbytes, fn, log))
        agreement[fmt.value] = _agreement(x, fmt)
        results += _dequant_and_channel(x, fmt, label, log)
    return results, agreement


def _agreement(x: Any, fmt: QuantFormat) -> dict[str, Any]:
    """CUDA vs Triton codes and scales on the whole benchmark tensor (poisoned outputs)."""
    import torch

    rows, row_len = x.shape
    out = []
    for _ in range(2):
        c = torch.full((rows, row_len), 0xA5, dtype=torch.uint8, device="cuda")
        s = torch.full((rows,), float("nan"), dtype=torch.float32, device="cuda")
        out.append((c, s))
    ck.quantize_per_token(
        x.data_ptr(),
        out[0][0].data_ptr(),
        out[0][1].data_ptr(),
        rows,
        row_len,
        HalfFormat.BF16,
        fmt,
    )
    tk.quantize_per_token(x, fmt, out[1][0], out[1][1])
    torch.cuda.synchronize()
    return {
        "codes_differing": int((out[0][0] != out[1][0]).sum()),
        "scales_differing": int((out[0][1] != out[1][1]).sum()),
        "num_codes": rows * row_len,
    }


def _dequant_and_channel(
    x: Any, fmt: QuantFormat, label: str, log: Callable[[str], None]
) -> list[Timing]:
    import torch

    rows, row_len = x.shape
    bf16 = HalfFormat.BF16
    codes = torch.empty(rows, row_len, dtype=torch.uint8, device="cuda")
    scales = torch.empty(rows, dtype=torch.float32, device="cuda")
    ck.quantize_per_token(
        x.data_ptr(), codes.data_ptr(), scales.data_ptr(), rows, row_len, bf16, fmt
    )
    y = torch.empty_like(x)
    amax = torch.zeros(row_len, dtype=torch.float32, device="cuda")
    cscales = torch.empty(row_len, dtype=torch.float32, device="cuda")
    nbytes = rows * row_len * 3 + rows * 4

    def cuda_chan(i: int) -> None:
        amax.zero_()
        ck.quantize_per_channel(
            x.data_ptr(),
            codes.data_ptr(),
            amax.data_ptr(),
            cscales.data_ptr(),
            rows,
            row_len,
            bf16,
            fmt,
        )

    variants: dict[str, tuple[str, Callable[[int], object]]] = {
        f"cuda_dequant_tok_{fmt.value}": (
            "dequantize",
            lambda i: ck.dequantize(
                codes.data_ptr(), scales.data_ptr(), y.data_ptr(), rows, row_len, bf16, fmt
            ),
        ),
        f"triton_dequant_tok_{fmt.value}": (
            "dequantize",
            lambda i: tk.dequantize(codes, scales, fmt, torch.bfloat16, True, y),
        ),
        f"cuda_chan_{fmt.value}_two_pass": ("quantize_per_channel", cuda_chan),
        f"triton_chan_{fmt.value}_two_pass": (
            "quantize_per_channel",
            lambda i: tk.quantize_per_channel(x, fmt),
        ),
    }
    return [_safe(sec, name, label, nbytes, fn, log) for name, (sec, fn) in variants.items()]


def _safe(
    section: str,
    name: str,
    label: str,
    nbytes: int,
    fn: Callable[[int], object],
    log: Callable[[str], None],
) -> Timing:
    try:
        t = measure(
            section,
            name,
            label,
            nbytes,
            fn,
            nbytes / 4e12 * 1e6,
            "bytes: 2 read + 1 written per value + 4 per scale",
        )
        log(f"{section:20s} {name:44s} {t.median_us:10.1f} us {t.gbps:8.1f} GB/s")
        return t
    except Exception as err:
        log(f"{section} {name} FAILED: {str(err)[-600:]}")
        return Timing(
            section,
            name,
            label,
            nbytes,
            float("nan"),
            float("nan"),
            float("nan"),
            0,
            f"failed: {err!r}"[:300],
        )
