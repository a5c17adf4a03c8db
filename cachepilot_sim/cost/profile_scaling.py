"""A measured GPU profile carried to another GPU by datasheet ratios alone: what "derived" means
for the physical step cost when the target GPU has no micro-profile of its own.

Each measured time is scaled by how the two datasheets' rooflines price the same work: a GEMM of
M rows by the ratio of max(FLOPs / peak BF16, bytes / peak HBM) on the target to the same on the
source (so decode-sized GEMMs follow the bandwidth ratio and large ones the compute ratio), prefill
attention by the compute ratio, decode attention and every copy rate by the bandwidth ratio, the
host link by the PCIe ratio; launch and per-kernel graph overheads are kept (a datasheet says
nothing about them). The error of a prediction made this way, against the target's own captures,
is the price of having no micro-profile (docs/validation.md, "Another GPU").
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import PCIE_GBPS_PER_LANE, GpuSpecConfig
from cachepilot_sim.cost.gpu_profile import (
    BF16_BYTES,
    Curve,
    DecodeAttention,
    GpuProfile,
    GpuProfileError,
    linear_shapes,
    load_gpu_profile,
    resolve_profile_path,
)

# The conf/gpu preset of each device name a profile or a capture records.
DEVICE_PRESETS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100_sxm"}
# Measured micro-profiles shipped with the package: `<preset>_<date>.json`.
PROFILES_DIR = CONF_DIR / "gpu_profiles"
# Where a relative engine.gpu_profile is looked up: the package's conf/, then the repository.
PROFILE_ROOTS = (CONF_DIR, CONF_DIR.parents[1])


def _roofline_us(m: float, k: int, n: int, gpu: GpuSpecConfig) -> float:
    flops_us = 2 * m * k * n / (gpu.bf16_dense_tflops * 1e6)
    bytes_us = (m * k + k * n + m * n) * BF16_BYTES / (gpu.hbm_gbps * 1e3)
    return max(flops_us, bytes_us)


def _scaled(curve: Curve, factor: float) -> Curve:
    return Curve(curve.x, tuple(y * factor for y in curve.y))


def _pcie_gbps(gpu: GpuSpecConfig) -> float:
    return PCIE_GBPS_PER_LANE[gpu.pcie_gen] * gpu.pcie_lanes


def scale_profile(profile: GpuProfile, source: GpuSpecConfig, target: GpuSpecConfig) -> GpuProfile:
    """`profile` (measured on `source`) as the datasheets say it would be on `target`."""
    bw = target.hbm_gbps / source.hbm_gbps  # > 1: the target reads faster
    compute = target.bf16_dense_tflops / source.bf16_dense_tflops
    link = _pcie_gbps(target) / _pcie_gbps(source)
    gemm = {}
    for layer, (k, n) in linear_shapes(profile.model).items():
        c = profile.gemm[layer]
        ys = tuple(
            y * _roofline_us(m, k, n, target) / _roofline_us(m, k, n, source)
            for m, y in zip(c.x, c.y, strict=True)
        )
        gemm[layer] = Curve(c.x, ys)
    d = profile.decode
    return replace(
        profile,
        path=f"{profile.path} scaled by datasheet to {target.name}",
        gpu=f"{target.name} (datasheet scaling of {profile.gpu})",
        hbm_read_bytes_per_us=profile.hbm_read_bytes_per_us * bw,
        hbm_copy_bytes_per_us=profile.hbm_copy_bytes_per_us * bw,
        pcie_h2d_bytes_per_us=profile.pcie_h2d_bytes_per_us * link,
        pcie_d2h_bytes_per_us=profile.pcie_d2h_bytes_per_us * link,
        gemm=gemm,
        prefill=_scaled(profile.prefill, 1 / compute),
        critical=_scaled(profile.critical, 1 / compute),
        decode=DecodeAttention(d.launch_us, d.token_us / bw, _scaled(d.single, 1 / bw)),
    )


def gpu_preset(name: str) -> GpuSpecConfig:
    """The conf/gpu preset `name` (its datasheet figures)."""
    path = CONF_DIR / "gpu" / f"{name}.yaml"
    if not path.is_file():
        raise GpuProfileError(f"{path}: no conf/gpu preset {name!r}")
    return GpuSpecConfig(**yaml.safe_load(path.read_text()))


def measured_profile_of(gpu: str) -> Path | None:
    """The newest shipped micro-profile of conf/gpu preset `gpu`, if any."""
    found = sorted(PROFILES_DIR.glob(f"{gpu}_*.json"))
    return found[-1] if found else None


def hardware_profile(base: GpuProfile, gpu: GpuSpecConfig) -> tuple[GpuProfile, str]:
    """The hardware profile an engine whose constants were fitted on `base` runs with on `gpu`,
    and how it was made: `base` itself on its own GPU; the target's own micro-profile where one
    is shipped (conf/gpu_profiles/); else `base` scaled by the two datasheets."""
    source = DEVICE_PRESETS.get(base.gpu)
    if source is None:
        raise GpuProfileError(
            f"{base.path}: key 'gpu' = {base.gpu!r}: no conf/gpu preset for this device, so "
            "the profile cannot be carried to another GPU (known: "
            f"{', '.join(sorted(DEVICE_PRESETS))})"
        )
    if source == gpu.name:
        return base, f"measured micro-profile {Path(base.path).name}"
    own = measured_profile_of(gpu.name)
    if own is not None:
        return load_gpu_profile(own), f"{gpu.name}'s measured micro-profile {own.name}"
    scaled = scale_profile(base, gpu_preset(source), gpu)
    return scaled, f"{Path(base.path).name} ({source}) scaled by datasheet ratios to {gpu.name}"


def engine_hardware_profile(gpu_profile: str, gpu: GpuSpecConfig) -> tuple[GpuProfile, str]:
    """`hardware_profile` of an engine profile's `engine.gpu_profile` on the run's `gpu`."""
    return hardware_profile(load_gpu_profile(resolve_profile_path(gpu_profile, PROFILE_ROOTS)), gpu)
