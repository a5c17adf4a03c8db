"""Other GPUs and tensor parallelism (cost/gpu_scaling.py): the H200 calibration scaled by datasheet
ratios, marked derived; TP's split of weights and KV and its ring all-reduce per step."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import (
    BatcherConfig,
    BatchMode,
    ConfigError,
    GpuSpecConfig,
    HardwareConfig,
    ModelConfig,
)
from cachepilot_sim.config.cluster import ClusterConfig
from cachepilot_sim.config.engine_profile import EngineConfig, StepCost
from cachepilot_sim.cost import batch_iteration_us, compute_fit
from cachepilot_sim.cost.gpu_scaling import (
    CALIBRATION_GPU,
    DERIVED_NOTE,
    allreduce_fit,
    derive_hardware,
    hardware_derivation,
    hardware_note,
    ring_allreduce_us,
    run_hardware,
)
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload

GPU_NAMES = sorted(p.stem for p in (CONF_DIR / "gpu").glob("*.yaml"))


def load(cls: type, group: str, name: str) -> Any:
    node = OmegaConf.merge(
        OmegaConf.structured(cls), OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
    )
    return OmegaConf.to_object(node)


GPUS = {name: load(GpuSpecConfig, "gpu", name) for name in GPU_NAMES}
H200_HW = load(HardwareConfig, "hardware", "h200")
LLAMA_70B = load(ModelConfig, "model", "llama3_70b")


def decode_step_us(
    cfg_hw: HardwareConfig, batch: int, ctx: int = 2048, **fit_terms: float
) -> float:
    fit = compute_fit(cfg_hw, **fit_terms)
    n = np.ones(batch)
    return batch_iteration_us(
        fit, [16e9], n, np.full(batch, ctx), np.full(batch, 131072.0), np.zeros(batch, dtype=int)
    )


def test_calibration_gpu_is_the_h200_datasheet_file() -> None:
    assert CALIBRATION_GPU.figures() == GPUS["h200"].figures()
    assert derive_hardware(H200_HW, GPUS["h200"]).hardware is H200_HW


@pytest.mark.parametrize("name", [n for n in GPU_NAMES if n != "h200"])
def test_every_derived_figure_is_marked_with_its_datasheet(name: str) -> None:
    derived = derive_hardware(H200_HW, GPUS[name])
    assert not derived.measured and derived.hardware.name == f"{name}_derived"
    assert DERIVED_NOTE in derived.hardware.source
    for key, figure in derived.provenance.items():
        assert figure["derived"] is True and figure["source"], key
        assert figure["value"] == getattr(derived.hardware, key)
    ratio = GPUS[name].hbm_gbps / 4800.0
    assert derived.hardware.hbm_bytes_per_us == pytest.approx(H200_HW.hbm_bytes_per_us * ratio)


def test_memory_bound_decode_step_falls_as_gpu_bandwidth_rises() -> None:
    by_bandwidth = sorted(GPUS.values(), key=lambda g: g.hbm_gbps)
    times = [decode_step_us(derive_hardware(H200_HW, g).hardware, batch=8) for g in by_bandwidth]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


@given(
    low=st.floats(100.0, 10_000.0),
    factor=st.floats(1.0, 10.0),
    batch=st.integers(1, 256),
    tflops=st.floats(50.0, 5000.0),
)
def test_derived_step_time_is_monotone_in_bandwidth(
    low: float, factor: float, batch: int, tflops: float
) -> None:
    slow = GpuSpecConfig(name="x", hbm_gbps=low, bf16_dense_tflops=tflops)
    fast = GpuSpecConfig(name="y", hbm_gbps=low * factor, bf16_dense_tflops=tflops)
    t_slow = decode_step_us(derive_hardware(H200_HW, slow).hardware, batch)
    t_fast = decode_step_us(derive_hardware(H200_HW, fast).hardware, batch)
    assert t_fast <= t_slow


def test_one_h200_at_tp1_is_untouched() -> None:
    cfg = make_sim_config()
    hw, fit = run_hardware(cfg)
    assert hw is cfg.hardware and fit == compute_fit(cfg.hardware)
    assert hardware_note(cfg) == {} and hardware_derivation(cfg) == {}
    assert "gpu=" not in repr(cfg) and "tp=" not in repr(cfg)


def test_ring_allreduce_follows_alpha_beta() -> None:
    assert ring_allreduce_us(1e6, 1, 450.0, 0.4) == 0.0
    # 2(p-1)/p x 1 MB / 450 GB/s + 3.6 us base + 2(p-1) x 0.4 us hops, p = 4
    assert ring_allreduce_us(1e6, 4, 450.0, 0.4) == pytest.approx(1.5 * 1e6 / 450e3 + 3.6 + 2.4)
    ar = allreduce_fit(LLAMA_70B, GPUS["h200"], 2)
    per_token = 2 * 80 * 0.5 * 2 * 64 * 128 * 2 / 450e3
    assert ar.step_us == pytest.approx(160 * (3.6 + 0.8)) and ar.token_us == pytest.approx(
        per_token
    )
    # PCIe-only L40S: the all-reduce of one token costs far more than over NVLink
    assert allreduce_fit(LLAMA_70B, GPUS["l40s"], 2).token_us > 10 * ar.token_us


def test_tp2_step_is_faster_than_tp1_for_a_large_batch_but_not_halved() -> None:
    cfg1 = make_sim_config(vram_gb=180.0, model=LLAMA_70B, gpu=GPUS["b200"])
    hw1, fit1 = run_hardware(cfg1)
    cfg2 = make_sim_config(vram_gb=180.0, model=LLAMA_70B, gpu=GPUS["b200"], tp=2)
    hw2, fit2 = run_hardware(cfg2)
    args = (
        [float(LLAMA_70B.weight_bytes)],
        np.full(256, 1.0),
        np.full(256, 2048),
        np.full(256, float(LLAMA_70B.kv_bytes_per_token)),
        np.zeros(256, dtype=int),
    )
    t1, t2 = batch_iteration_us(fit1, *args), batch_iteration_us(fit2, *args)
    assert t1 / 2 < t2 < t1
    assert cfg2.kv_pool_bytes > 2 * cfg1.kv_pool_bytes  # half the weights per GPU: more KV room


def test_kv_heads_replicate_past_their_count() -> None:
    one = make_sim_config(vram_gb=141.0, gpu=GPUS["h200"], tp=8)
    # a 16-GPU node (one NVLink domain): TP wider than a node is refused (issue 30)
    many = make_sim_config(
        vram_gb=141.0, gpu=GPUS["h200"], tp=16, cluster=ClusterConfig(gpus_per_node=16)
    )
    per_gpu_8 = one.vram_bytes - one.model.weight_bytes // 8 - one.kv.activation_reserve_bytes
    assert one.kv_pool_bytes == per_gpu_8 * 8  # 8 KV heads over 8 GPUs: one each
    per_gpu_16 = many.vram_bytes - many.model.weight_bytes // 16 - many.kv.activation_reserve_bytes
    assert many.kv_pool_bytes == per_gpu_16 * 8  # 16 GPUs still hold one head each


def test_a_model_that_does_not_fit_the_gpu_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"'vram_gb' = 48.0: cannot hold the model on gpu 'l40s'"):
        make_sim_config(vram_gb=48.0, model=LLAMA_70B, gpu=GPUS["l40s"])
    with pytest.raises(ConfigError, match=r"over tp=2 GPUs \(70.60 GB each\)"):
        make_sim_config(vram_gb=48.0, model=LLAMA_70B, gpu=GPUS["l40s"], tp=2)
    assert make_sim_config(vram_gb=48.0, model=LLAMA_70B, gpu=GPUS["l40s"], tp=4).tp == 4
    with pytest.raises(ConfigError, match=r"'vram_gb' = 80.0: more than gpu 'l40s' has"):
        make_sim_config(vram_gb=80.0, gpu=GPUS["l40s"])
    with pytest.raises(ConfigError, match=r"'tp' = 0"):
        make_sim_config(tp=0)


def test_a_fitted_engine_step_is_refused_off_the_h200() -> None:
    engine = EngineConfig(step_cost=StepCost.FITTED, request_us=50.0, fitted_on="NVIDIA H200")
    one_budget = BatcherConfig(mode=BatchMode.MAX_THROUGHPUT)  # a captured engine's rule
    with pytest.raises(ConfigError, match=r"'gpu' = 'l40s': engine default's step cost was fitted"):
        make_sim_config(engine=engine, gpu=GPUS["l40s"], batcher=one_budget)
    with pytest.raises(ConfigError, match=r"'tp' = 2"):
        make_sim_config(engine=engine, tp=2, batcher=one_budget)
    with pytest.raises(ConfigError, match=r"'batcher.mode' = 'adaptive'"):
        make_sim_config(engine=engine)


def test_a_derived_gpu_run_says_derived_not_measured_in_its_metrics() -> None:
    small = make_workload(num_requests=30)
    h200 = build(make_sim_config(workload=small)).run().metrics
    cfg = make_sim_config(workload=small, gpu=GPUS["l40s"])
    l40s = build(cfg).run().metrics
    assert "hardware_profile" not in h200
    assert l40s["gpu"] == "l40s" and DERIVED_NOTE in l40s["hardware_profile"]
    assert l40s["tpot_p50_ms"] > h200["tpot_p50_ms"]  # 864 GB/s against 4,800
    assert "gpu=GpuSpecConfig(name='l40s'" in repr(cfg)
    block = hardware_derivation(cfg)
    assert block["note"] == DERIVED_NOTE and block["figures"]["hbm_bytes_per_us"]["derived"]
    tp2 = hardware_derivation(replace(cfg, tp=2))
    assert tp2["allreduce"]["derived"] is True and "PCIe" in tp2["allreduce"]["interconnect"]


def test_the_gpu_group_composes_and_refuses_a_model_too_big_for_it() -> None:
    from hydra import compose, initialize_config_dir

    from cachepilot_sim.config import register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        ok = compose("config", ["gpu=mi300x", "vram_gb=192", "model=llama3_70b"])
        bad = compose("config", ["gpu=l40s", "vram_gb=48", "model=llama3_70b", "tp=2"])
    assert to_config(ok).gpu.name == "mi300x"
    with pytest.raises(ConfigError, match=r"^config key 'vram_gb' = 48.0: .*'l40s' over tp=2"):
        to_config(bad)


def test_a_fitted_step_cost_is_not_called_datasheet_scaled() -> None:
    """Only the roofline engine scales the H200 calibration: a fitted step cost runs unchanged
    on another GPU (its transferred errors are in the trust label), and the note says so."""
    engine = EngineConfig(
        name="hf_cb", step_cost=StepCost.FITTED, fitted_on="NVIDIA H200", request_us=50.0
    )
    one_budget = BatcherConfig(mode=BatchMode.MAX_THROUGHPUT)
    roofline = make_sim_config(gpu=GPUS["h100_sxm"], vram_gb=16.0, batcher=one_budget)
    fitted = replace(roofline, engine=engine)
    assert "datasheet ratios" in hardware_note(roofline)["hardware_profile"]
    note = hardware_note(fitted)["hardware_profile"]
    assert "fitted on NVIDIA H200, not rescaled" in note and "datasheet ratios" not in note
