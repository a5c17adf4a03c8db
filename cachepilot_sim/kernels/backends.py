"""The CUDA and Triton kernels behind one NumPy-in, NumPy-out interface, for cross-checking.

Each call copies NumPy inputs to the device (host pools to pinned memory on a GPU), fills every
output with a poison pattern first, launches, synchronizes and returns the outputs as NumPy arrays,
so a check sees both wrong values and elements the kernel never wrote.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cachepilot_sim.kernels.formats import F32, U8, U16, HalfFormat
from cachepilot_sim.kernels.layout import KvGeometry, QuantFormat

POISON_BYTE = 0xA5
I64 = npt.NDArray[np.int64]


class TorchBackend:
    """Memory handling shared by both backends; `device` is 'cuda' or 'cpu' (Triton interpreter)."""

    name = "base"

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)

    def dev(self, a: npt.NDArray[Any]) -> Any:
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        return t.to(self.device)

    def host(self, a: npt.NDArray[Any]) -> Any:
        t = self.torch.from_numpy(np.ascontiguousarray(a).copy())
        return t.pin_memory() if self.device.type == "cuda" else t

    def halves(self, bits: U16, half: HalfFormat) -> Any:
        dtype = self.torch.bfloat16 if half is HalfFormat.BF16 else self.torch.float16
        return self.dev(bits.view(np.int16)).view(dtype)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def out_codes(self, shape: tuple[int, ...]) -> Any:
        return self.torch.full(shape, POISON_BYTE, dtype=self.torch.uint8, device=self.device)

    def out_f32(self, shape: tuple[int, ...]) -> Any:
        return self.torch.full(shape, float("nan"), dtype=self.torch.float32, device=self.device)

    def bits(self, t: Any) -> U16:
        """16-bit tensor -> its bits as a NumPy uint16 array."""
        return t.cpu().contiguous().view(self.torch.int16).numpy().view(np.uint16)


class TritonBackend(TorchBackend):
    name = "triton"

    def __init__(self, device: str = "cuda") -> None:
        super().__init__(device)
        from cachepilot_sim.kernels import triton_kernels

        self.k = triton_kernels

    def swap(
        self,
        layers: list[npt.NDArray[Any]],
        device_ids: I64,
        host_ids: I64,
        host_pool: npt.NDArray[Any],
        geom: KvGeometry,
        out: bool,
    ) -> tuple[list[npt.NDArray[Any]], npt.NDArray[Any]]:
        dl = [self.dev(a) for a in layers]
        hp = self.host(host_pool)
        table = self.k.make_layer_table(dl)
        self.k.swap(table, geom, self.dev(device_ids), self.dev(host_ids), hp.data_ptr(), out)
        self.sync()
        return [t.cpu().numpy() for t in dl], hp.numpy()

    def quantize(
        self, bits: U16, half: HalfFormat, fmt: QuantFormat, per_token: bool
    ) -> tuple[U8, F32]:
        x = self.halves(bits, half)
        if per_token:
            codes, scales = self.k.quantize_per_token(
                x, fmt, self.out_codes(bits.shape), self.out_f32((bits.shape[0],))
            )
        else:
            codes, scales = self.k.quantize_per_channel(x, fmt)
        self.sync()
        return codes.cpu().numpy(), scales.cpu().numpy()

    def dequantize(
        self, codes: U8, scales: F32, half: HalfFormat, fmt: QuantFormat, per_token: bool
    ) -> U16:
        out = self.halves(np.full(codes.shape, 0xA5A5, np.uint16), half)
        self.k.dequantize(self.dev(codes), self.dev(scales), fmt, out.dtype, per_token, out)
        self.sync()
        return self.bits(out)

    def fused(
        self,
        layers: list[U16],
        device_ids: I64,
        host_ids: I64,
        codes: U8,
        scales: F32,
        geom: KvGeometry,
        half: HalfFormat,
        fmt: QuantFormat,
        out: bool,
    ) -> tuple[list[U16], U8, F32]:
        dl = [self.halves(a, half) for a in layers]
        hc, hs = self.host(codes), self.host(scales)
        table = self.k.make_layer_table(dl)
        fn = self.k.swap_out_quant if out else self.k.swap_in_dequant
        fn(table, geom, self.dev(device_ids), self.dev(host_ids), hc.data_ptr(), hs.data_ptr(), fmt)
        self.sync()
        return [self.bits(t) for t in dl], hc.numpy(), hs.numpy()


class CudaBackend(TorchBackend):
    """quant_variant: the per-token kernel (None: the default); swap_in: "zero_copy" (the default
    kernel), a split kernel name of cuda.SPLIT_KERNELS starting with swap_in_,
    "staged:<pieces>:<scatter kernel>" (copy engine into a staging buffer, pipelined scatter),
    "flagged:<pieces>" (the same with one flag-driven scatter kernel) or "hybrid:<blocks>" (that
    many blocks through the copy engine, the rest zero-copy, concurrently)."""

    name = "cuda"

    def __init__(
        self, device: str = "cuda", quant_variant: Any = None, swap_in: str = "zero_copy"
    ) -> None:
        super().__init__(device)
        from cachepilot_sim.kernels import cuda

        self.k = cuda
        self.quant_variant = quant_variant
        self.swap_in = swap_in
        if quant_variant is not None or swap_in != "zero_copy":
            label = quant_variant.label() if quant_variant is not None else swap_in
            self.name = f"cuda[{label}]"

    def _ptr_table(self, layers: list[Any]) -> Any:
        return self.torch.tensor(
            [t.data_ptr() for t in layers], dtype=self.torch.int64, device=self.device
        )

    def swap(
        self,
        layers: list[npt.NDArray[Any]],
        device_ids: I64,
        host_ids: I64,
        host_pool: npt.NDArray[Any],
        geom: KvGeometry,
        out: bool,
    ) -> tuple[list[npt.NDArray[Any]], npt.NDArray[Any]]:
        dl = [self.dev(a) for a in layers]
        hp = self.host(host_pool)
        ptrs, di, hi = self._ptr_table(dl), self.dev(device_ids), self.dev(host_ids)
        kv = self.k.DeviceKv(ptrs.data_ptr(), geom, layers[0].shape[1])
        pairs = self.k.BlockPairs(di.data_ptr(), hi.data_ptr(), len(device_ids))
        if not out and self.swap_in != "zero_copy":
            self._swap_in_variant(kv, pairs, host_ids, hp)
            self.sync()
            return [t.cpu().numpy() for t in dl], hp.numpy()
        self.k.swap(kv, pairs, hp.data_ptr(), out)
        self.sync()
        return [t.cpu().numpy() for t in dl], hp.numpy()

    def _swap_in_variant(self, kv: Any, pairs: Any, host_ids: I64, hp: Any) -> None:
        n = len(host_ids)
        if self.swap_in.split(":")[0] in ("staged", "flagged", "hybrid"):
            kind, num, *rest = self.swap_in.split(":")
            staging = self.torch.full(
                (n * kv.geom.block_bytes,), POISON_BYTE, dtype=self.torch.uint8, device=self.device
            )
            slots = self.torch.arange(n, dtype=self.torch.int64, device=self.device)
            job = self.k.SwapInJob(
                pairs, host_ids.tolist(), hp.data_ptr(), slots.data_ptr(), staging.data_ptr()
            )
            cb = max(1, -(-n // int(num)))  # num = pieces
            if kind == "staged":
                self.k.swap_in_staged(kv, job, cb, *rest)
            elif kind == "flagged":
                self.k.swap_in_staged_flagged(kv, job, cb)
            else:  # num = blocks through the copy engine
                self.k.swap_in_hybrid(kv, job, int(num))
            self.sync()  # staging must outlive the side-stream copies and the scatters
        else:
            self.k.swap_split(self.swap_in, kv, pairs, hp.data_ptr())

    def quantize(
        self, bits: U16, half: HalfFormat, fmt: QuantFormat, per_token: bool
    ) -> tuple[U8, F32]:
        x = self.halves(bits, half)
        rows, row_len = bits.shape
        codes = self.out_codes(bits.shape)
        scales = self.out_f32((rows,) if per_token else (row_len,))
        mats = self.k.QuantRows(
            x.data_ptr(), codes.data_ptr(), scales.data_ptr(), rows, row_len, half, fmt
        )
        if per_token:
            self.k.quantize_per_token(mats, self.quant_variant)
        else:
            amax = self.torch.zeros(row_len, dtype=self.torch.float32, device=self.device)
            self.k.quantize_per_channel(mats, amax.data_ptr())
        self.sync()
        return codes.cpu().numpy(), scales.cpu().numpy()

    def dequantize(
        self, codes: U8, scales: F32, half: HalfFormat, fmt: QuantFormat, per_token: bool
    ) -> U16:
        out = self.halves(np.full(codes.shape, 0xA5A5, np.uint16), half)
        c, s = self.dev(codes), self.dev(scales)
        rows, row_len = codes.shape
        mats = self.k.QuantRows(
            out.data_ptr(), c.data_ptr(), s.data_ptr(), rows, row_len, half, fmt
        )
        self.k.dequantize(mats, per_token)
        self.sync()
        return self.bits(out)

    def fused(
        self,
        layers: list[U16],
        device_ids: I64,
        host_ids: I64,
        codes: U8,
        scales: F32,
        geom: KvGeometry,
        half: HalfFormat,
        fmt: QuantFormat,
        out: bool,
    ) -> tuple[list[U16], U8, F32]:
        dl = [self.halves(a, half) for a in layers]
        hc, hs = self.host(codes), self.host(scales)
        ptrs, di, hi = self._ptr_table(dl), self.dev(device_ids), self.dev(host_ids)
        fn = self.k.swap_out_quant if out else self.k.swap_in_dequant
        fn(
            self.k.DeviceKv(ptrs.data_ptr(), geom, layers[0].shape[1]),
            self.k.BlockPairs(di.data_ptr(), hi.data_ptr(), len(device_ids)),
            self.k.QuantPool(hc.data_ptr(), hs.data_ptr(), fmt),
            half,
        )
        self.sync()
        return [self.bits(t) for t in dl], hc.numpy(), hs.numpy()
