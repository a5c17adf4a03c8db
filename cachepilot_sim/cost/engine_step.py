"""Step time of a real engine, fitted from its own micro-runs: a linear model over the padded
shape a CUDA-graph engine really launches.

transformers' continuous batching (5.17, graphs on) pads a step's queries to a multiple of
`q_pad_tokens` and copies every request's whole KV into one contiguous buffer each step, so its
step time grows with the padded query count, the KV tokens read (and their square), the longest
sequence (attention's critical path: a batch waits for its longest request, whatever the others
hold) plus the longest sequence over the square root of the request count (one long sequence alone
runs on few SMs, next to others it shares them), the number of requests (per-request gathers),
and prefill x sequence length for chunks that attend to earlier chunks. That form won a
leave-one-configuration-out cross-validation over the micro-runs (tools/fit_engine.py), which
include decode batches of mixed contexts (microbench_mixed/), against the longest sequence alone,
the longest sequence over sqrt(requests) alone (the form fitted before the mixed micro-runs, which
cannot separate the longest sequence from the mean context on batches of equal contexts), and
five other forms. The coefficients come from closed micro-runs only
(`fit_engine_step`), never from the validation workloads.

The padded query shape has a second form, `q_shape_us`: one measured time per launch shape (k x
`q_pad_tokens` queries, k = 1..len) in place of `const_us + q_padded_token_us x padded queries`.
The engine replays one CUDA graph per shape and its GEMMs are not linear in the row count (the
linear fit priced the 512-query graph 5.8 % high): with small-prefill micro-runs
(microbench_small/) in the fit, the table form brings the fitted cost of six validation
workloads' own mixed steps from 4.4-7.3 % to 1.7-2.7 % (p90 of |error|;
experiments/validation/diagnose.py, commands in hf_cb/2026-12-02-small/README.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
from scipy.optimize import nnls

from cachepilot_sim.config.engine_profile import FITTED_COST_KEYS

# Order of the features, of `EngineStepFit`'s coefficients and of `step_features`' columns.
FEATURES = FITTED_COST_KEYS  # the engine profile's coefficient keys, in this order
# Scales that keep the fitted numbers readable: kv_read_token2_us is per (10^3 tokens)^2 and
# prefill_seqlen_us per 10^3 (prefill token x sequence token) pairs.
_KV2_SCALE = 1e6
_PAIR_SCALE = 1e3


@dataclass(frozen=True, slots=True)
class EngineStepFit:
    """Step time = sum of coefficient x feature (microseconds), over the padded step shape."""

    const_us: float
    q_padded_token_us: float
    kv_read_token_us: float
    kv_read_token2_us: float
    seqlen_us: float
    seqlen_per_sqrt_request_us: float
    prefill_seqlen_us: float
    request_us: float
    q_pad_tokens: int = 256
    # Time of each padded query shape k x q_pad_tokens (k = 1..len; larger shapes take the last);
    # when given, const_us and q_padded_token_us are 0 (the fit's table form).
    q_shape_us: tuple[float, ...] = ()

    def coefficients(self) -> np.ndarray:
        """Coefficients in the column order of `step_features(..., shapes=len(q_shape_us))`."""
        if self.q_shape_us:
            rest = [getattr(self, name) for name in FEATURES[2:]]
            return np.array([*self.q_shape_us, *rest], dtype=np.float64)
        return np.array([getattr(self, name) for name in FEATURES], dtype=np.float64)

    def shape_us(self, q_tokens: int | np.ndarray) -> float | np.ndarray:
        """The padded query shape's part of a step: table lookup or the linear form."""
        k = -(-np.asarray(q_tokens) // self.q_pad_tokens)
        if self.q_shape_us:
            table = np.asarray(self.q_shape_us)
            out = table[np.clip(k, 1, table.size) - 1]
        else:
            out = self.const_us + self.q_padded_token_us * k * self.q_pad_tokens
        return float(out) if np.ndim(out) == 0 else out


def padded(num_tokens: int | np.ndarray, interval: int) -> int | np.ndarray:
    """`num_tokens` rounded up to a multiple of `interval` (0 stays 0)."""
    return -(-num_tokens // interval) * interval


def step_features(
    q_tokens: np.ndarray,
    kv_read_tokens: np.ndarray,
    max_seqlen_k: np.ndarray,
    prefill_tokens: np.ndarray,
    num_requests: np.ndarray,
    q_pad_tokens: int,
    shapes: int = 0,
) -> np.ndarray:
    """One row per step, columns in `FEATURES` order (all inputs are per-step token counts);
    with `shapes`, the first two columns are replaced by one indicator column per padded query
    shape (k = 1..shapes, larger shapes counted as the last)."""
    q = np.asarray(q_tokens, dtype=np.float64)
    kv = np.asarray(kv_read_tokens, dtype=np.float64)
    seqlen = np.asarray(max_seqlen_k, dtype=np.float64)
    if shapes:
        k = np.clip(np.ceil(q / q_pad_tokens).astype(np.int64), 1, shapes)
        head = [(k == j).astype(np.float64) for j in range(1, shapes + 1)]
    else:
        head = [np.ones_like(q), np.ceil(q / q_pad_tokens) * q_pad_tokens]
    return np.stack(
        [
            *head,
            kv,
            kv * kv / _KV2_SCALE,
            seqlen,
            seqlen / np.sqrt(np.maximum(np.asarray(num_requests, dtype=np.float64), 1.0)),
            np.asarray(prefill_tokens, dtype=np.float64) * seqlen / _PAIR_SCALE,
            np.asarray(num_requests, dtype=np.float64),
        ],
        axis=1,
    )


def engine_step_us(fit: EngineStepFit, new_tokens: np.ndarray, context_tokens: np.ndarray) -> float:
    """Time of one step (before rounding): one entry per request in the step, the tokens it
    computes now (1 for a decode, the chunk for a prefill) and the tokens of KV it holds before
    the step. An empty step costs nothing."""
    if new_tokens.size == 0:
        return 0.0
    new = new_tokens.astype(np.float64)
    ctx = context_tokens.astype(np.float64)
    q = float(new.sum())
    kv = float(ctx.sum())
    seqlen = float((ctx + new).max())
    prefill = float(new[new > 1].sum())
    c = fit
    return (
        float(c.shape_us(int(q)))
        + c.kv_read_token_us * kv
        + c.kv_read_token2_us * kv * kv / _KV2_SCALE
        + c.seqlen_us * seqlen
        + c.seqlen_per_sqrt_request_us * seqlen / math.sqrt(new.size)
        + c.prefill_seqlen_us * prefill * seqlen / _PAIR_SCALE
        + c.request_us * new.size
    )


def decode_run_us(fit: EngineStepFit, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
    """Durations (before rounding) of `num_steps` pure-decode steps of an unchanged batch whose
    contexts grow by one token per step."""
    n = context_tokens.size
    j = np.arange(num_steps, dtype=np.float64)
    kv = float(context_tokens.sum()) + n * j
    seqlen = float(context_tokens.max()) + 1.0 + j
    return (
        float(fit.shape_us(n))
        + fit.kv_read_token_us * kv
        + fit.kv_read_token2_us * kv * kv / _KV2_SCALE
        + fit.seqlen_us * seqlen
        + fit.seqlen_per_sqrt_request_us * seqlen / math.sqrt(max(n, 1))
        + fit.request_us * n
    )


def fit_engine_step(
    features: np.ndarray, step_us: np.ndarray, q_pad_tokens: int, shapes: int = 0
) -> tuple[EngineStepFit, np.ndarray]:
    """Non-negative least squares of relative error: minimises sum ((model - y) / y)^2, so short
    decode steps weigh as much as long prefills. `features` from `step_features` with the same
    `shapes`. Returns the fit and each step's relative residual (model - measured) / measured."""
    y = np.asarray(step_us, dtype=np.float64)
    if y.size < features.shape[1] or (y <= 0).any():
        raise ValueError(f"need at least {features.shape[1]} steps with positive times")
    coef, _ = nnls(features / y[:, None], np.ones_like(y))
    if shapes:
        table = tuple(float(c) for c in coef[:shapes])
        values = dict(zip(FEATURES[2:], (float(c) for c in coef[shapes:]), strict=True))
        values |= {"const_us": 0.0, "q_padded_token_us": 0.0}
        fit = EngineStepFit(**values, q_pad_tokens=q_pad_tokens, q_shape_us=table)  # type: ignore[arg-type]
    else:
        values = dict(zip(FEATURES, (float(c) for c in coef), strict=True))
        fit = EngineStepFit(**values, q_pad_tokens=q_pad_tokens)  # type: ignore[arg-type]
    residuals = (features @ coef - y) / y
    return fit, residuals


def fit_fields() -> tuple[str, ...]:
    """Field names of `EngineStepFit` (the YAML keys of a committed fit)."""
    return tuple(f.name for f in fields(EngineStepFit))
