"""Cost laws of the roofline and the KV conversion: non-negative, monotone, zero for no work."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cachepilot_sim.config import GpuSpecConfig, ModelConfig
from cachepilot_sim.cost import quantize_us
from cachepilot_sim.cost.roofline import decode_bound

SIZES = st.integers(min_value=0, max_value=1 << 40)


@given(SIZES, SIZES, st.floats(min_value=1.0, max_value=1e8))
def test_quantize_time_is_nonnegative_monotone_and_zero_for_nothing(
    a: int, b: int, rate: float
) -> None:
    small, large = sorted((a, b))
    assert quantize_us(rate, 0, 0) == 0
    assert 0 <= quantize_us(rate, small, small // 2) <= quantize_us(rate, large, large // 2)


@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(0, 131_072))
def test_decode_step_bound_grows_with_batch_and_is_the_larger_of_the_two(
    b1: int, b2: int, context: int
) -> None:
    gpu, model = GpuSpecConfig(), ModelConfig()
    small, large = sorted((b1, b2))
    lo = decode_bound(gpu, model, small, context, 131_072)
    hi = decode_bound(gpu, model, large, context, 131_072)
    assert 0 < lo.step_us <= hi.step_us
    assert lo.step_us >= lo.bandwidth_us and lo.step_us >= lo.compute_us
