"""CuPy `RawModule` loader and launchers for the CUDA kernels in `kernels_cuda/`.

Launchers take raw device/host addresses (ints), so the caller may own memory through torch, CuPy or
anything else; the host pools must be pinned (mapped) memory, which the SMs write directly. Kernels
run on CuPy's current stream (the legacy default stream unless the caller sets one).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from cachepilot_sim.kernels.formats import HalfFormat
from cachepilot_sim.kernels.layout import KvGeometry, QuantFormat

KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels_cuda"
CUDA_SOURCES = ("kv_swap.cu", "kv_quant.cu", "kv_swap_quant.cu")
MAX_FUSED_BLOCK_SIZE = 256  # KV_MAX_BLOCK_SIZE in kv_swap_quant.cu (shared-memory scale buffer)


@functools.cache
def load_module(source: str) -> Any:
    """Compile one .cu file with NVRTC for the current device (cached per process)."""
    import cupy

    code = (KERNEL_DIR / source).read_text()
    return cupy.RawModule(code=code, options=("-std=c++17", f"-I{KERNEL_DIR}"), backend="nvrtc")


def _fn(source: str, name: str) -> Any:
    return load_module(source).get_function(name)


def _p(addr: int) -> np.uint64:
    return np.uint64(addr)


def _row_variant(row_len: int) -> str:
    """Kernel suffix for the per-warp register budget: rows of up to 1024 or 4096 values."""
    row_vec = row_len // 8
    if row_vec <= 128:
        return "v4"
    if row_vec <= 512:
        return "v16"
    raise ValueError(f"row_len {row_len} > 4096 values is not supported by the per-token kernels")


@functools.cache
def num_sms() -> int:
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def swap(
    layer_ptrs_addr: int,
    device_ids_addr: int,
    host_ids_addr: int,
    num_pairs: int,
    geom: KvGeometry,
    num_device_blocks: int,
    host_addr: int,
    out: bool,
    unroll: int = 8,
    threads: int = 256,
    max_ctas: int = 1 << 16,
) -> None:
    """Zero-copy swap-out (out=True) or swap-in of `num_pairs` blocks in one launch.

    layer_ptrs_addr: device array of num_layers uint64 layer base addresses; *_ids_addr: device
    int64 arrays of length num_pairs; host_addr: pinned pool [num_host_blocks, layers, 2, chunk].
    """
    name = f"swap_{'out' if out else 'in'}_u{unroll}"
    num_chunks = num_pairs * geom.num_layers * 2
    grid = max(1, min(num_chunks, max_ctas))
    _fn("kv_swap.cu", name)(
        (grid,),
        (threads,),
        (
            _p(layer_ptrs_addr),
            _p(device_ids_addr),
            _p(host_ids_addr),
            np.int64(num_pairs),
            np.int32(geom.num_layers),
            np.int64(num_device_blocks),
            np.int64(geom.chunk_bytes),
            _p(host_addr),
        ),
    )


def gather(
    layer_ptrs_addr: int,
    device_ids_addr: int,
    staging_ids_addr: int,
    num_pairs: int,
    geom: KvGeometry,
    num_device_blocks: int,
    staging_addr: int,
    inverse: bool = False,
) -> None:
    """Device-side gather into (or, inverse, scatter from) a staging buffer in host-pool layout."""
    name = "scatter_u8" if inverse else "gather_u8"
    num_chunks = num_pairs * geom.num_layers * 2
    _fn("kv_swap.cu", name)(
        (max(1, num_chunks),),
        (256,),
        (
            _p(layer_ptrs_addr),
            _p(device_ids_addr),
            _p(staging_ids_addr),
            np.int64(num_pairs),
            np.int32(geom.num_layers),
            np.int64(num_device_blocks),
            np.int64(geom.chunk_bytes),
            _p(staging_addr),
        ),
    )


def quantize_per_token(
    x_addr: int,
    codes_addr: int,
    scales_addr: int,
    num_rows: int,
    row_len: int,
    half: HalfFormat,
    fmt: QuantFormat,
    threads: int = 256,
    ctas_per_sm: int = 1 << 20,
    rows_per_warp: int = 1,
) -> None:
    """x [num_rows, row_len] 16-bit -> codes (1 byte each), f32 scales [num_rows].

    One warp quantizes rows_per_warp rows at a time (1, or 2 for rows of up to 1024 values);
    the grid is one CTA per threads/32*rows_per_warp rows, capped at ctas_per_sm per SM.
    """
    variant = _row_variant(row_len)
    if rows_per_warp == 2 and variant != "v4":
        raise ValueError("rows_per_warp=2 is built for rows of up to 1024 values only")
    suffix = "_r2" if rows_per_warp == 2 else ""
    name = f"quant_tok_{fmt.value}_{half.value}_{variant}{suffix}"
    rows_per_cta = threads // 32 * rows_per_warp
    grid = max(1, min(-(-num_rows // rows_per_cta), num_sms() * ctas_per_sm))
    _fn("kv_quant.cu", name)(
        (grid,),
        (threads,),
        (_p(x_addr), _p(codes_addr), _p(scales_addr), np.int64(num_rows), np.int32(row_len // 8)),
    )


def quantize_per_channel(
    x_addr: int,
    codes_addr: int,
    col_absmax_addr: int,
    scales_addr: int,
    num_rows: int,
    row_len: int,
    half: HalfFormat,
    fmt: QuantFormat,
) -> None:
    """Two launches: column absmax (col_absmax must be zeroed f32 [row_len]), then quantize."""
    row_vec = row_len // 8
    col_grid = (-(-row_vec // 128), max(1, min(num_rows, 1024)))
    _fn("kv_quant.cu", f"col_absmax_{half.value}")(
        col_grid, (128,), (_p(x_addr), _p(col_absmax_addr), np.int64(num_rows), np.int32(row_vec))
    )
    grid = max(1, min(-(-num_rows * row_vec // 256), num_sms() * 16))
    _fn("kv_quant.cu", f"quant_chan_{fmt.value}_{half.value}")(
        (grid,),
        (256,),
        (
            _p(x_addr),
            _p(codes_addr),
            _p(col_absmax_addr),
            _p(scales_addr),
            np.int64(num_rows),
            np.int32(row_vec),
        ),
    )


def dequantize(
    codes_addr: int,
    scales_addr: int,
    x_addr: int,
    num_rows: int,
    row_len: int,
    half: HalfFormat,
    fmt: QuantFormat,
    per_token: bool = True,
) -> None:
    """codes + scales (per row if per_token, else per column) -> 16-bit values, RNE."""
    name = f"dequant_{'tok' if per_token else 'chan'}_{fmt.value}_{half.value}"
    row_vec = row_len // 8
    grid = max(1, min(-(-num_rows * row_vec // 256), num_sms() * 16))
    _fn("kv_quant.cu", name)(
        (grid,),
        (256,),
        (_p(codes_addr), _p(scales_addr), _p(x_addr), np.int64(num_rows), np.int32(row_vec)),
    )


def swap_out_quant(
    layer_ptrs_addr: int,
    device_ids_addr: int,
    host_ids_addr: int,
    num_pairs: int,
    geom: KvGeometry,
    num_device_blocks: int,
    codes_addr: int,
    scales_addr: int,
    half: HalfFormat,
    fmt: QuantFormat,
    threads: int = 256,
) -> None:
    """Fused zero-copy swap-out with per-token quantization (codes and scales to host pools)."""
    _fused(
        "out",
        layer_ptrs_addr,
        device_ids_addr,
        host_ids_addr,
        num_pairs,
        geom,
        num_device_blocks,
        codes_addr,
        scales_addr,
        half,
        fmt,
        threads,
    )


def swap_in_dequant(
    layer_ptrs_addr: int,
    device_ids_addr: int,
    host_ids_addr: int,
    num_pairs: int,
    geom: KvGeometry,
    num_device_blocks: int,
    codes_addr: int,
    scales_addr: int,
    half: HalfFormat,
    fmt: QuantFormat,
    threads: int = 256,
) -> None:
    """Fused zero-copy reload: host codes and scales -> dequantized device blocks."""
    _fused(
        "in",
        layer_ptrs_addr,
        device_ids_addr,
        host_ids_addr,
        num_pairs,
        geom,
        num_device_blocks,
        codes_addr,
        scales_addr,
        half,
        fmt,
        threads,
    )


def _fused(
    direction: str,
    layer_ptrs_addr: int,
    device_ids_addr: int,
    host_ids_addr: int,
    num_pairs: int,
    geom: KvGeometry,
    num_device_blocks: int,
    codes_addr: int,
    scales_addr: int,
    half: HalfFormat,
    fmt: QuantFormat,
    threads: int,
) -> None:
    if geom.block_size > MAX_FUSED_BLOCK_SIZE or geom.itemsize_bytes != 2:
        raise ValueError(f"fused kernels need 16-bit KV and block_size <= {MAX_FUSED_BLOCK_SIZE}")
    if direction == "out":
        name = f"swap_out_quant_{fmt.value}_{half.value}_{_row_variant(geom.row_len)}"
    else:
        name = f"swap_in_dequant_{fmt.value}_{half.value}"
    num_chunks = num_pairs * geom.num_layers * 2
    _fn("kv_swap_quant.cu", name)(
        (max(1, num_chunks),),
        (threads,),
        (
            _p(layer_ptrs_addr),
            _p(device_ids_addr),
            _p(host_ids_addr),
            np.int64(num_pairs),
            np.int32(geom.num_layers),
            np.int64(num_device_blocks),
            np.int32(geom.block_size),
            np.int32(geom.row_len // 8),
            _p(codes_addr),
            _p(scales_addr),
        ),
    )
