"""Roofline bounds of LLM decode on one accelerator, and how much KV fits beside pinned weights.

A decode step reads every weight once and the KV of every sequence in the batch from HBM, and does
2 FLOPs per parameter per token plus attention FLOPs that grow with context. The step cannot be
shorter than either the bytes over the HBM bandwidth or the FLOPs over the peak rate; the larger
of the two binds. Derivation and units: docs/roofline.md. Pure functions; no file access.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachepilot_sim.config import PCIE_GBPS_PER_LANE, GpuSpecConfig, ModelConfig


def kv_pool_bytes(gpu: GpuSpecConfig, model: ModelConfig, reserve_bytes: int) -> int:
    """HBM left for KV after the pinned weights and the activation reserve; never negative."""
    return max(0, gpu.hbm_bytes - model.weight_bytes - reserve_bytes)


def capacity_tokens(pool_bytes: int, bytes_per_token: int) -> int:
    """Context tokens (summed over every sequence) whose KV fits in `pool_bytes`."""
    return pool_bytes // bytes_per_token


def flops_per_token(model: ModelConfig, context_tokens: int) -> float:
    """Forward FLOPs of one decoded token at a given context.

    Dense: 2 per parameter (a multiply and an add per weight). Attention: QK^T and PV each cost
    2 x head_dim FLOPs per (query head, context token) pair in every layer.
    """
    dense = 2.0 * model.num_params
    attention = 4.0 * model.num_layers * model.num_attention_heads * model.head_dim * context_tokens
    return dense + attention


def peak_tflops(gpu: GpuSpecConfig, model: ModelConfig) -> float:
    """The tensor-core rate the weights run at: FP8 for 1-byte weights where the part has it."""
    one_byte_weights = model.num_params > 0 and model.weight_bytes <= 1.01 * model.num_params
    if one_byte_weights and gpu.fp8_dense_tflops > 0:
        return gpu.fp8_dense_tflops
    return gpu.bf16_dense_tflops


def pcie_gbps(gpu: GpuSpecConfig) -> float:
    """Usable GB/s per direction of the host link after line coding."""
    return PCIE_GBPS_PER_LANE[gpu.pcie_gen] * gpu.pcie_lanes


@dataclass(frozen=True, slots=True)
class DecodeBound:
    """Lower bounds on one decode step of `batch` sequences at `context_tokens` each."""

    batch: int
    step_bytes: float
    step_flops: float
    bandwidth_us: float
    compute_us: float

    @property
    def binding(self) -> str:
        return "compute" if self.compute_us > self.bandwidth_us else "bandwidth"

    @property
    def step_us(self) -> float:
        return max(self.bandwidth_us, self.compute_us)

    @property
    def tokens_per_s(self) -> float:
        """Decode ceiling: every sequence of the batch makes one token per step."""
        return self.batch * 1e6 / self.step_us if self.step_us > 0 else 0.0


def decode_bound(
    gpu: GpuSpecConfig, model: ModelConfig, batch: int, context_tokens: int, kv_bytes: int
) -> DecodeBound:
    """Bandwidth bound = (weights + batch x context x kv_bytes) / HBM bytes per µs; compute bound
    = batch x FLOPs per token / peak FLOPs per µs (1 GB/s = 1e3 B/µs, 1 TFLOP/s = 1e6 FLOP/µs).
    """
    step_bytes = float(model.weight_bytes) + float(batch) * context_tokens * kv_bytes
    step_flops = batch * flops_per_token(model, context_tokens)
    return DecodeBound(
        batch=batch,
        step_bytes=step_bytes,
        step_flops=step_flops,
        bandwidth_us=step_bytes / (gpu.hbm_gbps * 1e3),
        compute_us=step_flops / (peak_tflops(gpu, model) * 1e6),
    )


def ridge_batch(
    gpu: GpuSpecConfig, model: ModelConfig, context_tokens: int, kv_bytes: int
) -> float:
    """Batch at which the compute bound overtakes the bandwidth bound; inf when it never does.

    Solves B x F / P = (W + B x C x k) / BW for B: each added sequence brings F FLOPs but also
    C x k bytes of KV, so at long context the KV reads can outgrow the compute.
    """
    per_seq_compute_us = flops_per_token(model, context_tokens) / (peak_tflops(gpu, model) * 1e6)
    per_seq_bytes_us = context_tokens * kv_bytes / (gpu.hbm_gbps * 1e3)
    slack = per_seq_compute_us - per_seq_bytes_us
    if slack <= 0:
        return float("inf")
    return model.weight_bytes / (gpu.hbm_gbps * 1e3) / slack
