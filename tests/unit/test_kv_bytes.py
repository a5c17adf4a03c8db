"""KV bytes per token, the one formula (cost/kv_bytes.py), against hand-computed values."""

from __future__ import annotations

import pytest

from cachepilot_sim.config import ModelConfig
from cachepilot_sim.cost.kv_bytes import INT8_SCALE_BYTES, KvDtype, kv_bytes_per_token
from cachepilot_sim.kernels.llama_shape import LlamaShape


def make_model(**overrides: object) -> ModelConfig:
    values: dict[str, object] = dict(
        name="llama3_8b", num_layers=32, num_kv_heads=8, head_dim=128, kv_dtype_bytes=2
    )
    values.update(overrides)
    return ModelConfig(**values)  # type: ignore[arg-type]


def test_kv_bytes_per_token_of_llama3_8b_per_dtype() -> None:
    m = make_model()
    # 2 (K, V) x 32 layers x 8 heads x 128 dims = 65,536 values a token.
    sizes = {d: kv_bytes_per_token(m, d.value_bytes, d.scale_bytes) for d in KvDtype}
    assert sizes[KvDtype.FP16] == 131_072
    assert sizes[KvDtype.FP8] == 65_536
    assert sizes[KvDtype.INT8] == 65_536 + 2 * 32 * INT8_SCALE_BYTES  # a float32 scale a row


@pytest.mark.parametrize("kv_dtype_bytes", [1, 2, 4])
def test_the_models_own_size_is_the_formula_at_its_dtype(kv_dtype_bytes: int) -> None:
    m = make_model(num_layers=80, num_kv_heads=8, head_dim=128, kv_dtype_bytes=kv_dtype_bytes)
    assert kv_bytes_per_token(m, kv_dtype_bytes) == m.kv_bytes_per_token
    assert kv_bytes_per_token(m, kv_dtype_bytes) == 2 * 80 * 8 * 128 * kv_dtype_bytes


def test_the_calibration_model_uses_the_same_formula() -> None:
    shape = LlamaShape()
    assert shape.kv_bytes_per_token == kv_bytes_per_token(shape, 2) == 131_072
