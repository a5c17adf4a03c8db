"""The physical step cost (cost/step_physical.py over cost/gpu_profile.py): curves extrapolate,
the engine's padding is honoured, fits predict out of their range, and the port's decode runs
price each step as a single step would be priced."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml

from cachepilot_sim.components.step_cost import PhysicalStepCost
from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import StepCost
from cachepilot_sim.config.base import ConfigError
from cachepilot_sim.config.engine_profile import EngineConfig
from cachepilot_sim.cost.gpu_profile import (
    GpuProfile,
    datasheet_profile,
    linear_shapes,
    load_gpu_profile,
)
from cachepilot_sim.cost.step_physical import (
    TERMS,
    PaddingRules,
    PhysicalFit,
    PhysicalStepModel,
    batch_shape,
    fit_physical,
    pad_shapes,
    physical_terms,
)
from cachepilot_sim.kernels.profile_gpu import DEFAULT_MODEL, GEMM_TOKENS
from cachepilot_sim.tools.fit_physical import load_physical_steps, recorded_shapes
from cachepilot_sim.tools.validate import validate_runs

NUM_LAYERS = 32


def synthetic_profile_json() -> dict[str, Any]:
    """A gpu_profile.json in profile_gpu.py's schema, H200-like but invented: GEMMs whose
    efficiency ramps up with M (not a line), attention with a single-sequence critical path."""
    model = dict(DEFAULT_MODEL)
    gemm = []
    for layer, (k, n) in linear_shapes(model).items():
        for m in GEMM_TOKENS:
            efficiency = 0.75 * m / (m + 96)  # of 989.5 TFLOP/s
            compute = 2 * m * k * n / (989.5e6 * max(efficiency, 1e-3))
            memory = (m * k + k * n + m * n) * 2 / 4.3e6
            gemm.append({"layer": layer, "m": m, "k": k, "n": n, "us": 6.0 + max(compute, memory)})
    prefill = [
        {"tokens": t, "us": 12.0 + t * (t + 1) / 2 * 2.1e-5} for t in (256, 512, 2048, 4096, 8192)
    ]
    decode = [
        {"batch": b, "context": c, "us": 9.0 + max(b * c * 1.1e-3, c * 0.038)}
        for b in (1, 8, 32, 128)
        for c in (512, 2048, 8192)
        if b * c <= 2**20
    ]
    return {
        "format": "cachepilot-gpu-profile/1",
        "gpu": "Synthetic H200",
        "sm_count": 132,
        "model": model,
        "hbm_read_bytes_per_us": 4.2e6,
        "hbm_copy_bytes_per_us": 3.9e6,
        "launch_us": 4.5,
        "graph_kernel_us": 1.8,
        "pcie_h2d_bytes_per_us": 5.0e4,
        "pcie_d2h_bytes_per_us": 5.2e4,
        "gemm": gemm,
        "attention": {"prefill": prefill, "decode": decode},
    }


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> GpuProfile:
    path = tmp_path_factory.mktemp("gpu") / "gpu_profile.json"
    path.write_text(json.dumps(synthetic_profile_json()))
    return load_gpu_profile(path)


TRUTH = PhysicalFit(
    overhead_us=3000.0,
    request_us=40.0,
    gemm_scale=1.08,
    kv_copy_scale=1.3,
    attention_scale=1.6,
    elementwise_scale=0.9,
    grid_block_ns=0.8,
)


def test_gemm_curve_reproduces_points_and_extrapolates_linearly(profile: GpuProfile) -> None:
    rows = [r for r in synthetic_profile_json()["gemm"] if r["layer"] == "gate_up"]
    for row in rows:
        assert profile.gemm_us("gate_up", row["m"]) == pytest.approx(row["us"], rel=1e-12)
    last, before = rows[-1], rows[-2]
    slope = (last["us"] - before["us"]) / (last["m"] - before["m"])
    assert profile.gemm_us("gate_up", 16384) == pytest.approx(last["us"] + slope * 8192)
    assert profile.gemm_us("gate_up", 16384) > 1.9 * profile.gemm_us("gate_up", 8192)  # no clamp
    between = profile.gemm_us("gate_up", 5120)
    assert rows[-3]["us"] < between < last["us"]
    assert profile.gemm_us("gate_up", 0) == 0.0


def test_padding_follows_the_engine(profile: GpuProfile) -> None:
    rules = PaddingRules(
        q_pad_tokens=256, kv_pad_tokens=16384, max_batch_tokens=2048, max_seqs=1024
    )
    s = batch_shape(rules, np.array([1, 1, 300]), np.array([600, 17000, 0]))
    assert s.q_padded[0] == 512 and s.kv_read_padded[0] == 32768 and s.seq_slots[0] == 512
    assert s.prefill_tokens[0] == 300 and s.num_prefill_requests[0] == 1
    assert s.longest[0] == 17001
    # transformers' pad_to_interval: nothing read still launches one interval; capped at budget
    s = batch_shape(rules, np.array([2040]), np.array([0]))
    assert s.q_padded[0] == 2048 and s.kv_read_padded[0] == 16384 and s.seq_slots[0] == 1024
    unpadded = PaddingRules(q_pad_tokens=64)
    s = batch_shape(unpadded, np.array([1]), np.array([700]))
    assert s.q_padded[0] == 64 and s.kv_read_padded[0] == 700 and s.seq_slots[0] == 64


def synthetic_steps(rules: PaddingRules, rng: np.random.Generator, max_q: int, num: int) -> Any:
    """Steps of prefill chunks and decode batches of up to `max_q` queries."""
    q = rng.integers(1, max_q + 1, num).astype(np.float64)
    decode = rng.random(num) < 0.5
    reqs = np.where(decode, np.minimum(q, rng.integers(1, 257, num)), 1)
    q = np.where(decode, reqs, q)
    ctx = np.where(decode, reqs * rng.integers(16, 6000, num), rng.integers(0, 4096, num))
    longest = np.where(decode, ctx / reqs * 1.5 + 1, ctx + q)
    prefill = (np.where(decode, 0, q), np.where(decode, 0, 1))
    return pad_shapes(rules, q, ctx, longest, prefill, reqs)


def test_fit_recovers_the_engine_and_predicts_larger_steps_at_another_padding(
    profile: GpuProfile,
) -> None:
    rng = np.random.default_rng(7)
    fit_rules = PaddingRules(q_pad_tokens=256, kv_pad_tokens=16384, max_seqs=1024)
    train = synthetic_steps(fit_rules, rng, 2048, 400)
    x = physical_terms(profile, NUM_LAYERS, train)
    noise = 1 + 0.01 * rng.standard_normal(x.shape[0])
    fit, resid = fit_physical(x, x @ TRUTH.coefficients() * noise)
    assert np.percentile(np.abs(resid), 90) < 0.03
    big = synthetic_steps(PaddingRules(64, 16384, max_seqs=1024), rng, 8192, 200)
    keep = big.q_tokens > 4096
    xb = physical_terms(profile, NUM_LAYERS, big)[keep]
    truth, model = xb @ TRUTH.coefficients(), xb @ fit.coefficients()
    assert np.abs(model / truth - 1).max() < 0.05


def test_zero_query_tokens_cost_nothing_but_every_term_is_monotone(profile: GpuProfile) -> None:
    rules = PaddingRules(q_pad_tokens=64, kv_pad_tokens=0, max_seqs=1024)
    model = PhysicalStepCost(PhysicalStepModel(profile, NUM_LAYERS, rules, TRUTH))
    empty = np.zeros(0, dtype=np.int64)
    assert model.iteration_us(empty, empty, empty, empty) == 0.0
    small = model.iteration_us(np.array([64]), np.array([0]), np.ones(1), np.zeros(1))
    large = model.iteration_us(np.array([8192]), np.array([0]), np.ones(1), np.zeros(1))
    huge = model.iteration_us(np.array([12288]), np.array([0]), np.ones(1), np.zeros(1))
    assert 0 < small < large < huge
    assert huge - large > 0.4 * (large - small) * 4096 / 8128  # priced on, not clamped at 8192


@pytest.mark.parametrize("num_requests", [1, 7, 130])
def test_decode_run_prices_every_step_as_iteration_us(
    profile: GpuProfile, num_requests: int
) -> None:
    rules = PaddingRules(q_pad_tokens=64, kv_pad_tokens=16384, max_seqs=1024)
    cost = PhysicalStepCost(PhysicalStepModel(profile, NUM_LAYERS, rules, TRUTH))
    rng = np.random.default_rng(num_requests)
    ctx = rng.integers(1, 9000, num_requests)
    tok, mdl = np.ones(num_requests), np.zeros(num_requests)
    run = cost.decode_run_us(ctx, tok, mdl, 40)
    one = [
        cost.iteration_us(np.ones(num_requests, dtype=np.int64), ctx + j, tok, mdl)
        for j in range(40)
    ]
    assert run.tolist() == one
    assert cost.iteration_us_ints([1], [5], [1]) is None
    assert all(b > a for a, b in zip(one, one[1:], strict=False)) or num_requests == 1


def test_datasheet_profile_prices_gemms_at_peak(profile: GpuProfile) -> None:
    sheet = datasheet_profile("h200", 4800.0, 989.5, 64.0, dict(DEFAULT_MODEL))
    k, n = linear_shapes(DEFAULT_MODEL)["gate_up"]
    assert sheet.gemm_us("gate_up", 8192) == pytest.approx(2 * 8192 * k * n / 989.5e6)
    assert sheet.gemm_us("gate_up", 1) == pytest.approx((k + k * n + n) * 2 / 4.8e6)
    assert math.isclose(sheet.prefill.at(1e6), 2 * sheet.prefill.at(5e5))
    assert (*TERMS, "eager_floor_us") == PhysicalFit.__slots__  # type: ignore[attr-defined]


ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "experiments/validation/hf_cb/2026-12-06-h100"
# The fitted configuration's serving steps (256-token padding, 2048 budget) and the cost
# micro-runs up to 2048 queries (64-token padding): the shipped profile's data.
FIT_256 = [H100 / w / "run1/steps.parquet" for w in ("closed_b64", "poisson_r6", "multiturn")]
MICRO_8K = H100 / "microbench_8k/steps.parquet"
MEASURED_RATES = {"elementwise_scale": 1.0, "kv_copy_scale": 1.0}  # held, not fitted
# The engine's defaults (64-token padding, 8192 budget, lazy graphs): held out.
DEFAULTS_64 = sorted(H100.glob("defaults/*/run*/steps.parquet"))


@pytest.fixture(scope="module")
def h100_fit() -> tuple[GpuProfile, PhysicalFit]:
    profile = load_gpu_profile(H100 / "gpu_profile.json")
    steps = load_physical_steps(FIT_256)
    x = physical_terms(profile, NUM_LAYERS, recorded_shapes(steps))
    fit, resid = fit_physical(x, steps["gpu_us"].to_numpy())
    assert np.percentile(np.abs(resid), 90) < 0.05
    return profile, fit


def test_fit_at_256_padding_predicts_the_64_padded_defaults(
    h100_fit: tuple[GpuProfile, PhysicalFit],
) -> None:
    profile, fit = h100_fit
    steps = load_physical_steps(DEFAULTS_64)
    assert set(steps["q_tokens_padded"].unique().to_list()) & {64, 128, 192}  # other padding
    x = physical_terms(profile, NUM_LAYERS, recorded_shapes(steps))
    y = steps["gpu_us"].to_numpy().astype(np.float64)
    err = (x @ fit.coefficients() - y) / y
    assert np.abs(err).mean() < 0.05  # measured 4.6 % (p90 8.0 %, signed +4.2 %)


def test_recorded_padding_is_the_engines_rule() -> None:
    for path, q_pad in ((FIT_256[0], 256), (DEFAULTS_64[0], 64)):
        steps = load_physical_steps([path])
        rules = PaddingRules(q_pad, 16384, max_batch_tokens=2048 if q_pad == 256 else 8192)
        s = pad_shapes(
            rules,
            steps["q_tokens"].to_numpy(),
            steps["kv_read_tokens"].to_numpy(),
            steps["max_seqlen_k"].to_numpy(),
            (steps["prefill_tokens"].to_numpy(), steps["num_prefill_requests"].to_numpy()),
            steps["num_requests"].to_numpy(),
        )
        assert (s.q_padded == steps["q_tokens_padded"].to_numpy()).all()
        assert (s.kv_read_padded == steps["kv_read_padded"].to_numpy()).all()


def test_hf_cb_physical_profile_holds_the_fit_of_its_comment() -> None:
    engine = yaml.safe_load((CONF_DIR / "engine/hf_cb_physical.yaml").read_text())["engine"]
    profile = load_gpu_profile(H100 / "gpu_profile.json")
    steps = load_physical_steps([MICRO_8K, *FIT_256]).filter(pl.col("q_tokens") <= 2048)
    x = physical_terms(profile, NUM_LAYERS, recorded_shapes(steps))
    fit, _ = fit_physical(x, steps["gpu_us"].to_numpy(), MEASURED_RATES)
    held = load_physical_steps(DEFAULTS_64)  # the 64-padded defaults, held out: 3.1 % measured
    xh = physical_terms(profile, NUM_LAYERS, recorded_shapes(held))
    yh = held["gpu_us"].to_numpy().astype(np.float64)
    assert np.abs((xh @ fit.coefficients() - yh) / yh).mean() < 0.05
    for name in TERMS:
        assert engine[f"physical_{name}"] == pytest.approx(getattr(fit, name), rel=1e-9, abs=1e-9)
    cfg = EngineConfig(
        **{k: v for k, v in engine.items() if k not in ("step_cost", "preemption", "graph_mode")}
    )
    assert cfg.gpu_profile == engine["gpu_profile"]


def test_physical_needs_a_profile_and_its_gemms() -> None:
    with pytest.raises(ConfigError, match=r"engine\.gpu_profile"):
        EngineConfig(step_cost=StepCost.PHYSICAL, physical_gemm_scale=1.0)
    with pytest.raises(ConfigError, match=r"engine\.physical_gemm_scale"):
        EngineConfig(step_cost=StepCost.PHYSICAL, gpu_profile="x.json")


def test_hf_cb_physical_replays_a_run_to_completion() -> None:
    # the defaults/ runs capture graphs lazily, which validate refuses for now
    out, _ = validate_runs(H100 / "closed_b64", "hf_cb_physical")
    row = out["closed_b64"]
    assert row["finished_sim"] == row["requests"] == 64


def test_a_held_term_keeps_its_value_and_an_unknown_one_is_refused() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(1.0, 100.0, size=(60, len(TERMS)))
    y = x @ np.arange(1.0, len(TERMS) + 1.0)
    fit, resid = fit_physical(x, y, {"elementwise_scale": 6.0})  # its true value
    assert fit.elementwise_scale == 6.0 and np.abs(resid).max() < 1e-9
    held, _ = fit_physical(x, y, {"elementwise_scale": 0.0})  # a wrong value: the rest absorb it
    assert held.elementwise_scale == 0.0
    with pytest.raises(ValueError, match="no physical term 'bogus'"):
        fit_physical(x, y, {"bogus": 1.0})
