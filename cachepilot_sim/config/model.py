"""A served model: its pinned weights and the KV geometry that sets bytes per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cachepilot_sim.config.base import Sealed, bounded


@dataclass
class ModelConfig(Sealed):
    """A served model: its pinned weights and the KV geometry that sets bytes per token."""

    section: ClassVar[str | None] = "model"
    name: str = bounded("llama3_8b_fp8w", nonempty=True)
    num_layers: int = bounded(32, gt=0)
    num_kv_heads: int = bounded(8, gt=0)
    head_dim: int = bounded(128, gt=0)
    kv_dtype_bytes: int = bounded(2, gt=0)
    weight_bytes: int = bounded(8_030_000_000, ge=0)
    max_context_tokens: int = bounded(131_072, gt=0)
    # Roofline figures (the scorecard's compute bound; the simulator does not read them).
    num_params: int = bounded(8_030_000_000, ge=0)
    # Query heads; attention FLOPs scale with these, KV with kv_heads.
    num_attention_heads: int = bounded(32, ge=0)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes
