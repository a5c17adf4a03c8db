"""vLLM 0.26's physical step cost (cost/step_physical.py, kernels=vllm; tools/fit_vllm.py): its
padding rules, the profile conf/engine/vllm_v1_h100.yaml being the fit of the committed H100
micro-runs, and that fit tested out of its range (fitted on steps of at most 2048 queries and 64
requests, it prices the 4096-8192-query prefills and the 128-request decode batches)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config.engine_profile import PhysicalKernels
from cachepilot_sim.cost.step_physical import TERMS, PaddingRules, batch_shape, decode_shapes
from cachepilot_sim.tools.fit_physical import profile_for
from cachepilot_sim.tools.fit_vllm import fit_in_range

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / "experiments/validation/vllm/2026-12-07-h100"
PROFILE = ROOT / "experiments/validation/hf_cb/2026-12-06-h100/gpu_profile.json"
RULES = PaddingRules(1, kernels=PhysicalKernels.VLLM, graph_sizes=(1, 2, 4, 8, 16, 512))
FIXED = {"overhead_us": 0.0, "elementwise_scale": 1.0, "kv_copy_scale": 1.0}


def test_a_uniform_decode_step_is_padded_to_the_next_capture_size() -> None:
    s = batch_shape(RULES, np.ones(3), np.array([100, 200, 300]))
    assert s.q_padded[0] == 4 and s.eager is not None and not s.eager[0]
    assert s.seq_slots[0] == 3  # the LM head runs on the sampled rows only


def test_a_mixed_step_or_a_decode_past_the_largest_size_runs_eagerly_unpadded() -> None:
    mixed = batch_shape(RULES, np.array([1, 1, 300]), np.array([100, 200, 0]))
    assert mixed.q_padded[0] == 302 and mixed.eager is not None and mixed.eager[0]
    big = batch_shape(RULES, np.ones(600), np.full(600, 50))
    assert big.q_padded[0] == 600 and big.eager is not None and big.eager[0]


def test_a_decode_run_is_shaped_as_each_of_its_steps() -> None:
    run = decode_shapes(RULES, np.array([10, 20, 30, 40, 50]), 3)
    assert run.q_padded.tolist() == [8.0, 8.0, 8.0] and run.eager is not None
    assert not run.eager.any()


@pytest.fixture(scope="module")
def fitted() -> tuple[object, dict]:
    paths = [VLLM / "microbench" / "steps.parquet", VLLM / "microbench_mixed" / "steps.parquet"]
    return fit_in_range(profile_for(str(PROFILE)), paths, (2048, 64), FIXED)


def test_the_vllm_h100_profile_is_the_fit_of_the_micro_runs(fitted: tuple) -> None:
    fit, _ = fitted
    engine = yaml.safe_load((CONF_DIR / "engine" / "vllm_v1_h100.yaml").read_text())["engine"]
    assert engine["physical_kernels"] == "VLLM" and engine["step_cost"] == "PHYSICAL"
    for name in (*TERMS, "eager_floor_us"):
        assert engine[f"physical_{name}"] == pytest.approx(getattr(fit, name), rel=1e-9), name


def test_the_fit_prices_steps_beyond_its_range_within_10_percent(fitted: tuple) -> None:
    _, report = fitted
    out = report["out_of_range"]
    assert out["eager"]["steps"] >= 5 and out["graph"]["steps"] >= 300  # 4096-8192 q, b128
    for kind in ("eager", "graph"):
        assert out[kind]["abs_mean"] < 0.10 and abs(out[kind]["signed_mean"]) < 0.10, kind
    inside = report["in_range"]
    assert inside["graph"]["abs_median"] < 0.05  # the decode graphs the terms were fitted on


def test_the_eager_floor_is_a_measured_host_launch_not_a_fitted_constant(fitted: tuple) -> None:
    fit, report = fitted
    steps = report["host_bound_eager_steps"]
    assert len(steps["interval_us"]) >= 8
    assert fit.eager_floor_us == float(np.median(steps["interval_us"]))
    # every one of them is host-bound: its launch is most of its interval
    assert all(
        launch > 0.7 * interval
        for launch, interval in zip(steps["launch_us"], steps["interval_us"], strict=True)
    )
