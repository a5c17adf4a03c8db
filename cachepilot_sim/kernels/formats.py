"""Bit-exact NumPy models of the number formats the kernels use: bf16 and fp16 stored as uint16
bits, FP8 e4m3 (finite, saturating, round to nearest even) stored as uint8 bits.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
U16 = npt.NDArray[np.uint16]
U8 = npt.NDArray[np.uint8]

FP8_MAX = 448.0
_FP8_MIN_NORMAL_EXP = -6
_FP8_MANTISSA_BITS = 3


class HalfFormat(StrEnum):
    """16-bit storage format of the unquantized KV."""

    BF16 = "bf16"
    FP16 = "fp16"


def half_to_f32(bits: U16, fmt: HalfFormat) -> F32:
    """Exact widening of 16-bit values (given as their bits) to float32."""
    if fmt is HalfFormat.BF16:
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


def f32_to_half(x: F32, fmt: HalfFormat) -> U16:
    """Round float32 to 16 bits, to nearest even (NaN is not supported, as in the kernels)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if fmt is HalfFormat.FP16:
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f32_to_fp8(x: F32) -> U8:
    """Encode float32 as FP8 e4m3 bits: clamp to +-448, round to nearest even (subnormals kept)."""
    x = np.clip(np.asarray(x, dtype=np.float32), -FP8_MAX, FP8_MAX).astype(np.float64)
    mag = np.abs(x)
    _, exp = np.frexp(np.where(mag > 0, mag, 1.0))  # mag = m * 2**exp with m in [0.5, 1)
    unbiased = np.maximum(exp - 1, _FP8_MIN_NORMAL_EXP)
    ulp = np.ldexp(1.0, unbiased - _FP8_MANTISSA_BITS)
    rounded = np.rint(mag / ulp) * ulp  # exact: division by a power of two
    _, exp_r = np.frexp(np.where(rounded > 0, rounded, 1.0))
    is_normal = rounded >= 2.0**_FP8_MIN_NORMAL_EXP
    e_field = np.where(is_normal, exp_r - 1 + 7, 0)
    mant_scale = np.ldexp(1.0, np.where(is_normal, exp_r - 1, _FP8_MIN_NORMAL_EXP) - 3)
    mant = np.rint(rounded / mant_scale).astype(np.int64) - np.where(is_normal, 8, 0)
    bits = (e_field.astype(np.int64) << 3) | mant
    bits = np.where(rounded == 0, 0, bits) | np.where(np.signbit(x), 0x80, 0)
    return bits.astype(np.uint8)


def _fp8_table() -> F32:
    codes = np.arange(256)
    e_field, mant, neg = (codes >> 3) & 0xF, codes & 7, codes >> 7
    mag = np.where(e_field == 0, np.ldexp(mant / 8.0, -6), np.ldexp(1.0 + mant / 8.0, e_field - 7))
    mag = np.where((e_field == 15) & (mant == 7), np.nan, mag)  # e4m3fn: only NaN, no infinity
    return np.where(neg == 1, -mag, mag).astype(np.float32)


_FP8_VALUES = _fp8_table()


def fp8_to_f32(bits: U8) -> F32:
    """Decode FP8 e4m3 bits exactly."""
    return _FP8_VALUES[np.asarray(bits, dtype=np.uint8)]
