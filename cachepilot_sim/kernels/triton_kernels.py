"""Triton versions of the KV offload kernels: same layouts and float32 steps as `reference`.

Device layers are addressed as one base tensor plus per-layer byte offsets (the layers may be
separate allocations); the pinned host pools are passed as integer addresses, since Triton refuses
CPU tensors, and the SMs write them directly (zero-copy). Copies and fused kernels are persistent:
a fixed grid of programs strides over the (block, layer, K|V) chunks. Under TRITON_INTERPRET=1 the
same code runs on CPU tensors, which is how CI checks it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cachepilot_sim.kernels.layout import KvGeometry, QuantFormat

_RINT_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: (y + M) - M rounds |y| < 2**22 to RNE


@dataclass(frozen=True, slots=True)
class LayerTable:
    """Device layers as base tensor + byte offsets (int64 tensor on the layers' device)."""

    base: torch.Tensor
    offsets_bytes: torch.Tensor
    num_device_blocks: int


def make_layer_table(layers: Sequence[torch.Tensor]) -> LayerTable:
    """Describe per-layer tensors [2, num_device_blocks, block_size, heads, dim] to the kernels."""
    base = layers[0]
    offs = [t.data_ptr() - base.data_ptr() for t in layers]
    if any(o % 16 for o in offs):
        raise ValueError("every layer tensor must start 16-byte aligned relative to layer 0")
    table = torch.tensor(offs, dtype=torch.int64, device=base.device)
    return LayerTable(base, table, int(base.shape[1]))


@triton.jit
def _chunk_coords(c, device_ids, host_ids, num_layers, num_device_blocks):
    pair = c // (2 * num_layers)
    rem = c % (2 * num_layers)
    kv = rem % 2
    device_chunk = kv * num_device_blocks + tl.load(device_ids + pair)
    host_chunk = (tl.load(host_ids + pair) * num_layers + rem // 2) * 2 + kv
    return rem // 2, device_chunk, host_chunk


@triton.jit
def _swap_kernel(
    base_ptr,
    layer_offs,
    device_ids,
    host_ids,
    host_addr,
    num_chunks,
    num_layers,
    num_device_blocks,
    CHUNK_WORDS: tl.constexpr,
    BLOCK: tl.constexpr,
    OUT: tl.constexpr,
):
    """Copy 8-byte words of whole chunks between device layers and the host pool."""
    base = base_ptr.to(tl.pointer_type(tl.int64))
    host = host_addr.to(tl.pointer_type(tl.int64))
    offs = tl.arange(0, BLOCK)
    for c in range(tl.program_id(0), num_chunks, tl.num_programs(0)):
        layer, device_chunk, host_chunk = _chunk_coords(
            c, device_ids, host_ids, num_layers, num_device_blocks
        )
        dev_word0 = tl.load(layer_offs + layer) // 8 + device_chunk * CHUNK_WORDS
        dev_word0 = tl.multiple_of(dev_word0, 2)
        host_word0 = tl.multiple_of(host_chunk * CHUNK_WORDS, 2)
        for start in range(0, CHUNK_WORDS, BLOCK):
            o = start + offs
            m = o < CHUNK_WORDS
            # Chunks start 16-byte aligned: say so, or Triton emits 8-byte accesses.
            hp = tl.multiple_of(host + host_word0 + o, 16)
            dp = tl.multiple_of(base + dev_word0 + o, 16)
            if OUT:
                tl.store(hp, tl.load(dp, mask=m), mask=m)
            else:
                tl.store(dp, tl.load(hp, mask=m), mask=m)


def _native() -> bool:
    """Use the hardware conversions; the interpreter's fp8/bf16 rounding is not round-to-even."""
    return os.environ.get("TRITON_INTERPRET", "0") != "1"


@triton.jit
def _rint(y):
    return (y + _RINT_MAGIC) - _RINT_MAGIC


@triton.jit
def _to_fp8_bits(y, NATIVE: tl.constexpr):
    """|y| <= 448 -> FP8 e4m3 bits as uint8, round to nearest even (bit-exact emulation off-GPU)."""
    if NATIVE:
        bits = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        u = y.to(tl.uint32, bitcast=True)
        a = u & 0x7FFFFFFF
        r = (a + 0x7FFFF + ((a >> 20) & 1)) & 0xFFF00000  # RNE to 3 mantissa bits
        normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)  # rebias 127 -> 7
        sub = _rint(tl.abs(y) * 512.0).to(tl.uint32)  # multiples of 2**-9 below 2**-6
        code = tl.where(a >= 0x3C800000, normal, sub)  # 0x3C800000 = 2**-6
        bits = (code | ((u >> 24) & 0x80)).to(tl.uint8)
    return bits


@triton.jit
def _to_half(v, out_ty: tl.constexpr, NATIVE: tl.constexpr):
    """float32 -> bf16/fp16, round to nearest even."""
    if NATIVE or out_ty == tl.float16:
        h = v.to(out_ty)
    else:
        u = v.to(tl.uint32, bitcast=True)
        h = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return h


@triton.jit
def _quant_tile(x, QMAX: tl.constexpr, FP8: tl.constexpr, NATIVE: tl.constexpr):
    """Per-row symmetric quantization of a float32 tile -> (uint8 codes, float32 scales)."""
    amax = tl.max(tl.abs(x), axis=1)
    safe = tl.where(amax > 0, amax, 1.0)
    inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, QMAX, tl.float32), safe), 0.0)
    y = x * inv[:, None]
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if FP8:
        codes = _to_fp8_bits(y, NATIVE)
    else:
        codes = _rint(y).to(tl.int8).to(tl.uint8, bitcast=True)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32))
    return codes, scale


