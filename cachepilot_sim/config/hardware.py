"""The accelerator: cost-model parameters fitted on one GPU, and datasheet figures per GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cachepilot_sim.config.base import GB, Sealed, bounded, require

# Usable GB/s per lane and direction after line coding (PCI-SIG: 8b/10b for Gen1-2, 128b/130b for
# Gen3-5; Gen6 uses FLIT mode, 242/256 efficiency).
PCIE_GBPS_PER_LANE = {
    3: 8 * 128 / 130 / 8,
    4: 16 * 128 / 130 / 8,
    5: 32 * 128 / 130 / 8,
    6: 64 * 242 / 256 / 8,
}


# Beyond 10^9 (bytes per µs: a petabyte per second; µs: a quarter hour per token) a figure is a
# typo, and products of it overflowed with an OverflowError that named no key.
MAX_RATE = 1e9


@dataclass
class HardwareConfig(Sealed):
    """Accelerator and link parameters of the cost model (see cost/model.py for the formulas)."""

    section: ClassVar[str | None] = "hardware"
    name: str = "h200"
    # Defaults: the H200 calibration of 2026-11-29 (conf/hardware/h200.yaml; a test checks it).
    hbm_bytes_per_us: float = bounded(2644125.349444123, gt=0, le=MAX_RATE)
    prefill_token_us: float = bounded(18.774784899961098, gt=0, le=MAX_RATE)
    attention_token2_us: float = bounded(0.0014449815343814405, ge=0, le=MAX_RATE)
    step_overhead_us: float = bounded(778.5392007599909, ge=0, le=MAX_RATE)
    pcie_h2d_latency_us: float = bounded(5.087833751592979, ge=0, le=MAX_RATE)
    pcie_h2d_bytes_per_us: float = bounded(51279.48774063125, gt=0, le=MAX_RATE)
    pcie_d2h_latency_us: float = bounded(3.713765748178057, ge=0, le=MAX_RATE)
    pcie_d2h_bytes_per_us: float = bounded(52702.402988170135, gt=0, le=MAX_RATE)
    quantize_bytes_per_us: float = bounded(3857292.166640563, gt=0, le=MAX_RATE)
    source: str = "experiments/calibration/2026-11-29_h200.json, NVIDIA H200, 2026-11-29"


@dataclass
class GpuSpecConfig(Sealed):
    """One accelerator's datasheet figures (conf/gpu/*.yaml; each figure's source is cited there).

    Dense tensor-core rates, i.e. the datasheets' "with sparsity" figures halved. Capacities and
    bandwidths in decimal units, as the datasheets print them. `calibrated_hardware` names a
    conf/hardware file measured on this part, shown beside the datasheet by the scorecard.
    """

    section: ClassVar[str | None] = "gpu"
    name: str = bounded("h200", nonempty=True)
    display_name: str = "NVIDIA H200 SXM"
    hbm_gb: float = bounded(141.0, gt=0, le=1e5)  # bounds: a typo, not a part, beyond them
    hbm_gbps: float = bounded(4800.0, ge=1.0, le=1e6)  # below 1 GB/s: a typo, not a part
    bf16_dense_tflops: float = bounded(989.5, ge=0.1, le=1e6)
    # 0: no FP8 tensor cores (BF16 rate used)
    fp8_dense_tflops: float = bounded(1979.0, ge=0, le=1e6)
    pcie_gen: int = 5
    pcie_lanes: int = bounded(16, gt=0, le=64, integer=True)
    calibrated_hardware: str = ""
    # Parameters of the model the calibration replayed: turns its per-token time into TFLOP/s.
    calibration_num_params: int = bounded(0, ge=0, le=10**15, integer=True)
    # The datasheet every figure above comes from (cited again per figure in the YAML).
    source: str = ""
    # GPU-to-GPU link for tensor parallelism: GB/s per GPU and direction, and per-hop latency
    # (ring all-reduce, cost/gpu_scaling.py); datasheet figures, cited in `interconnect_source`.
    interconnect: str = "NVLink 4"
    interconnect_gbps: float = bounded(450.0, gt=0, le=1e5)
    interconnect_hop_latency_us: float = bounded(0.4, ge=0, le=1e6)
    interconnect_source: str = ""

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gb * GB)

    def figures(self) -> tuple[float | int, ...]:
        """The figures that change simulated time or memory (names and citations do not)."""
        return (
            self.hbm_gb,
            self.hbm_gbps,
            self.bf16_dense_tflops,
            self.pcie_gen,
            self.pcie_lanes,
            self.interconnect_gbps,
            self.interconnect_hop_latency_us,
        )

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(
            self.pcie_gen in PCIE_GBPS_PER_LANE,
            f"{prefix}.pcie_gen",
            self.pcie_gen,
            f"known generations: {sorted(PCIE_GBPS_PER_LANE)}",
        )
