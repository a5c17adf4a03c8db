"""Time of an engine iteration, a recompute and a PCIe transfer, as pure functions of fitted
parameters.

An iteration reads every served model's weights and the KV of every sequence in the batch from HBM,
and does dense compute per token plus attention compute per (new token x context token) pair. The
additive form reproduces the H200 prefill measurements of a Llama-3-8B-shaped model within 1 % from
2k to 32k tokens (tests/unit/test_cost_model.py); a transfer is latency + bytes / bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cachepilot_sim.config import HardwareConfig


@dataclass(frozen=True, slots=True)
class TransferFit:
    """Transfer time = latency + bytes / bandwidth (one PCIe direction)."""

    latency_us: float
    bytes_per_us: float


@dataclass(frozen=True, slots=True)
class ComputeFit:
    """Per-iteration cost parameters of one accelerator."""

    hbm_bytes_per_us: float
    prefill_token_us: float
    attention_token2_us: float
    step_overhead_us: float
    # Tensor parallelism's all-reduces per step: fixed latency + per computed token (0: one GPU).
    allreduce_step_us: float = 0.0
    allreduce_token_us: float = 0.0


def compute_fit(
    hw: HardwareConfig, allreduce_step_us: float = 0.0, allreduce_token_us: float = 0.0
) -> ComputeFit:
    """The iteration terms of `hw` plus tensor parallelism's all-reduces (cost/gpu_scaling)."""
    return ComputeFit(
        hw.hbm_bytes_per_us,
        hw.prefill_token_us,
        hw.attention_token2_us,
        hw.step_overhead_us,
        allreduce_step_us,
        allreduce_token_us,
    )


def transfer_fits(hw: HardwareConfig) -> tuple[TransferFit, TransferFit]:
    """(host-to-device, device-to-host) fits."""
    return (
        TransferFit(hw.pcie_h2d_latency_us, hw.pcie_h2d_bytes_per_us),
        TransferFit(hw.pcie_d2h_latency_us, hw.pcie_d2h_bytes_per_us),
    )


def transfer_us(fit: TransferFit, num_bytes: int) -> int:
    """Microseconds to move `num_bytes` over one link direction; zero bytes cost nothing."""
    return 0 if num_bytes <= 0 else math.ceil(fit.latency_us + num_bytes / fit.bytes_per_us)


def recompute_us(fit: ComputeFit, num_tokens: int) -> float:
    """Marginal compute to rebuild the KV of `num_tokens` context tokens inside a batch.

    Dense work is linear; attention over the growing prefix adds n^2/2 token pairs, so recompute
    is superlinear in context length. Weight reads are shared with the rest of the batch and not
    charged.
    """
    if num_tokens <= 0:
        return 0.0
    n = float(num_tokens)
    return fit.prefill_token_us * n + fit.attention_token2_us * n * n / 2.0


def prefill_us(
    fit: ComputeFit, weight_bytes: int, new_tokens: int, context_tokens: int = 0
) -> float:
    """Standalone prefill of `new_tokens` on top of `context_tokens` cached (one sequence)."""
    n, c = float(new_tokens), float(context_tokens)
    return iteration_us(fit, weight_bytes, n, c * 0.0, n * (c + n / 2.0))


def iteration_us(
    fit: ComputeFit,
    weight_bytes: float,
    num_tokens: float,
    kv_read_bytes: float,
    attention_pairs: float,
) -> float:
    """One engine iteration of one model.

    weight_bytes: the model's pinned weights, read once per iteration.
    num_tokens: tokens computed this iteration (prefill chunk tokens + one per decoding sequence).
    kv_read_bytes: cached KV read by attention (context of every sequence in the batch).
    attention_pairs: sum over sequences of new_tokens x (context + new_tokens / 2).
    """
    memory = (weight_bytes + kv_read_bytes) / fit.hbm_bytes_per_us
    compute = fit.prefill_token_us * num_tokens + fit.attention_token2_us * attention_pairs
    step = fit.step_overhead_us + memory + compute
    if fit.allreduce_step_us == 0.0 and fit.allreduce_token_us == 0.0:
        return step  # one GPU: no collective (the sum is left exactly as before TP existed)
    return step + fit.allreduce_step_us + fit.allreduce_token_us * num_tokens


def batch_iteration_us(
    fit: ComputeFit,
    weight_bytes: list[float],
    new_tokens: np.ndarray,
    context_tokens: np.ndarray,
    kv_bytes_per_token: np.ndarray,
    model_index: np.ndarray,
) -> float:
    """One engine iteration over a batch (before rounding), one entry per sequence: tokens it
    computes now, tokens of KV it holds, its model's KV bytes per token and model index. Each
    model present runs its own forward pass (`iteration_us`), one after the other."""
    ctx = context_tokens.astype(np.float64)
    kv_read = ctx * kv_bytes_per_token
    pairs = new_tokens * (ctx + new_tokens / 2.0)
    if len(weight_bytes) == 1:
        return iteration_us(
            fit, weight_bytes[0], float(new_tokens.sum()), float(kv_read.sum()), float(pairs.sum())
        )
    m = len(weight_bytes)
    tokens = np.bincount(model_index, weights=new_tokens, minlength=m)
    reads = np.bincount(model_index, weights=kv_read, minlength=m)
    attn = np.bincount(model_index, weights=pairs, minlength=m)
    total = 0.0
    for k in np.flatnonzero(tokens).tolist():
        total += iteration_us(fit, weight_bytes[k], tokens[k], reads[k], attn[k])
    return total


def decode_step_slope_us(fit: ComputeFit, kv_bytes_per_token_sum: float, num_seqs: int) -> float:
    """How much longer each successive pure-decode iteration takes as every context grows by one.

    kv_bytes_per_token_sum: sum over the decoding sequences of their model's KV bytes per token.
    `iteration_us` is linear in context, so iteration j of a run lasts iteration_0 + j x slope.
    """
    return kv_bytes_per_token_sum / fit.hbm_bytes_per_us + fit.attention_token2_us * num_seqs


def quantize_us(bytes_per_us: float, src_bytes: int, dst_bytes: int) -> int:
    """Microseconds to convert KV between formats on the GPU (quantize or dequantize).

    The calibrated rate counts bytes read plus bytes written (conf/hardware: quantize_bytes_per_us);
    nothing to convert costs nothing.
    """
    if src_bytes <= 0:
        return 0
    return math.ceil((src_bytes + dst_bytes) / bytes_per_us)
