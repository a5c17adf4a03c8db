"""NumPy definitions of the KV offload kernels: what the CUDA and Triton versions must reproduce.

Swap-out/in copies (layer, K|V, block) chunks between the paged device layout and the host pool
(see `layout`). Quantization is symmetric: scale = absmax / qmax, code = round(x / scale) with the
float32 steps the kernels take (inv = qmax / absmax, code = rint(x * inv)), dequantized x' = code *
scale. Error bounds (exact arithmetic; float32 rounding adds a few ulp, so tests allow 1e-5
relative):
INT8 |x - x'| <= absmax / 254; FP8 e4m3 |x - x'| <= max(|x| / 16, scale / 1024).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from cachepilot_sim.kernels.formats import (
    F32,
    U8,
    U16,
    HalfFormat,
    f32_to_fp8,
    f32_to_half,
    fp8_to_f32,
    half_to_f32,
)
from cachepilot_sim.kernels.layout import QuantFormat

I64 = npt.NDArray[np.int64]
Layers = Sequence[npt.NDArray[np.generic]]


def swap_out(
    layers: Layers, device_ids: I64, host_ids: I64, host_pool: npt.NDArray[np.generic]
) -> None:
    """Copy device blocks `device_ids[i]` of every layer (K and V) into host blocks `host_ids[i]`.

    layers[l]: [2, num_device_blocks, ...]; host_pool: [num_host_blocks, num_layers, 2, ...].
    """
    for layer_idx, layer in enumerate(layers):
        host_pool[host_ids, layer_idx] = np.swapaxes(layer[:, device_ids], 0, 1)


def swap_in(
    host_pool: npt.NDArray[np.generic], host_ids: I64, layers: Layers, device_ids: I64
) -> None:
    """Copy host blocks `host_ids[i]` back into device blocks `device_ids[i]` of every layer."""
    for layer_idx, layer in enumerate(layers):
        layer[:, device_ids] = np.swapaxes(host_pool[host_ids, layer_idx], 0, 1)


def encode(y: F32, fmt: QuantFormat) -> U8:
    """Codes of already-scaled values y = x * inv_scale, as bytes (INT8 two's complement)."""
    if fmt is QuantFormat.INT8:
        return np.clip(np.rint(y), -127, 127).astype(np.int8).view(np.uint8)
    return f32_to_fp8(y)


def decode(codes: U8, fmt: QuantFormat) -> F32:
    if fmt is QuantFormat.INT8:
        return codes.view(np.int8).astype(np.float32)
    return fp8_to_f32(codes)


def _inv_and_scale(absmax: F32, fmt: QuantFormat) -> tuple[F32, F32]:
    qmax = np.float32(fmt.qmax)
    safe = np.where(absmax > 0, absmax, np.float32(1.0))
    inv = np.where(absmax > 0, qmax / safe, np.float32(0.0)).astype(np.float32)
    return inv, (absmax / qmax).astype(np.float32)


def quantize_per_token(x: F32, fmt: QuantFormat) -> tuple[U8, F32]:
    """x [num_rows, row_len] float32 -> (codes [num_rows, row_len] uint8, scales [num_rows])."""
    absmax = np.max(np.abs(x), axis=-1).astype(np.float32)
    inv, scales = _inv_and_scale(absmax, fmt)
    return encode((x * inv[..., None]).astype(np.float32), fmt), scales


def quantize_per_channel(x: F32, fmt: QuantFormat) -> tuple[U8, F32]:
    """x [num_rows, row_len] -> (codes, scales [row_len]): one scale per column over all rows."""
    absmax = np.max(np.abs(x), axis=0).astype(np.float32)
    inv, scales = _inv_and_scale(absmax, fmt)
    return encode((x * inv[None, :]).astype(np.float32), fmt), scales


def dequantize(codes: U8, scales: F32, fmt: QuantFormat, per_token: bool = True) -> F32:
    """Float32 values code * scale (scales per row if per_token, else per column)."""
    s = scales[..., None] if per_token else scales[None, :]
    return (decode(codes, fmt) * s).astype(np.float32)


def quantize_halves(
    bits: U16, half: HalfFormat, fmt: QuantFormat, per_token: bool = True
) -> tuple[U8, F32]:
    """The kernels' quantize: 16-bit input bits [num_rows, row_len] -> codes and scales."""
    x = half_to_f32(bits, half)
    return quantize_per_token(x, fmt) if per_token else quantize_per_channel(x, fmt)


def dequantize_halves(
    codes: U8, scales: F32, half: HalfFormat, fmt: QuantFormat, per_token: bool = True
) -> U16:
    """The kernels' dequantize: codes -> 16-bit bits, rounded to nearest even."""
    return f32_to_half(dequantize(codes, scales, fmt, per_token), half)


def error_bound(x: F32, absmax: F32, fmt: QuantFormat) -> F32:
    """Largest |x - x'| the format allows per element (absmax broadcast against x)."""
    if fmt is QuantFormat.INT8:
        return np.broadcast_to(absmax / np.float32(254.0), x.shape).astype(np.float32)
    scale = absmax / np.float32(448.0)
    return np.maximum(np.abs(x) / np.float32(16.0), scale / np.float32(1024.0)).astype(np.float32)


def swap_out_quant(
    layers: Sequence[U16],
    device_ids: I64,
    host_ids: I64,
    half: HalfFormat,
    fmt: QuantFormat,
    host_codes: U8,
    host_scales: F32,
) -> None:
    """Fused swap-out: quantize each token row of the chosen blocks into the host pools.

    layers[l]: [2, num_device_blocks, block_size, num_kv_heads, head_dim] uint16 bits;
    host_codes: [num_host_blocks, num_layers, 2, block_size, num_kv_heads, head_dim] uint8;
    host_scales: [num_host_blocks, num_layers, 2, block_size] float32.
    """
    for layer_idx, layer in enumerate(layers):
        blocks = np.swapaxes(layer[:, device_ids], 0, 1)  # [pairs, 2, block_size, heads, dim]
        rows = blocks.reshape(-1, blocks.shape[-2] * blocks.shape[-1])
        codes, scales = quantize_halves(rows, half, fmt)
        host_codes[host_ids, layer_idx] = codes.reshape(blocks.shape)
        host_scales[host_ids, layer_idx] = scales.reshape(blocks.shape[:3])


def swap_in_dequant(
    host_codes: U8,
    host_scales: F32,
    host_ids: I64,
    half: HalfFormat,
    fmt: QuantFormat,
    layers: Sequence[U16],
    device_ids: I64,
) -> None:
    """Fused reload: dequantize host blocks `host_ids[i]` into device blocks `device_ids[i]`."""
    for layer_idx, layer in enumerate(layers):
        codes = host_codes[host_ids, layer_idx]  # [pairs, 2, block_size, heads, dim]
        rows = codes.reshape(-1, codes.shape[-2] * codes.shape[-1])
        scales = host_scales[host_ids, layer_idx].reshape(-1)
        bits = dequantize_halves(rows, scales, half, fmt).reshape(codes.shape)
        layer[:, device_ids] = np.swapaxes(bits, 0, 1)
