"""GPU timing of paged-KV swap-out/in and fused swap+quantize against the copy paths serving
engines use: a plain pinned copy of the same bytes, gather-then-copy (per layer, and one gather
kernel then one bulk copy), per-chunk cudaMemcpyAsync, cudaMemcpyBatchAsync with one 32 KiB
descriptor per (layer, K|V, block), and a persistent Triton copy; for swap-in also the split
zero-copy kernels, the copy engine into a staging buffer with a pipelined or flag-driven scatter,
the hybrid (copy engine and zero-copy kernel at once) and the size-based dispatch `cuda.swap_in`.
Block ids are drawn afresh for each repetition (several sets rotate) so the source is not served
from L2.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cachepilot_sim.kernels import cuda as ck
from cachepilot_sim.kernels import triton_kernels as tk
from cachepilot_sim.kernels.formats import HalfFormat
from cachepilot_sim.kernels.layout import LLAMA3_8B, KvGeometry, QuantFormat
from cachepilot_sim.kernels.timing import HIDE_LAUNCH_CYCLES, Timing, measure

NUM_ID_SETS = 4
CUDA_VARIANTS = [(u, t) for u in (2, 4, 8) for t in (128, 256, 512)]
TRITON_PROGRAMS = (132, 528, 1 << 20)


@dataclass
class SwapSetup:
    """Device layers, pinned host pools and rotating block-id sets for one geometry."""

    geom: KvGeometry
    num_device_blocks: int
    layers: list[Any]
    ptr_table: Any
    tri_table: tk.LayerTable
    host_pool: Any
    host_codes: Any
    host_scales: Any
    staging: Any
    staging_codes: Any
    staging_scales: Any

    @property
    def device_kv(self) -> ck.DeviceKv:
        """The device layers as the CUDA launchers address them."""
        return ck.DeviceKv(self.ptr_table.data_ptr(), self.geom, self.num_device_blocks)


def make_setup(
    geom: KvGeometry = LLAMA3_8B, num_device_blocks: int = 4096, max_blocks: int = 1024
) -> SwapSetup:
    import torch

    layers = [
        torch.randn(geom.layer_shape(num_device_blocks), dtype=torch.bfloat16, device="cuda")
        for _ in range(geom.num_layers)
    ]
    ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64, device="cuda")
    pool_elems = max_blocks * geom.block_bytes // 2
    code_bytes = max_blocks * geom.block_bytes // 2
    scale_elems = max_blocks * geom.num_layers * 2 * geom.block_size

    def pinned(n: int, dtype: Any) -> Any:
        return torch.full((n,), 7, dtype=dtype).pin_memory()

    return SwapSetup(
        geom,
        num_device_blocks,
        layers,
        ptrs,
        tk.make_layer_table(layers),
        pinned(pool_elems, torch.bfloat16),
        pinned(code_bytes, torch.uint8),
        pinned(scale_elems, torch.float32),
        torch.empty(pool_elems, dtype=torch.bfloat16, device="cuda"),
        torch.empty(code_bytes, dtype=torch.uint8, device="cuda"),
        torch.empty(scale_elems, dtype=torch.float32, device="cuda"),
    )


def id_sets(setup: SwapSetup, num_blocks: int, seed: int) -> list[tuple[Any, Any]]:
    """NUM_ID_SETS (device ids, host ids) pairs: distinct random device blocks -> host 0..n-1."""
    import torch

    rng = np.random.default_rng(seed)
    host = torch.arange(num_blocks, dtype=torch.int64, device="cuda")
    return [
        (
            torch.from_numpy(rng.choice(setup.num_device_blocks, num_blocks, replace=False)).to(
                "cuda"
            ),
            host,
        )
        for _ in range(NUM_ID_SETS)
    ]


def _cudart() -> Any:
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcudart not found")


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [
        ("src_access_order", ctypes.c_int),
        ("src_loc_type", ctypes.c_int),
        ("src_loc_id", ctypes.c_int),
        ("dst_loc_type", ctypes.c_int),
        ("dst_loc_id", ctypes.c_int),
        ("flags", ctypes.c_uint),
    ]


def chunk_descriptors(
    setup: SwapSetup, dev_ids: Any, host_ids: Any, out: bool
) -> tuple[list[int], list[int], int]:
    """(dst addresses, src addresses, chunk bytes): one per (block, layer, K|V), pool layout."""
    g = setup.geom
    dsts, srcs = [], []
    for d, h in zip(dev_ids.tolist(), host_ids.tolist(), strict=True):
        for layer_idx, layer in enumerate(setup.layers):
            for kv in (0, 1):
                dev = layer.data_ptr() + (kv * setup.num_device_blocks + d) * g.chunk_bytes
                host = (
                    setup.host_pool.data_ptr()
                    + ((h * g.num_layers + layer_idx) * 2 + kv) * g.chunk_bytes
                )
                dsts.append(host if out else dev)
                srcs.append(dev if out else host)
    return dsts, srcs, g.chunk_bytes


def batch_memcpy_fn(
    setup: SwapSetup, sets: list[tuple[Any, Any]], out: bool, stream: Any
) -> Callable[[int], object]:
    """cudaMemcpyBatchAsync (CUDA 13 signature) with one descriptor per chunk, on `stream`."""
    rt = _cudart()
    prepared = []
    for dev_ids, host_ids in sets:
        dsts, srcs, size = chunk_descriptors(setup, dev_ids, host_ids, out)
        n = len(dsts)
        prepared.append(
            (
                (ctypes.c_void_p * n)(*dsts),
                (ctypes.c_void_p * n)(*srcs),
                (ctypes.c_size_t * n)(*([size] * n)),
                n,
            )
        )
    attrs = _MemcpyAttributes(1, 0, 0, 0, 0, 0)  # source access order: stream
    idx = (ctypes.c_size_t * 1)(0)
    handle = ctypes.c_void_p(stream.cuda_stream)

    def fn(i: int) -> None:
        dsts, srcs, sizes, n = prepared[i % len(prepared)]
        err = rt.cudaMemcpyBatchAsync(
            dsts,
            srcs,
            sizes,
            ctypes.c_size_t(n),
            ctypes.byref(attrs),
            idx,
            ctypes.c_size_t(1),
            handle,
        )
        if err != 0:
            raise RuntimeError(f"cudaMemcpyBatchAsync returned error {err}")

    return fn


def per_chunk_memcpy_fn(
    setup: SwapSetup, sets: list[tuple[Any, Any]], out: bool
) -> Callable[[int], object]:
    """One cudaMemcpyAsync per chunk on the default stream (the naive loop)."""
    import cupy

    prepared = [chunk_descriptors(setup, d, h, out) for d, h in sets]

    def fn(i: int) -> None:
        dsts, srcs, size = prepared[i % len(prepared)]
        for dst, src in zip(dsts, srcs, strict=True):
            cupy.cuda.runtime.memcpyAsync(dst, src, size, 4, 0)  # cudaMemcpyDefault

    return fn


def _label(n: int) -> str:
    return f"{n}blk"


def pairs_of(sets: list[tuple[Any, Any]], n: int) -> list[ck.BlockPairs]:
    """The CUDA launchers' view of each (device ids, host ids) set: raw addresses, so the caller
    keeps `sets` alive while the pairs are used."""
    return [ck.BlockPairs(d.data_ptr(), h.data_ptr(), n) for d, h in sets]


def swap_variants(
    s: SwapSetup, n: int, sets: list[tuple[Any, Any]], out: bool
) -> dict[str, Callable[[int], object]]:
    """Name -> fn(rep) for every swap path of n blocks in one direction."""
    g = s.geom
    kv, pairs = s.device_kv, pairs_of(sets, n)
    elems = n * g.block_bytes // 2
    pool, staging = s.host_pool[:elems], s.staging[:elems]
    hp = s.host_pool.data_ptr()
    v: dict[str, Callable[[int], object]] = {}
    unrolls = (2, 4, 8) if out else (4, 8)
    for u, t in [(u, t) for u, t in CUDA_VARIANTS if u in unrolls]:

        def zero_copy(i: int, u: int = u, t: int = t) -> None:
            ck.swap(kv, pairs[i % 4], hp, out, unroll=u, threads=t)

        v[f"cuda_zero_copy_u{u}_t{t}"] = zero_copy
    for p in TRITON_PROGRAMS:

        def triton_copy(i: int, p: int = p) -> None:
            d, h = sets[i % 4]
            tk.swap(s.tri_table, g, d, h, hp, out, max_programs=p)

        v[f"triton_persistent_p{min(p, n * g.num_layers * 2)}"] = triton_copy

    def staged(i: int) -> None:  # host ids are 0..n-1: the staging slots too
        if out:
            ck.gather(kv, pairs[i % 4], s.staging.data_ptr())
            pool.copy_(staging, non_blocking=True)
        else:
            staging.copy_(pool, non_blocking=True)
            ck.gather(kv, pairs[i % 4], s.staging.data_ptr(), inverse=True)

    v["cuda_gather_kernel_then_one_copy" if out else "one_copy_then_cuda_scatter"] = staged
    if not out:
        v.update(swap_in_variants(s, n, sets))
    v["baseline_plain_pinned_copy"] = (
        (lambda i: pool.copy_(staging, non_blocking=True))
        if out
        else (lambda i: staging.copy_(pool, non_blocking=True))
    )
    if out:
        per_layer = 2 * n * g.chunk_bytes // 2

        def torch_gather(i: int) -> None:
            d = sets[i % 4][0]
            for idx, layer in enumerate(s.layers):
                dst = s.host_pool[idx * per_layer : (idx + 1) * per_layer]
                dst.copy_(layer.index_select(1, d).reshape(-1), non_blocking=True)

        v["baseline_torch_index_select_then_copy_per_layer"] = torch_gather
    if n <= 16:
        v["baseline_cudaMemcpyAsync_per_chunk"] = per_chunk_memcpy_fn(s, sets, out)
    return v


STAGED_PIECES = (1, 2, 4, 8, 16)  # the staged swap-in in this many pipelined chunks
HYBRID_COPY_FRACTIONS = (0.25, 0.5, 0.75)  # share of the blocks the copy engine takes
# Also timed with the host's launch cost included (no sleep kernel ahead of the start event).
LAUNCH_INCLUDED = ("cuda_zero_copy_u8_t256", "cuda_swap_in_dispatch")
LONG_HIDE_CYCLES = 4_000_000  # ~2 ms: the staged variants enqueue up to ~80 operations


def staged_chunk_blocks(n: int, pieces: int) -> int:
    return max(1, -(-n // pieces))


def swap_in_variants(
    s: SwapSetup, n: int, sets: list[tuple[Any, Any]]
) -> dict[str, Callable[[int], object]]:
    """The 2026-11-29 afternoon swap-in paths: split zero-copy kernels (4 CTAs per chunk, L2
    prefetch hints) and the copy engine into a staging buffer + scatter, pipelined in chunks."""
    kv, pairs = s.device_kv, pairs_of(sets, n)
    hp, st = s.host_pool.data_ptr(), s.staging.data_ptr()
    # host ids are 0..n-1: the staging slots too
    jobs = [
        ck.SwapInJob(p, h.tolist(), hp, h.data_ptr(), st)
        for p, (_, h) in zip(pairs, sets, strict=True)
    ]
    v: dict[str, Callable[[int], object]] = {}
    for name in ("swap_in_p4_u2", "swap_in_p1_u8_pf", "swap_in_p4_u2_pf"):

        def split(i: int, name: str = name) -> None:
            ck.swap_split(name, kv, pairs[i % 4], hp)

        v[f"cuda_zero_copy_{name.removeprefix('swap_in_')}"] = split
    for pieces in sorted({min(p, n) for p in STAGED_PIECES}):
        for scatter in ("scatter_p4_u2", "scatter_p8_u1") if pieces == 1 else ("scatter_p4_u2",):

            def staged(i: int, pieces: int = pieces, scatter: str = scatter) -> None:
                ck.swap_in_staged(kv, jobs[i % 4], staged_chunk_blocks(n, pieces), scatter)

            tag = "" if scatter == "scatter_p4_u2" else "_scatter_p8"
            v[f"cuda_staged_copy_scatter_{pieces}pieces{tag}"] = staged

    for pieces in sorted({min(p, n) for p in STAGED_PIECES}):

        def flagged(i: int, pieces: int = pieces) -> None:
            ck.swap_in_staged_flagged(kv, jobs[i % 4], staged_chunk_blocks(n, pieces))

        v[f"cuda_staged_epoch_flag_scatter_{pieces}pieces"] = flagged
    for frac in HYBRID_COPY_FRACTIONS:
        k = round(n * frac)
        if not 0 < k < n:
            continue

        def hybrid(i: int, k: int = k) -> None:
            ck.swap_in_hybrid(kv, jobs[i % 4], k)

        v[f"cuda_hybrid_copy_engine_{round(100 * frac)}pct_zero_copy_rest"] = hybrid

    def auto(i: int) -> None:
        ck.swap_in(kv, jobs[i % 4])

    v["cuda_swap_in_dispatch"] = auto
    return v


def bench_swap(s: SwapSetup, sizes: list[int], log: Callable[[str], None]) -> list[Timing]:
    """Swap-out and swap-in of n blocks (all layers, K and V) for each n in sizes."""
    import torch

    results: list[Timing] = []
    side = torch.cuda.Stream()
    for out in (True, False):
        section = "swap_out" if out else "swap_in"
        for n in sizes:
            sets = id_sets(s, n, seed=n)
            nbytes = n * s.geom.block_bytes
            for name, fn in swap_variants(s, n, sets, out).items():
                multi_op = any(w in name for w in ("staged", "dispatch", "hybrid"))
                hide = LONG_HIDE_CYCLES if multi_op else HIDE_LAUNCH_CYCLES
                results.append(_safe(section, name, n, nbytes, fn, log, hide_cycles=hide))
                if name in LAUNCH_INCLUDED:
                    results.append(
                        _safe(section, f"{name}_launch_included", n, nbytes, fn, log, hide=False)
                    )
            try:
                fn = batch_memcpy_fn(s, sets, out, side)
                results.append(
                    _safe(
                        section,
                        "baseline_cudaMemcpyBatchAsync_32KiB",
                        n,
                        nbytes,
                        fn,
                        log,
                        stream=side,
                    )
                )
            except Exception as err:
                log(f"{section} batch memcpy unavailable: {err!r}")
    return results


def _safe(
    section: str,
    name: str,
    n: int,
    nbytes: int,
    fn: Callable[[int], object],
    log: Callable[[str], None],
    stream: Any = None,
    note: str = "",
    hide_cycles: int = HIDE_LAUNCH_CYCLES,
    hide: bool = True,
) -> Timing:
    try:
        t = measure(
            section,
            name,
            _label(n),
            nbytes,
            fn,
            nbytes / 50e3,
            note,
            stream=stream,
            hide_cycles=hide_cycles,
            hide_launch=hide,
        )
        log(f"{section:16s} {name:52s} {_label(n):8s} {t.median_us:10.1f} us {t.gbps:8.2f} GB/s")
        return t
    except Exception as err:
        log(f"{section} {name} {_label(n)} FAILED: {str(err)[-600:]}")
        return Timing(
            section,
            name,
            _label(n),
            nbytes,
            float("nan"),
            float("nan"),
            float("nan"),
            0,
            f"failed: {err!r}"[:300],
        )


def fused_variants(
    s: SwapSetup, n: int, sets: list[tuple[Any, Any]], fmt: QuantFormat, out: bool
) -> dict[str, Callable[[int], object]]:
    g, bf16 = s.geom, HalfFormat.BF16
    ncode = n * g.block_bytes // 2
    nscale = n * g.num_layers * 2 * g.block_size
    hc, hs = s.host_codes.data_ptr(), s.host_scales.data_ptr()
    host = ck.QuantPool(hc, hs, fmt)
    device = ck.QuantPool(s.staging_codes.data_ptr(), s.staging_scales.data_ptr(), fmt)
    kv, pairs = s.device_kv, pairs_of(sets, n)
    cuda_fn = ck.swap_out_quant if out else ck.swap_in_dequant
    tri_fn = tk.swap_out_quant if out else tk.swap_in_dequant

    def staged(i: int) -> None:
        codes, scales = s.host_codes[:ncode], s.host_scales[:nscale]
        st_codes, st_scales = s.staging_codes[:ncode], s.staging_scales[:nscale]
        if out:
            ck.swap_out_quant(kv, pairs[i % 4], device, bf16)
            codes.copy_(st_codes, non_blocking=True)
            scales.copy_(st_scales, non_blocking=True)
        else:
            st_codes.copy_(codes, non_blocking=True)
            st_scales.copy_(scales, non_blocking=True)
            ck.swap_in_dequant(kv, pairs[i % 4], device, bf16)

    return {
        f"cuda_fused_{fmt.value}_zero_copy": lambda i: cuda_fn(kv, pairs[i % 4], host, bf16),
        f"triton_fused_{fmt.value}_zero_copy": lambda i: tri_fn(
            s.tri_table, g, sets[i % 4][0], sets[i % 4][1], hc, hs, fmt
        ),
        f"cuda_fused_{fmt.value}_device_staging_then_copy": staged,
    }


def bench_fused(s: SwapSetup, sizes: list[int], log: Callable[[str], None]) -> list[Timing]:
    """Fused swap-out+quantize and reload+dequantize; the rate counts bf16 bytes moved."""
    results: list[Timing] = []
    note = "rate counts the bf16 bytes moved; PCIe carries half of them plus f32 scales"
    for out in (True, False):
        section = "fused_swap_out_quant" if out else "fused_swap_in_dequant"
        for n in sizes:
            sets = id_sets(s, n, seed=1000 + n)
            for fmt in QuantFormat:
                for name, fn in fused_variants(s, n, sets, fmt, out).items():
                    results.append(
                        _safe(section, name, n, n * s.geom.block_bytes, fn, log, note=note)
                    )
    return results
