from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import HardwareConfig, ModelConfig
from cachepilot_sim.cost import (
    TransferFit,
    compute_fit,
    decode_step_slope_us,
    iteration_us,
    prefill_us,
    recompute_us,
    transfer_fits,
    transfer_us,
)

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((ROOT / "tests" / "data" / "h200_limits.json").read_text())


def load_hardware(path: Path) -> HardwareConfig:
    """A conf/hardware YAML file through the same schema Hydra uses."""
    node = OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.load(path))
    hw = OmegaConf.to_object(node)
    assert isinstance(hw, HardwareConfig)
    return hw


# The hand fit to the workplace reference measurements (HF prefill, plain pinned copies).
H200 = load_hardware(CONF_DIR / "hardware" / "h200_reference.yaml")
FIT = compute_fit(H200)
BF16_8B_WEIGHTS = ModelConfig(weight_bytes=16_060_000_000).weight_bytes


@pytest.mark.parametrize("tokens", ["2048", "8192", "32768"])
def test_prefill_reproduces_h200_measurement_within_2_percent(tokens: str) -> None:
    """Points >= 2k tokens; at 128-512 tokens the measurement is dominated by the framework's
    per-call overhead (17.5 ms for 128 tokens), which a serving engine does not pay per request."""
    measured_us = REF["prefill_llama3_8b_shape"][tokens]["ms"] * 1000
    modelled = prefill_us(FIT, BF16_8B_WEIGHTS, int(tokens))
    assert modelled == pytest.approx(measured_us, rel=0.02)


@pytest.mark.parametrize("size", ["16MB", "256MB", "1024MB"])
def test_transfer_reproduces_pinned_pcie_bandwidth_within_5_percent(size: str) -> None:
    num_bytes = int(size.removesuffix("MB")) * 2**20
    h2d, d2h = transfer_fits(H200)
    for fit, key in ((h2d, "h2d_pinned_GBps"), (d2h, "d2h_pinned_GBps")):
        measured_us = num_bytes / (REF["pcie"][size][key] * 1e3)
        assert transfer_us(fit, num_bytes) == pytest.approx(measured_us, rel=0.05)


def test_recompute_costs_30_to_45_us_per_token_at_serving_context_lengths() -> None:
    for n in (2048, 8192, 32768):
        per_token = recompute_us(FIT, n) / n
        assert 25.0 <= per_token <= 45.0


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=0, max_value=1 << 40))
def test_transfer_time_is_monotone_nonnegative_and_zero_for_nothing(a: int, b: int) -> None:
    fit = TransferFit(latency_us=9.0, bytes_per_us=55e3)
    lo, hi = sorted((a, b))
    assert transfer_us(fit, 0) == 0
    assert 0 <= transfer_us(fit, lo) <= transfer_us(fit, hi)


@given(st.integers(min_value=0, max_value=200_000), st.integers(min_value=0, max_value=200_000))
def test_recompute_is_monotone_and_superlinear(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert recompute_us(FIT, 0) == 0.0
    assert recompute_us(FIT, lo) <= recompute_us(FIT, hi)
    if lo > 0:
        assert recompute_us(FIT, hi) / hi >= recompute_us(FIT, lo) / lo - 1e-9


@given(
    st.integers(min_value=1, max_value=256),
    st.integers(min_value=0, max_value=32768),
    st.integers(min_value=1, max_value=64),
)
def test_decode_slope_predicts_the_next_iteration(num_seqs: int, ctx: int, steps: int) -> None:
    tok_bytes = 131072.0

    def decode_iteration(c: int) -> float:
        return iteration_us(FIT, 8e9, num_seqs, num_seqs * c * tok_bytes, num_seqs * (c + 0.5))

    slope = decode_step_slope_us(FIT, num_seqs * tok_bytes, num_seqs)
    predicted = decode_iteration(ctx) + steps * slope
    assert predicted == pytest.approx(decode_iteration(ctx + steps), rel=1e-9)


def test_default_hardware_is_the_committed_h200_calibration() -> None:
    """conf/hardware/h200.yaml, the dataclass defaults and the calibration output agree."""
    conf = load_hardware(CONF_DIR / "hardware" / "h200.yaml")
    calibrated = load_hardware(ROOT / "experiments" / "calibration" / "h200_calibrated.yaml")
    numbers = [
        {k: v for k, v in asdict(hw).items() if k != "source"}
        for hw in (conf, calibrated, HardwareConfig())
    ]
    assert numbers[0] == numbers[1] == numbers[2]


CALIBRATION = json.loads(
    (ROOT / "experiments" / "calibration" / "2026-11-29_h200.json").read_text()
)


def test_calibrated_iteration_model_meets_the_calibration_error_goal() -> None:
    """Every measured prefill and decode step of the calibration run within 25 % (the goal), the
    median within 10 %, using the simulator's own iteration formula."""
    fit = compute_fit(HardwareConfig())
    model = CALIBRATION["model"]
    weights, per_token = model["weight_bytes"], model["kv_bytes_per_token"]
    errors = []
    for point in CALIBRATION["prefill"]:
        n = point["num_tokens"]
        errors.append(prefill_us(fit, weights, n) / point["median_us"] - 1)
    for point in CALIBRATION["decode"]:
        b, c = point["batch_size"], point["context_tokens"]
        predicted = iteration_us(fit, weights, b, b * c * per_token, b * (c + 0.5))
        errors.append(predicted / point["median_us"] - 1)
    worst = max(abs(e) for e in errors)
    median = sorted(abs(e) for e in errors)[len(errors) // 2]
    assert len(errors) >= 15 and worst <= 0.25 and median <= 0.10, (median, worst)
