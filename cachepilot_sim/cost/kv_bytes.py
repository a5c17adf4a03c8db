"""Bytes of KV cache one token occupies: its K and V rows in every layer, from the model's shape.

The one place this is computed; the pool and CPU-tier sizes, the scorecard, the offline bound, the
vLLM adapter and the calibration's model all call `kv_bytes_per_token`. Pure; no simpy.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

# Per-token INT8 quantization (the project's kernels, kernels/reference.py) keeps one float32 scale
# per token for each (layer, K|V) row of num_kv_heads x head_dim values.
INT8_SCALE_BYTES = 4


class KvShape(Protocol):
    """What a token's KV size depends on (ModelConfig and the calibration's LlamaShape have it)."""

    @property
    def num_layers(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...


class KvDtype(StrEnum):
    """How a KV cache stores its values (the scorecard's columns)."""

    FP16 = "fp16"  # bf16/fp16: 2 bytes a value
    FP8 = "fp8"  # e4m3 with one scale per tensor (vLLM's fp8 KV cache): 1 byte a value
    INT8 = "int8"  # 1 byte a value plus a float32 scale per token and (layer, K|V) row

    @property
    def value_bytes(self) -> int:
        return 2 if self == KvDtype.FP16 else 1

    @property
    def scale_bytes(self) -> int:
        """Scale bytes per token and (layer, K|V) row."""
        return INT8_SCALE_BYTES if self == KvDtype.INT8 else 0


def kv_bytes_per_token(shape: KvShape, value_bytes: int, scale_bytes: int = 0) -> int:
    """K and V of one token in every layer: 2 x num_layers rows of num_kv_heads x head_dim values
    of `value_bytes` each, plus `scale_bytes` per row (a per-token quantization scale; 0: none).
    """
    row_values = shape.num_kv_heads * shape.head_dim
    return 2 * shape.num_layers * (row_values * value_bytes + scale_bytes)
