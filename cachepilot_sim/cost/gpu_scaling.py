"""Other GPUs and tensor parallelism, derived from the one GPU the project measured (the H200).

A GPU other than the H200 gets the H200 calibration scaled by datasheet ratios: memory-bound terms
by HBM bandwidth, compute terms by dense BF16 tensor throughput, the host link by PCIe generation.
Nothing here was measured on that GPU: every figure carries `derived: true` and its datasheet.
Tensor parallelism over p GPUs splits weights, KV reads, compute and host copies p ways and adds
two ring all-reduces per layer per step (alpha-beta: 2(p-1)/p x bytes / link + latency, the NCCL
cost model's form; link figures from the datasheets in conf/gpu, hop latency from NCCL's tuning).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cachepilot_sim.config import (
    PCIE_GBPS_PER_LANE,
    GpuSpecConfig,
    HardwareConfig,
    ModelConfig,
    SimConfig,
    StepCost,
)
from cachepilot_sim.cost.model import ComputeFit, compute_fit
from cachepilot_sim.cost.profile_scaling import engine_hardware_profile

# The part the calibration was measured on: GpuSpecConfig's defaults are the H200 SXM datasheet
# (equal to conf/gpu/h200.yaml; tests/unit/test_gpu_scaling.py checks).
CALIBRATION_GPU = GpuSpecConfig()
DERIVED_NOTE = "derived, not measured"
# NCCL's ring base latency for the LL protocol (src/graph/tuning.cc, baseLat Ring/LL), in us.
RING_BASE_LATENCY_US = 3.6
# Activations exchanged by the all-reduces: BF16.
ACTIVATION_BYTES = 2
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron-style tensor parallelism)


def is_measured(gpu: GpuSpecConfig) -> bool:
    """True when `gpu` is the part the hardware calibration was measured on."""
    return gpu.figures() == CALIBRATION_GPU.figures()


@dataclass(frozen=True, slots=True)
class DerivedHardware:
    """A hardware profile for one GPU type, and where each of its figures came from."""

    hardware: HardwareConfig
    measured: bool
    provenance: dict[str, dict[str, Any]]


def _ratios(gpu: GpuSpecConfig) -> dict[str, tuple[float, str]]:
    base = CALIBRATION_GPU
    pcie = PCIE_GBPS_PER_LANE[gpu.pcie_gen] * gpu.pcie_lanes
    pcie_base = PCIE_GBPS_PER_LANE[base.pcie_gen] * base.pcie_lanes
    hbm = (gpu.hbm_gbps / base.hbm_gbps, f"HBM {gpu.hbm_gbps:g} / {base.hbm_gbps:g} GB/s")
    flops = (
        base.bf16_dense_tflops / gpu.bf16_dense_tflops,
        f"dense BF16 {base.bf16_dense_tflops:g} / {gpu.bf16_dense_tflops:g} TFLOP/s",
    )
    return {
        "hbm_bytes_per_us": hbm,
        "quantize_bytes_per_us": hbm,  # a memory-bound kernel
        "prefill_token_us": flops,
        "attention_token2_us": flops,
        "pcie_h2d_bytes_per_us": (pcie / pcie_base, f"PCIe {pcie:.1f} / {pcie_base:.1f} GB/s"),
        "pcie_d2h_bytes_per_us": (pcie / pcie_base, f"PCIe {pcie:.1f} / {pcie_base:.1f} GB/s"),
    }


def derive_hardware(hw: HardwareConfig, gpu: GpuSpecConfig) -> DerivedHardware:
    """`hw` (measured on CALIBRATION_GPU) as it would be on `gpu`: each term times its datasheet
    ratio. Launch overhead and link latencies are kept as measured (no datasheet gives them).
    The calibration GPU itself returns `hw` unchanged (the same object)."""
    if is_measured(gpu):
        return DerivedHardware(hw, True, {})
    ratios = _ratios(gpu)
    values = {key: getattr(hw, key) * ratio for key, (ratio, _) in ratios.items()}
    provenance = {
        key: {
            "value": values[key],
            "derived": True,
            "measured_on_h200": getattr(hw, key),
            "ratio": ratio,
            "basis": basis,
            "source": gpu.source or gpu.name,
        }
        for key, (ratio, basis) in ratios.items()
    }
    for key in ("step_overhead_us", "pcie_h2d_latency_us", "pcie_d2h_latency_us"):
        provenance[key] = {
            "value": getattr(hw, key),
            "derived": True,
            "basis": "kept as measured on the H200 (no datasheet figure)",
            "source": hw.source,
        }
    derived = replace(
        hw,
        name=f"{gpu.name}_derived",
        source=f"{DERIVED_NOTE}: {hw.source} x datasheet ratios ({gpu.source or gpu.name})",
        **values,
    )
    return DerivedHardware(derived, False, provenance)


def tp_hardware(hw: HardwareConfig, tp: int) -> HardwareConfig:
    """Per-step terms of `tp` GPUs working on one step: each reads 1/tp of the weights and KV,
    does 1/tp of the FLOPs and moves 1/tp of the KV over its own host link. tp = 1 returns `hw`."""
    if tp == 1:
        return hw
    return replace(
        hw,
        hbm_bytes_per_us=hw.hbm_bytes_per_us * tp,
        prefill_token_us=hw.prefill_token_us / tp,
        attention_token2_us=hw.attention_token2_us / tp,
        pcie_h2d_bytes_per_us=hw.pcie_h2d_bytes_per_us * tp,
        pcie_d2h_bytes_per_us=hw.pcie_d2h_bytes_per_us * tp,
        quantize_bytes_per_us=hw.quantize_bytes_per_us * tp,
    )


@dataclass(frozen=True, slots=True)
class AllReduceFit:
    """All-reduce time per engine step = step_us + token_us x tokens computed in the step."""

    step_us: float
    token_us: float


def _ring_latency_us(tp: int, hop_latency_us: float) -> float:
    return RING_BASE_LATENCY_US + 2 * (tp - 1) * hop_latency_us


def _ring_us_per_byte(tp: int, link_gbps: float) -> float:
    return 2.0 * (tp - 1) / tp / (link_gbps * 1e3)  # GB/s x 1e3 = bytes per us


def ring_allreduce_us(num_bytes: float, tp: int, link_gbps: float, hop_latency_us: float) -> float:
    """One ring all-reduce of `num_bytes` over `tp` GPUs: 2(p-1)/p x bytes / link bandwidth plus
    NCCL's ring latency (base + one hop latency per step, 2(p-1) steps). Zero for one GPU."""
    if tp <= 1:
        return 0.0
    return _ring_latency_us(tp, hop_latency_us) + num_bytes * _ring_us_per_byte(tp, link_gbps)