@triton.jit
def _decode(codes, FP8: tl.constexpr):
    if FP8:
        v = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        v = codes.to(tl.int8, bitcast=True).to(tl.float32)
    return v


@triton.jit
def _quant_tok_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    num_rows,
    row_len,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    QMAX: tl.constexpr,
    FP8: tl.constexpr,
    NATIVE: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    m = (rows[:, None] < num_rows) & (cols[None, :] < row_len)
    idx = rows[:, None].to(tl.int64) * row_len + cols[None, :]
    x = tl.load(x_ptr + idx, mask=m, other=0.0).to(tl.float32)
    codes, scale = _quant_tile(x, QMAX, FP8, NATIVE)
    tl.store(q_ptr + idx, codes, mask=m)
    tl.store(s_ptr + rows, scale, mask=rows < num_rows)


@triton.jit
def _col_absmax_kernel(x_ptr, amax_ptr, num_rows, row_len, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    m = (rows[:, None] < num_rows) & (cols[None, :] < row_len)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * row_len + cols[None, :], mask=m, other=0.0)
    tl.atomic_max(amax_ptr + cols, tl.max(tl.abs(x.to(tl.float32)), axis=0), mask=cols < row_len)


@triton.jit
def _quant_chan_kernel(
    x_ptr,
    amax_ptr,
    q_ptr,
    s_ptr,
    num_rows,
    row_len,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    QMAX: tl.constexpr,
    FP8: tl.constexpr,
    NATIVE: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    cm = cols < row_len
    m = (rows[:, None] < num_rows) & cm[None, :]
    idx = rows[:, None].to(tl.int64) * row_len + cols[None, :]
    amax = tl.load(amax_ptr + cols, mask=cm, other=0.0)
    safe = tl.where(amax > 0, amax, 1.0)
    inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, QMAX, tl.float32), safe), 0.0)
    y = tl.load(x_ptr + idx, mask=m, other=0.0).to(tl.float32) * inv[None, :]
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if FP8:
        codes = _to_fp8_bits(y, NATIVE)
    else:
        codes = _rint(y).to(tl.int8).to(tl.uint8, bitcast=True)
    tl.store(q_ptr + idx, codes, mask=m)
    if tl.program_id(0) == 0:
        scale = tl.math.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32))
        tl.store(s_ptr + cols, scale, mask=cm)


