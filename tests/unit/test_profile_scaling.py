"""A measured GPU profile carried to another GPU by datasheet ratios (cost/profile_scaling.py)."""

from __future__ import annotations

import pytest

from cachepilot_sim.cost.gpu_profile import load_gpu_profile
from cachepilot_sim.cost.profile_scaling import (
    PROFILES_DIR,
    gpu_preset,
    hardware_profile,
    scale_profile,
)

H100 = load_gpu_profile(PROFILES_DIR / "h100_sxm_2026-12-06.json")


def test_a_profile_on_its_own_gpu_is_itself() -> None:
    profile, how = hardware_profile(H100, gpu_preset("h100_sxm"))
    assert profile is H100 and "measured" in how


def test_on_a_gpu_without_a_micro_profile_it_is_scaled_by_the_datasheets() -> None:
    h100, h200 = gpu_preset("h100_sxm"), gpu_preset("h200")
    profile, how = hardware_profile(H100, h200)
    assert "datasheet" in how and profile.gpu.startswith("h200")
    bw = h200.hbm_gbps / h100.hbm_gbps  # 4.8 / 3.35; the two have the same BF16 peak
    assert profile.hbm_read_bytes_per_us == pytest.approx(H100.hbm_read_bytes_per_us * bw)
    assert profile.decode.token_us == pytest.approx(H100.decode.token_us / bw)
    # a one-row GEMM reads its weights: the bandwidth ratio; an 8k-row one is compute-bound
    small, large = H100.gemm["gate_up"].x[0], H100.gemm["gate_up"].x[-1]
    ratio_small = profile.gemm_us("gate_up", small) / H100.gemm_us("gate_up", small)
    ratio_large = profile.gemm_us("gate_up", large) / H100.gemm_us("gate_up", large)
    assert ratio_small == pytest.approx(1 / bw, rel=1e-3)
    assert ratio_large == pytest.approx(1.0, rel=1e-3)
    assert profile.launch_us == H100.launch_us  # a datasheet says nothing of launch costs


def test_scaling_to_the_same_datasheet_changes_nothing() -> None:
    same = scale_profile(H100, gpu_preset("h100_sxm"), gpu_preset("h100_sxm"))
    for layer, curve in H100.gemm.items():
        assert same.gemm[layer].y == pytest.approx(curve.y, rel=1e-12)
    assert same.decode == H100.decode and same.prefill == H100.prefill
    assert same.hbm_copy_bytes_per_us == H100.hbm_copy_bytes_per_us
