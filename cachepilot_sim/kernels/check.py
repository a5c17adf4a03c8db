"""Cross-checks of a kernel backend (CUDA or Triton) against the NumPy reference on random KV.

Inputs are random normal values with per-token magnitudes spread over e^-4..e^4 and a few outliers
(never zeros); outputs start poisoned. Copies must match bit for bit. Quantized codes must match the
reference in all but 1e-4 of the elements (a 1-ulp difference in a float32 division may move a code
by one step) and every dequantized value must lie within the documented error bound.
`python -m cachepilot_sim.kernels.check --backend triton --device cpu` runs it under the
interpreter (set TRITON_INTERPRET=1 first); the exit status is non-zero on any failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cachepilot_sim.kernels import reference as ref
from cachepilot_sim.kernels.formats import HalfFormat, f32_to_half, half_to_f32
from cachepilot_sim.kernels.layout import KvGeometry, QuantFormat

MAX_CODE_MISMATCH_FRACTION = 1e-4
BOUND_RTOL = 1e-5
TINY_GEOMETRY = KvGeometry(num_layers=2, block_size=4, num_kv_heads=2, head_dim=16)


@dataclass(frozen=True, slots=True)
class CheckResult:
    check: str
    backend: str
    passed: bool
    detail: str


def random_halves(rng: np.random.Generator, shape: tuple[int, ...], half: HalfFormat) -> Any:
    """16-bit bits of N(0,1) values scaled per row by e^U(-4,4), with 0.1 % outliers x20."""
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp(rng.uniform(-4, 4, shape[:-1] + (1,))).astype(np.float32)
    x = np.where(rng.random(shape) < 1e-3, x * 20, x).astype(np.float32)
    return f32_to_half(x, half)


@dataclass(frozen=True, slots=True)
class SwapCase:
    layers: list[Any]
    device_ids: Any
    host_ids: Any
    num_host_blocks: int


def make_swap_case(
    rng: np.random.Generator, geom: KvGeometry, half: HalfFormat, num_pairs: int = 3
) -> SwapCase:
    """Distinct random device and host block ids, in shuffled order, over pools twice as large."""
    num_device_blocks = num_host_blocks = 2 * num_pairs + 1
    layers = [
        random_halves(rng, geom.layer_shape(num_device_blocks), half)
        for _ in range(geom.num_layers)
    ]
    device_ids = rng.permutation(num_device_blocks)[:num_pairs].astype(np.int64)
    host_ids = rng.permutation(num_host_blocks)[:num_pairs].astype(np.int64)
    return SwapCase(layers, device_ids, host_ids, num_host_blocks)


def _result(check: str, backend: Any, passed: bool, detail: str = "") -> CheckResult:
    return CheckResult(check, backend.name, bool(passed), detail)


def check_swap(backend: Any, rng: np.random.Generator, geom: KvGeometry) -> list[CheckResult]:
    case = make_swap_case(rng, geom, HalfFormat.BF16)
    pool = np.full(geom.host_pool_shape(case.num_host_blocks), 0xA5A5, np.uint16)
    want_pool = pool.copy()
    ref.swap_out(case.layers, case.device_ids, case.host_ids, want_pool)
    _, got_pool = backend.swap(case.layers, case.device_ids, case.host_ids, pool, geom, True)
    out_ok = np.array_equal(got_pool, want_pool)
    poisoned = [np.full_like(a, 0xA5A5) for a in case.layers]
    want_layers = [a.copy() for a in poisoned]
    ref.swap_in(want_pool, case.host_ids, want_layers, case.device_ids)
    got_layers, _ = backend.swap(poisoned, case.device_ids, case.host_ids, want_pool, geom, False)
    in_ok = all(np.array_equal(g, w) for g, w in zip(got_layers, want_layers, strict=True))
    return [_result("swap_out", backend, out_ok), _result("swap_in", backend, in_ok)]


def _compare_codes(got: Any, want: Any) -> tuple[bool, str]:
    mismatch = int(np.count_nonzero(got != want))
    return mismatch <= MAX_CODE_MISMATCH_FRACTION * got.size, f"{mismatch}/{got.size} codes differ"


def _within_bound(x: Any, codes: Any, scales: Any, fmt: QuantFormat, per_token: bool) -> bool:
    x_hat = ref.dequantize(codes, scales, fmt, per_token)
    absmax = np.max(np.abs(x), axis=-1 if per_token else 0)
    absmax = absmax[:, None] if per_token else absmax[None, :]
    bound = ref.error_bound(x, absmax, fmt)
    return bool(np.all(np.abs(x - x_hat) <= bound * (1 + BOUND_RTOL) + 1e-30))


def check_quant(
    backend: Any,
    rng: np.random.Generator,
    half: HalfFormat,
    fmt: QuantFormat,
    per_token: bool,
    num_rows: int = 37,
    row_len: int = 96,
) -> list[CheckResult]:
    tag = f"{fmt.value}_{half.value}_{'tok' if per_token else 'chan'}"
    bits = random_halves(rng, (num_rows, row_len), half)
    want_codes, want_scales = ref.quantize_halves(bits, half, fmt, per_token)
    codes, scales = backend.quantize(bits, half, fmt, per_token)
    codes_ok, detail = _compare_codes(codes, want_codes)
    scales_ok = np.array_equal(scales, want_scales)
    bound_ok = _within_bound(half_to_f32(bits, half), codes, scales, fmt, per_token)
    got_bits = backend.dequantize(want_codes, want_scales, half, fmt, per_token)
    want_bits = ref.dequantize_halves(want_codes, want_scales, half, fmt, per_token)
    return [
        _result(
            f"quant_{tag}",
            backend,
            codes_ok and scales_ok and bound_ok,
            f"{detail}; scales exact={scales_ok}; bound={bound_ok}",
        ),
        _result(f"dequant_{tag}", backend, np.array_equal(got_bits, want_bits)),
    ]


def check_fused(
    backend: Any, rng: np.random.Generator, geom: KvGeometry, half: HalfFormat, fmt: QuantFormat
) -> list[CheckResult]:
    tag = f"{fmt.value}_{half.value}"
    case = make_swap_case(rng, geom, half)
    codes = np.full(geom.host_pool_shape(case.num_host_blocks), 0xA5, np.uint8)
    scales = np.full(geom.host_scales_shape(case.num_host_blocks), np.nan, np.float32)
    want_codes, want_scales = codes.copy(), scales.copy()
    ref.swap_out_quant(
        case.layers, case.device_ids, case.host_ids, half, fmt, want_codes, want_scales
    )
    _, got_codes, got_scales = backend.fused(
        case.layers, case.device_ids, case.host_ids, codes, scales, geom, half, fmt, True
    )
    codes_ok, detail = _compare_codes(got_codes, want_codes)
    scales_ok = np.array_equal(got_scales, want_scales, equal_nan=True)
    poisoned = [np.full_like(a, 0xA5A5) for a in case.layers]
    want_layers = [a.copy() for a in poisoned]
    ref.swap_in_dequant(
        want_codes, want_scales, case.host_ids, half, fmt, want_layers, case.device_ids
    )
    got_layers, _, _ = backend.fused(
        poisoned, case.device_ids, case.host_ids, want_codes, want_scales, geom, half, fmt, False
    )
    in_ok = all(np.array_equal(g, w) for g, w in zip(got_layers, want_layers, strict=True))
    return [
        _result(
            f"swap_out_quant_{tag}",
            backend,
            codes_ok and scales_ok,
            f"{detail}; scales exact={scales_ok}",
        ),
        _result(f"swap_in_dequant_{tag}", backend, in_ok),
    ]


def run_checks(
    backend: Any,
    seed: int = 0,
    geom: KvGeometry = TINY_GEOMETRY,
    quick: bool = False,
    quant_shape: tuple[int, int] = (37, 96),
) -> list[CheckResult]:
    """All checks for one backend; quick keeps bf16 only (for the CPU interpreter)."""
    rng = np.random.default_rng(seed)
    halves = [HalfFormat.BF16] if quick else list(HalfFormat)
    results = _guard(backend, "swap", check_swap, rng, geom)
    for half in halves:
        for fmt in QuantFormat:
            for per_token in (True, False):
                results += _guard(
                    backend,
                    f"quant_{fmt.value}_{half.value}",
                    check_quant,
                    rng,
                    half,
                    fmt,
                    per_token,
                    *quant_shape,
                )
            results += _guard(
                backend, f"fused_{fmt.value}_{half.value}", check_fused, rng, geom, half, fmt
            )
    return results


def run_variant_checks(
    backend: Any, seed: int, geom: KvGeometry, quant_shape: tuple[int, int]
) -> list[CheckResult]:
    """Swap (out and in) and per-token quantize, both halves and formats: for backends that
    differ from the default only in their swap-in path or per-token kernel."""
    rng = np.random.default_rng(seed)
    results = _guard(backend, "swap", check_swap, rng, geom)
    for half in HalfFormat:
        for fmt in QuantFormat:
            results += _guard(
                backend,
                f"quant_{fmt.value}_{half.value}",
                check_quant,
                rng,
                half,
                fmt,
                True,
                *quant_shape,
            )
    return results


def _guard(backend: Any, name: str, fn: Any, *args: Any) -> list[CheckResult]:
    """Run one check group; an exception (a kernel that fails to build or launch) is a failure."""
    try:
        return list(fn(backend, *args))
    except Exception as err:
        return [_result(name, backend, False, f"raised: {str(err)[-600:]}")]


def make_backend(name: str, device: str) -> Any:
    from cachepilot_sim.kernels.backends import CudaBackend, TritonBackend

    return CudaBackend(device) if name == "cuda" else TritonBackend(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=["cuda", "triton"], default="triton")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    results = run_checks(make_backend(args.backend, args.device), args.seed, quick=args.quick)
    print(json.dumps([asdict(r) for r in results]))
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