@triton.jit
def _dequant_kernel(
    q_ptr,
    s_ptr,
    x_ptr,
    num_rows,
    row_len,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    FP8: tl.constexpr,
    PER_TOKEN: tl.constexpr,
    NATIVE: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    m = (rows[:, None] < num_rows) & (cols[None, :] < row_len)
    idx = rows[:, None].to(tl.int64) * row_len + cols[None, :]
    v = _decode(tl.load(q_ptr + idx, mask=m, other=0), FP8)
    if PER_TOKEN:
        s = tl.load(s_ptr + rows, mask=rows < num_rows, other=0.0)[:, None]
    else:
        s = tl.load(s_ptr + cols, mask=cols < row_len, other=0.0)[None, :]
    tl.store(x_ptr + idx, _to_half(v * s, x_ptr.dtype.element_ty, NATIVE), mask=m)


@triton.jit
def _swap_out_quant_kernel(
    base_ptr,
    layer_offs,
    device_ids,
    host_ids,
    codes_addr,
    scales_addr,
    num_chunks,
    num_layers,
    num_device_blocks,
    BLOCK_SIZE: tl.constexpr,
    ROW_LEN: tl.constexpr,
    TOKS: tl.constexpr,
    COLS: tl.constexpr,
    QMAX: tl.constexpr,
    FP8: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """Fused gather + per-token quantize of whole chunks, written to the host pools."""
    codes_out = codes_addr.to(tl.pointer_type(tl.uint8))
    scales_out = scales_addr.to(tl.pointer_type(tl.float32))
    toks = tl.arange(0, TOKS)
    cols = tl.arange(0, COLS)
    m = (toks[:, None] < BLOCK_SIZE) & (cols[None, :] < ROW_LEN)
    tile = toks[:, None] * ROW_LEN + cols[None, :]
    for c in range(tl.program_id(0), num_chunks, tl.num_programs(0)):
        layer, device_chunk, host_chunk = _chunk_coords(
            c, device_ids, host_ids, num_layers, num_device_blocks
        )
        elem0 = tl.load(layer_offs + layer) // 2 + device_chunk * (BLOCK_SIZE * ROW_LEN)
        x = tl.load(base_ptr + tl.multiple_of(elem0, 8) + tile, mask=m, other=0.0)
        codes, scale = _quant_tile(x.to(tl.float32), QMAX, FP8, NATIVE)
        code0 = tl.multiple_of(host_chunk * (BLOCK_SIZE * ROW_LEN), 16)
        dst = tl.max_contiguous(tl.multiple_of(codes_out + code0 + tile, [1, 16]), [1, 16])
        tl.store(dst, codes, mask=m)
        tl.store(scales_out + host_chunk * BLOCK_SIZE + toks, scale, mask=toks < BLOCK_SIZE)


@triton.jit
def _swap_in_dequant_kernel(
    base_ptr,
    layer_offs,
    device_ids,
    host_ids,
    codes_addr,
    scales_addr,
    num_chunks,
    num_layers,
    num_device_blocks,
    BLOCK_SIZE: tl.constexpr,
    ROW_LEN: tl.constexpr,
    TOKS: tl.constexpr,
    COLS: tl.constexpr,
    FP8: tl.constexpr,
    NATIVE: tl.constexpr,
):
    codes_in = codes_addr.to(tl.pointer_type(tl.uint8))
    scales_in = scales_addr.to(tl.pointer_type(tl.float32))
    toks = tl.arange(0, TOKS)
    cols = tl.arange(0, COLS)
    m = (toks[:, None] < BLOCK_SIZE) & (cols[None, :] < ROW_LEN)
    tile = toks[:, None] * ROW_LEN + cols[None, :]
    for c in range(tl.program_id(0), num_chunks, tl.num_programs(0)):
        layer, device_chunk, host_chunk = _chunk_coords(
            c, device_ids, host_ids, num_layers, num_device_blocks
        )
        code0 = tl.multiple_of(host_chunk * (BLOCK_SIZE * ROW_LEN), 16)
        src = tl.max_contiguous(tl.multiple_of(codes_in + code0 + tile, [1, 16]), [1, 16])
        v = _decode(tl.load(src, mask=m, other=0), FP8)
        s = tl.load(scales_in + host_chunk * BLOCK_SIZE + toks, mask=toks < BLOCK_SIZE, other=0.0)
        elem0 = tl.load(layer_offs + layer) // 2 + device_chunk * (BLOCK_SIZE * ROW_LEN)
        out = _to_half(v * s[:, None], base_ptr.dtype.element_ty, NATIVE)
        tl.store(base_ptr + tl.multiple_of(elem0, 8) + tile, out, mask=m)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _grid_1d(num_chunks: int, max_programs: int) -> tuple[int]:
    return (max(1, min(num_chunks, max_programs)),)


def swap(
    table: LayerTable,
    geom: KvGeometry,
    device_ids: torch.Tensor,
    host_ids: torch.Tensor,
    host_addr: int,
    out: bool,
    max_programs: int = 1024,
    num_warps: int = 4,
) -> None:
    """Swap-out (out=True: device blocks -> host pool) or swap-in of the paired blocks.

    device_ids/host_ids: int64 tensors on the device; host_addr: address of the host pool.
    """
    num_chunks = int(device_ids.numel()) * geom.num_layers * 2
    chunk_words = geom.chunk_bytes // 8
    _swap_kernel[_grid_1d(num_chunks, max_programs)](
        table.base,
        table.offsets_bytes,
        device_ids,
        host_ids,
        host_addr,
        num_chunks,
        geom.num_layers,
        table.num_device_blocks,
        CHUNK_WORDS=chunk_words,
        BLOCK=min(2048, _pow2(chunk_words)),
        OUT=out,
        num_warps=num_warps,
    )


def quantize_per_token(
    x: torch.Tensor,
    fmt: QuantFormat,
    codes: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    rows_per_program: int = 4,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [num_rows, row_len] bf16/fp16 -> (uint8 codes, same shape; f32 scales [num_rows])."""
    num_rows, row_len = x.shape
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if codes is None else codes
    scales = (
        torch.empty(num_rows, dtype=torch.float32, device=x.device) if scales is None else scales
    )
    grid = (triton.cdiv(num_rows, rows_per_program),)
    _quant_tok_kernel[grid](
        x,
        codes,
        scales,
        num_rows,
        row_len,
        ROWS=rows_per_program,
        COLS=_pow2(row_len),
        QMAX=fmt.qmax,
        FP8=fmt is QuantFormat.FP8,
        NATIVE=_native(),
        num_warps=num_warps,
    )
    return codes, scales


def quantize_per_channel(x: torch.Tensor, fmt: QuantFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """x [num_rows, row_len] -> (codes, scales f32 [row_len]); two passes (column absmax first)."""
    num_rows, row_len = x.shape
    rows, cols = 64, min(128, _pow2(row_len))
    amax = torch.zeros(row_len, dtype=torch.float32, device=x.device)
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scales = torch.empty(row_len, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_rows, rows), triton.cdiv(row_len, cols))
    _col_absmax_kernel[grid](x, amax, num_rows, row_len, ROWS=rows, COLS=cols)
    _quant_chan_kernel[grid](
        x,
        amax,
        codes,
        scales,
        num_rows,
        row_len,
        ROWS=rows,
        COLS=cols,
        QMAX=fmt.qmax,
        FP8=fmt is QuantFormat.FP8,
        NATIVE=_native(),
    )
    return codes, scales


def dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    fmt: QuantFormat,
    dtype: torch.dtype,
    per_token: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """codes [num_rows, row_len] uint8 + scales -> values in `dtype` (bf16/fp16), RNE."""
    num_rows, row_len = codes.shape
    out = torch.empty(codes.shape, dtype=dtype, device=codes.device) if out is None else out
    rows, cols = 16, min(1024, _pow2(row_len))
    grid = (triton.cdiv(num_rows, rows), triton.cdiv(row_len, cols))
    _dequant_kernel[grid](
        codes,
        scales,
        out,
        num_rows,
        row_len,
        ROWS=rows,
        COLS=cols,
        FP8=fmt is QuantFormat.FP8,
        PER_TOKEN=per_token,
        NATIVE=_native(),
    )
    return out


def swap_out_quant(
    table: LayerTable,
    geom: KvGeometry,
    device_ids: torch.Tensor,
    host_ids: torch.Tensor,
    codes_addr: int,
    scales_addr: int,
    fmt: QuantFormat,
    max_programs: int = 1024,
    num_warps: int = 8,
) -> None:
    """Fused swap-out with per-token quantization into the host code and scale pools."""
    num_chunks = int(device_ids.numel()) * geom.num_layers * 2
    _swap_out_quant_kernel[_grid_1d(num_chunks, max_programs)](
        table.base,
        table.offsets_bytes,
        device_ids,
        host_ids,
        codes_addr,
        scales_addr,
        num_chunks,
        geom.num_layers,
        table.num_device_blocks,
        BLOCK_SIZE=geom.block_size,
        ROW_LEN=geom.row_len,
        TOKS=_pow2(geom.block_size),
        COLS=_pow2(geom.row_len),
        QMAX=fmt.qmax,
        FP8=fmt is QuantFormat.FP8,
        NATIVE=_native(),
        num_warps=num_warps,
    )


def swap_in_dequant(
    table: LayerTable,
    geom: KvGeometry,
    device_ids: torch.Tensor,
    host_ids: torch.Tensor,
    codes_addr: int,
    scales_addr: int,
    fmt: QuantFormat,
    max_programs: int = 1024,
    num_warps: int = 8,
) -> None:
    """Fused reload: dequantize host blocks into the device blocks `device_ids`."""
    num_chunks = int(device_ids.numel()) * geom.num_layers * 2
    _swap_in_dequant_kernel[_grid_1d(num_chunks, max_programs)](
        table.base,
        table.offsets_bytes,
        device_ids,
        host_ids,
        codes_addr,
        scales_addr,
        num_chunks,
        geom.num_layers,
        table.num_device_blocks,
        BLOCK_SIZE=geom.block_size,
        ROW_LEN=geom.row_len,
        TOKS=_pow2(geom.block_size),
        COLS=_pow2(geom.row_len),
        FP8=fmt is QuantFormat.FP8,
        NATIVE=_native(),
        num_warps=num_warps,
    )
