"""CuPy `RawModule` loader and launchers for the CUDA kernels in `kernels_cuda/`.

Launchers take raw device/host addresses (ints), so the caller may own memory through torch, CuPy or
anything else; the host pools must be pinned (mapped) memory, which the SMs write directly. What
every launcher shares comes in small bundles: `DeviceKv` (the paged cache on the device),
`BlockPairs` (which blocks move), `SwapInJob` (a swap-in with its staging buffer), `QuantPool` (a
quantized host tier) and `QuantRows` (a matrix and its codes and scales). Kernels run on CuPy's
current stream (the legacy default stream unless the caller sets one). The swap-in paths through the
copy engine (swap_in_staged, swap_in_staged_flagged, swap_in_hybrid and the size-based swap_in) also
use private non-blocking side streams and order the current stream after their work; they need a
device staging buffer of num_pairs blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class DeviceKv:
    """The paged KV cache on the device as the kernels address it: `layer_ptrs_addr` is a device
    array of geom.num_layers uint64 layer base addresses, each layer geom.layer_shape(
    num_device_blocks)."""

    layer_ptrs_addr: int
    geom: KvGeometry
    num_device_blocks: int


@dataclass(frozen=True, slots=True)
class BlockPairs:
    """num_pairs blocks to move: device int64 arrays of device block ids and of the matching block
    ids in a pool in host-pool layout (the pinned host pool, or a device staging buffer)."""

    device_ids_addr: int
    pool_ids_addr: int
    num_pairs: int

    def slice(self, first: int, last: int) -> BlockPairs:
        """Pairs [first, last) of these (the ids are int64: 8 bytes each)."""
        return BlockPairs(
            self.device_ids_addr + 8 * first, self.pool_ids_addr + 8 * first, last - first
        )


@dataclass(frozen=True, slots=True)
class SwapInJob:
    """A swap-in of len(host_ids) blocks with what every path needs: `pairs` (device ids and host
    ids, device int64 arrays), the same host ids on the host (to plan one bulk copy per run of
    consecutive ids), the pinned host pool, and a device staging buffer of num_pairs blocks in
    host-pool layout with its slot ids 0..num_pairs-1 (device int64; the zero-copy path leaves
    both unused)."""

    pairs: BlockPairs
    host_ids: Sequence[int]
    host_addr: int
    staging_ids_addr: int
    staging_addr: int

    def __post_init__(self) -> None:
        if len(self.host_ids) != self.pairs.num_pairs:
            raise ValueError(
                f"{len(self.host_ids)} host ids for {self.pairs.num_pairs} block pairs"
            )

    def staged(self, first: int, last: int) -> BlockPairs:
        """Pairs [first, last) as (device block, staging slot): what a scatter reads."""
        whole = BlockPairs(self.pairs.device_ids_addr, self.staging_ids_addr, self.pairs.num_pairs)
        return whole.slice(first, last)


@dataclass(frozen=True, slots=True)
class QuantPool:
    """A quantized KV tier's pools: one-byte `fmt` codes in host-pool layout and f32 scales per
    (block, layer, K|V, token) (KvGeometry.host_scales_shape); pinned host memory or device."""

    codes_addr: int
    scales_addr: int
    fmt: QuantFormat


@dataclass(frozen=True, slots=True)
class QuantRows:
    """A [num_rows, row_len] matrix of 16-bit `half` values and its quantized form (device
    addresses): one-byte `fmt` codes of the same shape and f32 scales, one per row (per-token) or
    per column (per-channel)."""

    x_addr: int
    codes_addr: int
    scales_addr: int
    num_rows: int
    row_len: int
    half: HalfFormat
    fmt: QuantFormat


def _copy_args(kv: DeviceKv, pairs: BlockPairs, pool_addr: int) -> tuple[Any, ...]:
    """The argument list every block-copy kernel of kv_swap.cu starts with."""
    return (
        _p(kv.layer_ptrs_addr),
        _p(pairs.device_ids_addr),
        _p(pairs.pool_ids_addr),
        np.int64(pairs.num_pairs),
        np.int32(kv.geom.num_layers),
        np.int64(kv.num_device_blocks),
        np.int64(kv.geom.chunk_bytes),
        _p(pool_addr),
    )


def swap(
    kv: DeviceKv,
    pairs: BlockPairs,
    host_addr: int,
    out: bool,
    unroll: int = 8,
    threads: int = 256,
    max_ctas: int = 1 << 16,
) -> None:
    """Zero-copy swap-out (out=True) or swap-in of `pairs` (device ids, host ids) in one launch.

    host_addr: pinned pool [num_host_blocks, layers, 2, chunk].
    """
    name = f"swap_{'out' if out else 'in'}_u{unroll}"
    num_chunks = pairs.num_pairs * kv.geom.num_layers * 2
    grid = max(1, min(num_chunks, max_ctas))
    _fn("kv_swap.cu", name)((grid,), (threads,), _copy_args(kv, pairs, host_addr))


def gather(kv: DeviceKv, pairs: BlockPairs, staging_addr: int, inverse: bool = False) -> None:
    """Device-side gather of `pairs` (device ids, staging ids) into (or, inverse, scatter from) a
    staging buffer in host-pool layout."""
    name = "scatter_u8" if inverse else "gather_u8"
    num_chunks = pairs.num_pairs * kv.geom.num_layers * 2
    _fn("kv_swap.cu", name)((max(1, num_chunks),), (256,), _copy_args(kv, pairs, staging_addr))


SPLIT_KERNELS = {  # kv_swap.cu: name -> CTAs per 32 KiB chunk (PARTS)
    "swap_in_p4_u2": 4,
    "swap_in_p1_u8_pf": 1,
    "swap_in_p4_u2_pf": 4,
    "scatter_p4_u2": 4,
    "scatter_p8_u1": 8,
}


def swap_split(name: str, kv: DeviceKv, pairs: BlockPairs, src_addr: int) -> None:
    """Copy `pairs` (device ids, source ids) from a pool in host-pool layout (mapped host memory
    for swap_in_*, a device staging buffer for scatter_*) into device blocks, PARTS CTAs per
    chunk."""
    parts = SPLIT_KERNELS[name]
    geom = kv.geom
    if geom.chunk_bytes % (16 * parts):
        raise ValueError(f"chunk_bytes {geom.chunk_bytes} is not a multiple of {16 * parts}")
    _fn("kv_swap.cu", name)(
        (max(1, pairs.num_pairs * geom.num_layers * 2 * parts),),
        (256,),
        _copy_args(kv, pairs, src_addr),
    )


@functools.cache
def _copy_stream() -> Any:
    import cupy

    return cupy.cuda.Stream(non_blocking=True)


_EVENTS: list[Any] = []


def _events(n: int) -> list[Any]:
    import cupy

    while len(_EVENTS) < n:
        _EVENTS.append(cupy.cuda.Event(block=False, disable_timing=True))
    return _EVENTS[:n]


def host_runs(host_ids: Sequence[int], first: int, last: int) -> list[tuple[int, int, int]]:
    """(first pair, first host block, count) for each run of consecutive host ids in pairs
    [first, last): one bulk copy per run."""
    runs: list[tuple[int, int, int]] = []
    for p in range(first, last):
        h = int(host_ids[p])
        if runs and runs[-1][1] + runs[-1][2] == h:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((p, h, 1))
    return runs


def _bulk_copies(kv: DeviceKv, job: SwapInJob, first: int, last: int, stream: Any) -> None:
    """Host blocks of pairs [first, last) -> their staging slots on `stream`: one
    cudaMemcpyAsync (host to device) per run of consecutive host ids."""
    import cupy

    bb = kv.geom.block_bytes
    for p, h, cnt in host_runs(job.host_ids, first, last):
        cupy.cuda.runtime.memcpyAsync(
            job.staging_addr + p * bb, job.host_addr + h * bb, cnt * bb, 1, stream.ptr
        )


def swap_in_staged(
    kv: DeviceKv, job: SwapInJob, chunk_blocks: int, scatter: str = "scatter_p4_u2"
) -> None:
    """Swap-in through the copy engine: host blocks -> device staging buffer (one cudaMemcpyAsync
    per run of consecutive host ids, on a side stream, chunk_blocks pairs at a time), and each
    chunk scattered into its device blocks on the current stream as soon as its copy has landed
    (an event per chunk), so the copies of later chunks overlap the scatter of earlier ones and
    only the last chunk's scatter adds to the copy time.

    Slot i of the staging buffer holds pair i. Returns once everything is enqueued; the current
    stream is ordered after all of it.
    """
    import cupy

    n = len(job.host_ids)
    if n == 0:
        return
    main = cupy.cuda.get_current_stream()
    side = _copy_stream()
    starts = list(range(0, n, max(1, chunk_blocks)))
    evs = _events(len(starts) + 1)
    evs[0].record(main)  # the staging buffer is free once earlier work on `main` is done
    side.wait_event(evs[0])
    for k, b0 in enumerate(starts):
        b1 = min(n, b0 + max(1, chunk_blocks))
        _bulk_copies(kv, job, b0, b1, side)
        evs[k + 1].record(side)
        main.wait_event(evs[k + 1])
        swap_split(scatter, kv, job.staged(b0, b1), job.staging_addr)


@functools.cache
def _scatter_stream() -> Any:
    import cupy

    return cupy.cuda.Stream(non_blocking=True)


def swap_in_hybrid(
    kv: DeviceKv, job: SwapInJob, copy_blocks: int, scatter: str = "scatter_p4_u2"
) -> None:
    """Both PCIe readers at once: the first copy_blocks pairs go through the copy engine (bulk
    copies into the staging buffer on a side stream, then a scatter on a second side stream), the
    rest through the zero-copy kernel on the current stream, concurrently. The current stream is
    ordered after both."""
    import cupy

    n = len(job.host_ids)
    k = max(0, min(n, copy_blocks))
    main = cupy.cuda.get_current_stream()
    if k > 0:
        side, side2 = _copy_stream(), _scatter_stream()
        ev0, ev1, ev2 = _events(3)
        ev0.record(main)
        side.wait_event(ev0)
        _bulk_copies(kv, job, 0, k, side)
        ev1.record(side)
        side2.wait_event(ev1)
        with side2:
            swap_split(scatter, kv, job.staged(0, k), job.staging_addr)
        ev2.record(side2)
    if n - k > 0:
        swap(kv, job.pairs.slice(k, n), job.host_addr, False)
    if k > 0:
        main.wait_event(ev2)


_FLAGS: list[Any] = []
EPOCH_RING = 1 << 16


class _Epochs:
    """Per-call flag values: a counter, and a pinned host ring holding each epoch at slot
    epoch % EPOCH_RING, from which the copy stream copies it into the device flags (a slot is
    rewritten only EPOCH_RING calls later, long after its copy ran)."""

    def __init__(self) -> None:
        import cupy

        self.mem = cupy.cuda.alloc_pinned_memory(4 * EPOCH_RING)
        self.ring = np.frombuffer(self.mem, np.uint32, EPOCH_RING)
        self.epoch = 0

    def next(self) -> tuple[int, int]:
        self.epoch = self.epoch % 0xFFFFFFFF + 1  # never 0, the flags' initial value
        slot = self.epoch % EPOCH_RING
        self.ring[slot] = self.epoch
        return self.epoch, int(self.mem.ptr) + 4 * slot


@functools.cache
def _epochs() -> _Epochs:
    return _Epochs()


def _flags(n: int) -> Any:
    """A device uint32 array of at least n piece flags (zeros when made, kept for reuse)."""
    import cupy

    if not _FLAGS or _FLAGS[0].size < n:
        _FLAGS[:] = [cupy.zeros(max(n, 64), dtype=cupy.uint32)]
    return _FLAGS[0]


def swap_in_staged_flagged(kv: DeviceKv, job: SwapInJob, chunk_blocks: int) -> None:
    """As swap_in_staged, but one scatter kernel (`scatter_flag_p4_u2`) is launched up front and
    each of its CTAs waits for its piece's flag, which the copy stream sets (a 4-byte copy of
    this call's epoch from pinned memory) after the piece's bulk copies: the copy engine does all
    the signalling, and no event wait or kernel launch sits between the last copy and its
    scatter. The current stream is ordered after the kernel, which ends only after every piece
    has landed."""
    import cupy

    n = len(job.host_ids)
    if n == 0:
        return
    cb = max(1, chunk_blocks)
    starts = list(range(0, n, cb))
    flags = _flags(len(starts))
    epoch, epoch_src = _epochs().next()
    main, side = cupy.cuda.get_current_stream(), _copy_stream()
    (ev0,) = _events(1)
    ev0.record(main)  # the staging buffer is free once earlier work on `main` is done
    side.wait_event(ev0)
    _fn("kv_swap.cu", "scatter_flag_p4_u2")(
        (max(1, n * kv.geom.num_layers * 2 * 4),),
        (256,),
        (
            *_copy_args(kv, job.staged(0, n), job.staging_addr),
            _p(flags.data.ptr),
            np.int32(cb),
            np.uint32(epoch),
        ),
    )
    for k, b0 in enumerate(starts):
        _bulk_copies(kv, job, b0, min(n, b0 + cb), side)
        cupy.cuda.runtime.memcpyAsync(flags.data.ptr + 4 * k, epoch_src, 4, 1, side.ptr)


# Swap-in dispatch, from three H200 sweeps of 2026-11-29 pm (experiments/kernels/
# 2026-11-29_h200_pm_summary.md; GB/s, device time, third run): up to 8 blocks the copy engine
# takes 3/4 of the blocks and the zero-copy kernel the rest, at the same time (4 blocks: 50.3,
# zero-copy alone 49.8; 8: 51.6 vs 50.4); from 16 blocks the copy engine into a staging buffer
# and a scatter pipelined in about sqrt(n) pieces (16: 53.2, 64: 54.5, 256: 55.0, 1024: 55.3;
# zero-copy 51.0-51.4). ("zero_copy", 0): the zero-copy kernel alone (one block).
def swap_in_plan(num_pairs: int) -> tuple[str, int]:
    if num_pairs <= 1:
        return ("zero_copy", 0)
    if num_pairs <= 8:
        return ("hybrid", min(num_pairs - 1, max(1, round(0.75 * num_pairs))))
    return ("staged", min(16, max(2, round(num_pairs**0.5))))


def swap_in(kv: DeviceKv, job: SwapInJob) -> None:
    """Swap-in by the faster path for its size (swap_in_plan)."""
    n = len(job.host_ids)
    kind, arg = swap_in_plan(n)
    if kind == "zero_copy":
        swap(kv, job.pairs, job.host_addr, False)
        return
    if kind == "hybrid":
        swap_in_hybrid(kv, job, arg)
        return
    fn = swap_in_staged_flagged if kind == "flagged" else swap_in_staged
    fn(kv, job, max(1, -(-n // arg)))


@dataclass(frozen=True, slots=True)
class TokVariant:
    """Which per-token quantize kernel runs, and its launch geometry.

    version 1: `quant_tok_*` (float absmax, F2I rounding, explicit clamps); version 2:
    `quant_tok2*` (absmax on packed 16-bit |x| bits, INT8 rounding by a float add, no clamps:
    identical codes, ~26 % fewer instructions); version 3: `quant_tok3*`, version 2's arithmetic
    with 16 contiguous values per lane and one 16-byte code store (rows of a multiple of 16
    values; other rows fall back to version 2), hint "_pl" for plain L1-allocating loads.
    pipelined (v2): a persistent grid of ctas_per_sm CTAs per SM in which each warp issues its
    next rows' loads before encoding the current ones.
    hint (v2): "" , "_pf" (L2 256-byte prefetch on loads) or "_cs" (streaming code stores).
    Version 2 and rows_per_warp > 1 cover rows of up to 1024 values; longer rows (up to 4096) use
    the version-1 v16 kernel whatever the variant.
    """

    version: int = 2
    rows_per_warp: int = 2
    pipelined: bool = False
    hint: str = ""
    threads: int = 256
    ctas_per_sm: int = 1 << 20

    def label(self) -> str:
        kind = f"v{self.version}" + ("pipe" if self.pipelined else "")
        return f"{kind}_r{self.rows_per_warp}{self.hint}_t{self.threads}" + (
            f"_ctas{self.ctas_per_sm}perSM" if self.ctas_per_sm < 1 << 20 else ""
        )


# Chosen from the H200 sweeps of 2026-11-29 pm: 4,371 (INT8) / 4,370 (FP8) GB/s, against 4,008 /
# 4,000 for the morning's best (v1, 2 rows per warp) in the same run
# (experiments/kernels/2026-11-29_h200_pm_summary.md).
DEFAULT_TOK_VARIANT = TokVariant(version=3, rows_per_warp=2, hint="_pl")


def quant_tok_kernel(variant: TokVariant, row_len: int, half: HalfFormat, fmt: QuantFormat) -> str:
    row_variant = _row_variant(row_len)
    if row_variant != "v4":
        return f"quant_tok_{fmt.value}_{half.value}_{row_variant}"
    if variant.version == 3:
        if variant.rows_per_warp not in (1, 2, 4) or variant.hint not in ("", "_pl"):
            raise ValueError(f"no version-3 kernel built for {variant}")
        if row_len % 16 == 0:
            return f"quant_tok3_{fmt.value}_{half.value}_v4_r{variant.rows_per_warp}{variant.hint}"
        variant = TokVariant(2, variant.rows_per_warp, threads=variant.threads)
    if variant.version == 1:
        if variant.rows_per_warp not in (1, 2):
            raise ValueError("version-1 kernels take 1 or 2 rows per warp")
        suffix = "_r2" if variant.rows_per_warp == 2 else ""
        return f"quant_tok_{fmt.value}_{half.value}_v4{suffix}"
    if variant.pipelined:
        if (variant.rows_per_warp, variant.hint) not in ((1, ""), (2, ""), (1, "_cs")):
            raise ValueError(f"no pipelined kernel built for {variant}")
    elif (variant.rows_per_warp, variant.hint) not in (
        (1, ""),
        (2, ""),
        (4, ""),
        (2, "_pf"),
        (2, "_cs"),
    ):
        raise ValueError(f"no kernel built for {variant}")
    family = "quant_tok2p" if variant.pipelined else "quant_tok2"
    return f"{family}_{fmt.value}_{half.value}_v4_r{variant.rows_per_warp}{variant.hint}"


def quantize_per_token(rows: QuantRows, variant: TokVariant | None = None) -> None:
    """x [num_rows, row_len] 16-bit -> codes (1 byte each), f32 scales [num_rows].

    One warp quantizes variant.rows_per_warp rows at a time; the grid is one CTA per
    threads/32*rows_per_warp rows capped at ctas_per_sm per SM (pipelined: exactly that many).
    """
    v = DEFAULT_TOK_VARIANT if variant is None else variant
    name = quant_tok_kernel(v, rows.row_len, rows.half, rows.fmt)
    rows_per_cta = v.threads // 32 * (1 if name.endswith("_v16") else v.rows_per_warp)
    grid = max(1, min(-(-rows.num_rows // rows_per_cta), num_sms() * v.ctas_per_sm))
    _fn("kv_quant.cu", name)(
        (grid,),
        (v.threads,),
        (
            _p(rows.x_addr),
            _p(rows.codes_addr),
            _p(rows.scales_addr),
            np.int64(rows.num_rows),
            np.int32(rows.row_len // 8),
        ),
    )


def quantize_per_channel(rows: QuantRows, col_absmax_addr: int) -> None:
    """Two launches: column absmax (col_absmax must be zeroed f32 [row_len]), then quantize into
    codes and f32 scales [row_len]."""
    row_vec = rows.row_len // 8
    col_grid = (-(-row_vec // 128), max(1, min(rows.num_rows, 1024)))
    _fn("kv_quant.cu", f"col_absmax_{rows.half.value}")(
        col_grid,
        (128,),
        (_p(rows.x_addr), _p(col_absmax_addr), np.int64(rows.num_rows), np.int32(row_vec)),
    )
    grid = max(1, min(-(-rows.num_rows * row_vec // 256), num_sms() * 16))
    _fn("kv_quant.cu", f"quant_chan_{rows.fmt.value}_{rows.half.value}")(
        (grid,),
        (256,),
        (
            _p(rows.x_addr),
            _p(rows.codes_addr),
            _p(col_absmax_addr),
            _p(rows.scales_addr),
            np.int64(rows.num_rows),
            np.int32(row_vec),
        ),
    )


def dequantize(rows: QuantRows, per_token: bool = True) -> None:
    """codes + scales (per row if per_token, else per column) -> 16-bit values into x, RNE."""
    name = f"dequant_{'tok' if per_token else 'chan'}_{rows.fmt.value}_{rows.half.value}"
    row_vec = rows.row_len // 8
    grid = max(1, min(-(-rows.num_rows * row_vec // 256), num_sms() * 16))
    _fn("kv_quant.cu", name)(
        (grid,),
        (256,),
        (
            _p(rows.codes_addr),
            _p(rows.scales_addr),
            _p(rows.x_addr),
            np.int64(rows.num_rows),
            np.int32(row_vec),
        ),
    )


def swap_out_quant(
    kv: DeviceKv, pairs: BlockPairs, pool: QuantPool, half: HalfFormat, threads: int = 256
) -> None:
    """Fused zero-copy swap-out of `pairs` (device ids, host ids) with per-token quantization
    (codes and scales to the pool)."""
    _fused("out", kv, pairs, pool, half, threads)


def swap_in_dequant(
    kv: DeviceKv, pairs: BlockPairs, pool: QuantPool, half: HalfFormat, threads: int = 256
) -> None:
    """Fused zero-copy reload of `pairs` (device ids, host ids): the pool's codes and scales ->
    dequantized device blocks."""
    _fused("in", kv, pairs, pool, half, threads)


def _fused(
    direction: str,
    kv: DeviceKv,
    pairs: BlockPairs,
    pool: QuantPool,
    half: HalfFormat,
    threads: int,
) -> None:
    geom, fmt = kv.geom, pool.fmt
    if geom.block_size > MAX_FUSED_BLOCK_SIZE or geom.itemsize_bytes != 2:
        raise ValueError(f"fused kernels need 16-bit KV and block_size <= {MAX_FUSED_BLOCK_SIZE}")
    if direction == "out":
        name = f"swap_out_quant_{fmt.value}_{half.value}_{_row_variant(geom.row_len)}"
    else:
        name = f"swap_in_dequant_{fmt.value}_{half.value}"
    num_chunks = pairs.num_pairs * geom.num_layers * 2
    _fn("kv_swap_quant.cu", name)(
        (max(1, num_chunks),),
        (threads,),
        (
            _p(kv.layer_ptrs_addr),
            _p(pairs.device_ids_addr),
            _p(pairs.pool_ids_addr),
            np.int64(pairs.num_pairs),
            np.int32(geom.num_layers),
            np.int64(kv.num_device_blocks),
            np.int32(geom.block_size),
            np.int32(geom.row_len // 8),
            _p(pool.codes_addr),
            _p(pool.scales_addr),
        ),
    )
