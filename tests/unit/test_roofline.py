"""Roofline formulas against hand-computed values (docs/roofline.md)."""

from __future__ import annotations

import math

import pytest

from cachepilot_sim.config import ConfigError, GpuSpecConfig, ModelConfig
from cachepilot_sim.cost.roofline import (
    capacity_tokens,
    decode_bound,
    flops_per_token,
    kv_pool_bytes,
    pcie_gbps,
    peak_tflops,
    ridge_batch,
)

GIB = 1024**3


def make_model(**overrides: object) -> ModelConfig:
    values: dict[str, object] = dict(
        name="llama3_8b",
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        kv_dtype_bytes=2,
        weight_bytes=16_060_000_000,
        num_params=8_030_000_000,
        num_attention_heads=32,
    )
    values.update(overrides)
    return ModelConfig(**values)  # type: ignore[arg-type]


def make_h200(**overrides: object) -> GpuSpecConfig:
    return GpuSpecConfig(**overrides)  # type: ignore[arg-type]  # defaults: H200 datasheet


def test_capacity_after_weights_and_reserve_on_h200() -> None:
    pool = kv_pool_bytes(make_h200(), make_model(), GIB)
    assert pool == 141_000_000_000 - 16_060_000_000 - GIB == 123_866_258_176
    assert capacity_tokens(pool, 131_072) == 945_024  # 123,866,258,176 / 131,072 = 945,024.6


def test_pool_is_zero_when_the_weights_do_not_fit() -> None:
    assert kv_pool_bytes(make_h200(hbm_gb=16.0), make_model(), GIB) == 0


def test_decode_bound_batch_one_is_bandwidth_bound_on_h200() -> None:
    b = decode_bound(make_h200(), make_model(), 1, 2048, 131_072)
    assert b.step_bytes == 16_060_000_000 + 2048 * 131_072  # 16,328,435,456
    assert b.bandwidth_us == pytest.approx(16_328_435_456 / 4.8e6)  # 3,401.76 µs
    assert b.step_flops == 2 * 8_030_000_000 + 4 * 32 * 32 * 128 * 2048  # 17,133,741,824
    assert b.compute_us == pytest.approx(17_133_741_824 / 989.5e6)  # 17.32 µs
    assert b.binding == "bandwidth"
    assert b.tokens_per_s == pytest.approx(1e6 / 3401.757, rel=1e-5)  # 294 tokens/s


def test_fp8_weights_use_the_fp8_peak_only_where_the_part_has_it() -> None:
    fp8w = make_model(weight_bytes=8_030_000_000)
    assert peak_tflops(make_h200(), fp8w) == 1979.0
    assert peak_tflops(make_h200(fp8_dense_tflops=0.0), fp8w) == 989.5
    assert peak_tflops(make_h200(), make_model()) == 989.5


def test_ridge_batch_at_zero_context_is_weights_time_over_compute_per_sequence() -> None:
    fp8w = make_model(weight_bytes=8_030_000_000)
    # (8.03e9 B / 4.8e6 B/µs) / (1.606e10 FLOP / 1.979e9 FLOP/µs) = 1672.92 / 8.1152 = 206.1
    assert ridge_batch(make_h200(), fp8w, 0, 131_072) == pytest.approx(206.14, abs=0.01)
    b = decode_bound(make_h200(), fp8w, 207, 0, 131_072)
    assert b.binding == "compute"


def test_ridge_batch_is_infinite_when_kv_reads_outgrow_compute() -> None:
    assert math.isinf(ridge_batch(make_h200(), make_model(), 2048, 131_072))


def test_attention_flops_grow_with_context() -> None:
    m = make_model()
    assert flops_per_token(m, 1000) - flops_per_token(m, 0) == 4 * 32 * 32 * 128 * 1000


def test_pcie_gen5_x16_after_line_coding() -> None:
    assert pcie_gbps(make_h200()) == pytest.approx(32 * 128 / 130 / 8 * 16)  # 63.0 GB/s


@pytest.mark.parametrize(
    ("key", "value"),
    [("hbm_gbps", -1.0), ("bf16_dense_tflops", 0.0), ("pcie_gen", 7), ("fp8_dense_tflops", -2.0)],
)
def test_bad_gpu_figure_names_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"gpu.{key}"):
        make_h200(**{key: value})
