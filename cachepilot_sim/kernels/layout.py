"""Where the bytes of a paged KV cache live, on the device and in the pinned host pool.

Device: per layer a vLLM-style tensor [2, num_device_blocks, block_size, num_kv_heads, head_dim], so
one (layer, K|V, block) chunk is contiguous. Host pool: [num_host_blocks, num_layers, 2, block_size,
num_kv_heads, head_dim], so all of one offloaded block is contiguous. Quantized host pools hold one
byte per value plus an f32 scale per (block, layer, K|V, token).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class QuantFormat(StrEnum):
    """Code format of quantized KV; the scale is absmax / qmax."""

    INT8 = "int8"
    FP8 = "fp8"

    @property
    def qmax(self) -> float:
        """Largest code magnitude: 127 for symmetric INT8, 448 for FP8 e4m3 (its largest finite)."""
        return 127.0 if self is QuantFormat.INT8 else 448.0


@dataclass(frozen=True, slots=True)
class KvGeometry:
    """Shape of one model's paged KV cache; `itemsize_bytes` is 2 for bf16/fp16, 1 for fp8."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    itemsize_bytes: int = 2

    def __post_init__(self) -> None:
        for key in ("num_layers", "block_size", "num_kv_heads", "head_dim", "itemsize_bytes"):
            if getattr(self, key) <= 0:
                raise ValueError(f"KvGeometry.{key} must be positive, got {getattr(self, key)}")
        if self.chunk_bytes % 16:
            raise ValueError(f"chunk of {self.chunk_bytes} bytes is not a multiple of 16")
        if self.row_len % 8:
            raise ValueError(f"row_len {self.row_len} (kv heads x head dim) is not a multiple of 8")

    @property
    def row_len(self) -> int:
        """Values of one token in one layer, K or V: num_kv_heads * head_dim (the per-token row)."""
        return self.num_kv_heads * self.head_dim

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one (layer, K|V, block) chunk, the unit every copy descriptor moves."""
        return self.block_size * self.row_len * self.itemsize_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over all layers, K and V."""
        return 2 * self.num_layers * self.chunk_bytes

    def layer_shape(self, num_device_blocks: int) -> tuple[int, ...]:
        return (2, num_device_blocks, self.block_size, self.num_kv_heads, self.head_dim)

    def host_pool_shape(self, num_host_blocks: int) -> tuple[int, ...]:
        return (
            num_host_blocks,
            self.num_layers,
            2,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        )

    def host_scales_shape(self, num_host_blocks: int) -> tuple[int, ...]:
        return (num_host_blocks, self.num_layers, 2, self.block_size)


LLAMA3_8B = KvGeometry(num_layers=32, block_size=16, num_kv_heads=8, head_dim=128)
"""Llama-3-8B with 16-token bf16 blocks: 32 KiB per chunk, 2 MiB per block over all layers."""
