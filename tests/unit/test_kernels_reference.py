"""The NumPy reference that defines the kernels: number formats bit-exact, the documented
quantization error bounds, and swap-out/in as inverse copies between the two layouts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.kernels import reference as ref
from cachepilot_sim.kernels.check import BOUND_RTOL, make_swap_case, random_halves
from cachepilot_sim.kernels.formats import (
    HalfFormat,
    f32_to_fp8,
    f32_to_half,
    fp8_to_f32,
    half_to_f32,
)
from cachepilot_sim.kernels.layout import LLAMA3_8B, KvGeometry, QuantFormat

TINY = KvGeometry(num_layers=3, block_size=4, num_kv_heads=2, head_dim=16)


def _wide_values(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp(rng.uniform(-14, 7, n))).astype(np.float32)


def test_fp8_codes_match_torch_float8_e4m3fn() -> None:
    torch = pytest.importorskip("torch")
    x = np.clip(_wide_values(0, 100_000), -448, 448)
    want = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(f32_to_fp8(x), want)


def test_fp8_decode_inverts_encode_on_every_finite_code() -> None:
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    assert np.array_equal(f32_to_fp8(fp8_to_f32(codes)), np.where(codes == 0x80, 0x80, codes))


def test_bf16_rounding_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    x = _wide_values(1, 100_000)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(f32_to_half(x, HalfFormat.BF16), want)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), fmt=st.sampled_from(list(QuantFormat)), per_token=st.booleans()
)
def test_dequantized_values_stay_within_documented_bound(
    seed: int, fmt: QuantFormat, per_token: bool
) -> None:
    bits = random_halves(np.random.default_rng(seed), (24, 64), HalfFormat.BF16)
    x = half_to_f32(bits, HalfFormat.BF16)
    codes, scales = ref.quantize_halves(bits, HalfFormat.BF16, fmt, per_token)
    x_hat = ref.dequantize(codes, scales, fmt, per_token)
    absmax = np.max(np.abs(x), axis=-1 if per_token else 0)
    absmax = absmax[:, None] if per_token else absmax[None, :]
    bound = ref.error_bound(x, absmax, fmt)
    assert np.all(np.abs(x - x_hat) <= bound * (1 + BOUND_RTOL))


def test_int8_bound_is_absmax_over_254_and_reached_at_half_steps() -> None:
    x = np.array([[127.0, 0.5, -0.5, 1.5]], dtype=np.float32)
    codes, scales = ref.quantize_per_token(x, QuantFormat.INT8)
    assert scales[0] == np.float32(1.0)
    assert list(codes.view(np.int8)[0]) == [127, 0, 0, 2]  # ties to even
    err = np.abs(x - ref.dequantize(codes, scales, QuantFormat.INT8))
    assert err.max() == pytest.approx(127.0 / 254.0)


def test_all_zero_row_quantizes_to_zero_codes_and_scale_without_nan() -> None:
    for fmt in QuantFormat:
        codes, scales = ref.quantize_per_token(np.zeros((2, 8), np.float32), fmt)
        assert not codes.any() and not scales.any()


def test_swap_in_restores_what_swap_out_wrote() -> None:
    case = make_swap_case(np.random.default_rng(5), TINY, HalfFormat.BF16, num_pairs=4)
    pool = np.full(TINY.host_pool_shape(case.num_host_blocks), 0xA5A5, np.uint16)
    ref.swap_out(case.layers, case.device_ids, case.host_ids, pool)
    for i, (d, h) in enumerate(zip(case.device_ids, case.host_ids, strict=True)):
        assert np.array_equal(pool[h, 1, 0], case.layers[1][0, d]), i
    restored = [np.zeros_like(a) for a in case.layers]
    ref.swap_in(pool, case.host_ids, restored, case.device_ids)
    for got, want in zip(restored, case.layers, strict=True):
        assert np.array_equal(got[:, case.device_ids], want[:, case.device_ids])


def test_fused_swap_out_equals_swap_then_quantize() -> None:
    case = make_swap_case(np.random.default_rng(6), TINY, HalfFormat.FP16)
    pool = np.zeros(TINY.host_pool_shape(case.num_host_blocks), np.uint16)
    ref.swap_out(case.layers, case.device_ids, case.host_ids, pool)
    codes = np.zeros(TINY.host_pool_shape(case.num_host_blocks), np.uint8)
    scales = np.zeros(TINY.host_scales_shape(case.num_host_blocks), np.float32)
    ref.swap_out_quant(
        case.layers, case.device_ids, case.host_ids, HalfFormat.FP16, QuantFormat.FP8, codes, scales
    )
    rows = pool[case.host_ids].reshape(-1, TINY.row_len)
    want_codes, want_scales = ref.quantize_halves(rows, HalfFormat.FP16, QuantFormat.FP8)
    assert np.array_equal(codes[case.host_ids].reshape(-1, TINY.row_len), want_codes)
    assert np.array_equal(scales[case.host_ids].reshape(-1), want_scales)


def test_llama3_8b_geometry_has_32_kib_chunks_and_2_mib_blocks() -> None:
    assert LLAMA3_8B.chunk_bytes == 32 * 1024
    assert LLAMA3_8B.block_bytes == 2 * 1024 * 1024


def test_geometry_rejects_chunks_that_are_not_16_byte_multiples() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        KvGeometry(num_layers=1, block_size=1, num_kv_heads=1, head_dim=4, itemsize_bytes=1)