def allreduce_fit(model: ModelConfig, gpu: GpuSpecConfig, tp: int) -> AllReduceFit:
    """Two all-reduces per layer of each token's hidden state (num_attention_heads x head_dim
    BF16 values), split into the per-step latency and the per-token bandwidth term."""
    if tp <= 1:
        return AllReduceFit(0.0, 0.0)
    num = ALLREDUCES_PER_LAYER * model.num_layers
    hidden_bytes = model.num_attention_heads * model.head_dim * ACTIVATION_BYTES
    return AllReduceFit(
        num * _ring_latency_us(tp, gpu.interconnect_hop_latency_us),
        num * hidden_bytes * _ring_us_per_byte(tp, gpu.interconnect_gbps),
    )


def allreduce_provenance(gpu: GpuSpecConfig, tp: int) -> dict[str, Any]:
    """Where the all-reduce figures come from (written beside the run's metrics)."""
    return {
        "derived": True,
        "model": "ring all-reduce, alpha-beta: 2(p-1)/p x bytes / link + base + 2(p-1) x hop",
        "tp": tp,
        "interconnect": gpu.interconnect,
        "interconnect_gbps": gpu.interconnect_gbps,
        "hop_latency_us": gpu.interconnect_hop_latency_us,
        "base_latency_us": RING_BASE_LATENCY_US,
        "source": gpu.interconnect_source or gpu.name,
    }


def run_hardware(cfg: SimConfig) -> tuple[HardwareConfig, ComputeFit]:
    """The hardware one engine step of `cfg` runs on (its GPU type, its TP degree) and its
    iteration terms with the all-reduces. One H200 at tp = 1 gives `cfg.hardware` itself."""
    hw = tp_hardware(derive_hardware(cfg.hardware, cfg.gpu).hardware, cfg.tp)
    ar = allreduce_fit(cfg.model, cfg.gpu, cfg.tp)
    return hw, compute_fit(hw, ar.step_us, ar.token_us)


def hardware_note(cfg: SimConfig) -> dict[str, Any]:
    """A run's hardware in its metrics when it is not one measured H200: GPU, TP degree and
    `derived, not measured` (empty for one H200, so such runs' metrics are unchanged)."""
    if is_measured(cfg.gpu) and cfg.tp == 1:
        return {}
    comm = f"; tp={cfg.tp} ring all-reduce {DERIVED_NOTE}" if cfg.tp > 1 else ""
    return {
        "gpu": cfg.gpu.name,
        "tp": cfg.tp,
        "hardware_profile": cfg.gpu.name + ": " + _basis(cfg) + comm,
    }


def _basis(cfg: SimConfig) -> str:
    """Where the step time on `cfg.gpu` comes from, in words. Only the roofline engine scales
    the H200 calibration by datasheet ratios; a fitted step cost runs unchanged on the GPUs its
    errors were measured on (config/run.py refuses the others) and a physical one prices the
    engine's kernels on the GPU profile it names; their host link is still the datasheet's."""
    e = cfg.engine
    if e.step_cost == StepCost.FITTED:
        return (
            f"step cost fitted on {e.fitted_on or 'an unnamed GPU'}, not rescaled; "
            f"host link {DERIVED_NOTE} (datasheet)"
        )
    if e.step_cost == StepCost.PHYSICAL:
        _, how = engine_hardware_profile(e.gpu_profile, cfg.gpu)
        return f"step cost from {how}; host link {DERIVED_NOTE} (datasheet)"
    if is_measured(cfg.gpu):
        return "measured"
    return f"{DERIVED_NOTE} (H200 calibration x datasheet ratios)"


def hardware_derivation(cfg: SimConfig) -> dict[str, Any]:
    """Every derived figure of `cfg`'s hardware with `derived: true`, its basis and datasheet
    (metrics.json's `hardware` block); empty for one measured H200."""
    if is_measured(cfg.gpu) and cfg.tp == 1:
        return {}
    out: dict[str, Any] = {"note": DERIVED_NOTE, **hardware_note(cfg)}
    out["figures"] = derive_hardware(cfg.hardware, cfg.gpu).provenance
    if cfg.tp > 1:
        out["allreduce"] = allreduce_provenance(cfg.gpu, cfg.tp)
    return out
