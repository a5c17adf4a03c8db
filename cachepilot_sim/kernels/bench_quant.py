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
V1, V2, V3 = 1, 2, 3
TOK_VARIANTS = [
    # version 3: 16 values per lane, 16-byte code stores; nc or plain ("_pl") loads
    *(
        ck.TokVariant(V3, r, hint=h, threads=t)
        for r, h, t in (
            (1, "", 256),
            (2, "", 256),
            (4, "", 128),
            (4, "", 256),
            (1, "_pl", 256),
            (2, "_pl", 256),
            (4, "_pl", 128),
            (4, "_pl", 256),
        )
    ),
    # version 1 (the 2026-11-29 morning kernels)
    *(ck.TokVariant(V1, 1, ctas_per_sm=c) for c in (4, 16, 64)),
    *(ck.TokVariant(V1, r, threads=t) for r, t in ((1, 256), (2, 256), (1, 128), (2, 128))),
    # version 2: cheaper encode; rows per warp, cache hints, pipelined persistent grid
    *(
        ck.TokVariant(V2, r, threads=t)
        for r, t in ((1, 256), (2, 256), (2, 128), (4, 128), (4, 256))
    ),
    ck.TokVariant(V2, 2, hint="_pf"),
    ck.TokVariant(V2, 2, hint="_cs"),
    ck.TokVariant(V2, 1, pipelined=True, ctas_per_sm=4),
    ck.TokVariant(V2, 1, pipelined=True, ctas_per_sm=8),
    ck.TokVariant(V2, 1, pipelined=True, threads=128, ctas_per_sm=8),
    ck.TokVariant(V2, 2, pipelined=True, ctas_per_sm=2),
    ck.TokVariant(V2, 1, pipelined=True, hint="_cs", ctas_per_sm=4),
]


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

    mats = ck.QuantRows(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), rows, row_len, bf16, fmt)

    def cuda_tok(i: int, variant: ck.TokVariant) -> None:
        ck.quantize_per_token(mats, variant)

    for variant in TOK_VARIANTS:
        v[f"cuda_tok_{fmt.value}_{variant.label()}"] = functools.partial(cuda_tok, variant=variant)

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
    """Every CUDA variant's codes and scales vs Triton's on the whole benchmark tensor (outputs
    poisoned before each run)."""
    import torch

    rows, row_len = x.shape
    tc = torch.full((rows, row_len), 0xA5, dtype=torch.uint8, device="cuda")
    ts = torch.full((rows,), float("nan"), dtype=torch.float32, device="cuda")
    tk.quantize_per_token(x, fmt, tc, ts)
    c = torch.empty_like(tc)
    s = torch.empty_like(ts)
    res: dict[str, Any] = {"num_codes": rows * row_len}
    for variant in [None, *TOK_VARIANTS]:
        c.fill_(0xA5)
        s.fill_(float("nan"))
        ck.quantize_per_token(
            ck.QuantRows(
                x.data_ptr(), c.data_ptr(), s.data_ptr(), rows, row_len, HalfFormat.BF16, fmt
            ),
            variant,
        )
        key = "default" if variant is None else variant.label()
        res[key] = {
            "codes_differing": int((c != tc).sum()),
            "scales_differing": int((s != ts).sum()),
        }
    torch.cuda.synchronize()
    return res


def _dequant_and_channel(
    x: Any, fmt: QuantFormat, label: str, log: Callable[[str], None]
) -> list[Timing]:
    import torch

    rows, row_len = x.shape
    bf16 = HalfFormat.BF16
    codes = torch.empty(rows, row_len, dtype=torch.uint8, device="cuda")
    scales = torch.empty(rows, dtype=torch.float32, device="cuda")
    ck.quantize_per_token(
        ck.QuantRows(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), rows, row_len, bf16, fmt)
    )
    y = torch.empty_like(x)
    amax = torch.zeros(row_len, dtype=torch.float32, device="cuda")
    cscales = torch.empty(row_len, dtype=torch.float32, device="cuda")
    nbytes = rows * row_len * 3 + rows * 4
    dequant = ck.QuantRows(
        y.data_ptr(), codes.data_ptr(), scales.data_ptr(), rows, row_len, bf16, fmt
    )
    channel = ck.QuantRows(
        x.data_ptr(), codes.data_ptr(), cscales.data_ptr(), rows, row_len, bf16, fmt
    )

    def cuda_chan(i: int) -> None:
        amax.zero_()
        ck.quantize_per_channel(channel, amax.data_ptr())

    variants: dict[str, tuple[str, Callable[[int], object]]] = {
        f"cuda_dequant_tok_{fmt.value}": ("dequantize", lambda i: ck.dequantize(dequant)),
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
