"""A served model: its pinned weights and the KV geometry that sets bytes per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cachepilot_sim.config.base import Sealed, bounded, join_key, require

MAX_BYTES = 10**15  # a petabyte of weights: beyond it, a typo (and int64 sums overflow)
MAX_PARAMS = 10**15
KV_DTYPE_BYTES = (1, 2, 4)  # FP8/INT8, FP16/BF16, FP32: the element sizes a KV cache uses


@dataclass
class ModelConfig(Sealed):
    """A served model: its pinned weights and the KV geometry that sets bytes per token."""

    section: ClassVar[str | None] = "model"
    name: str = bounded("llama3_8b_fp8w", nonempty=True)
    num_layers: int = bounded(32, gt=0, le=10_000, integer=True)
    num_kv_heads: int = bounded(8, gt=0, le=10_000, integer=True)
    head_dim: int = bounded(128, gt=0, le=65_536, integer=True)
    kv_dtype_bytes: int = bounded(2, gt=0, integer=True)
    weight_bytes: int = bounded(8_030_000_000, ge=0, le=MAX_BYTES, integer=True)
    max_context_tokens: int = bounded(131_072, gt=0, le=2**31 - 1, integer=True)
    # Roofline figures (the scorecard's compute bound; the simulator does not read them).
    num_params: int = bounded(8_030_000_000, ge=0, le=MAX_PARAMS, integer=True)
    # Query heads; attention FLOPs scale with these, KV with kv_heads.
    num_attention_heads: int = bounded(32, ge=0, le=10_000, integer=True)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(
            self.kv_dtype_bytes in KV_DTYPE_BYTES,
            join_key(prefix, "kv_dtype_bytes"),
            self.kv_dtype_bytes,
            f"bytes per KV element: one of {list(KV_DTYPE_BYTES)}",
        )
        require(
            self.num_kv_heads <= self.num_attention_heads,
            join_key(prefix, "num_kv_heads"),
            self.num_kv_heads,
            f"more KV heads than query heads (num_attention_heads = {self.num_attention_heads})",
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes
