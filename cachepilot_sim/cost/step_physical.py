"""Step time of a CUDA-graph engine (transformers continuous batching) built from physical terms:
its kernels' times on the measured GPU (cost/gpu_profile.py) at the padded shape it launches,
scaled by a few constants fitted from the engine's own micro-runs.

What one step of transformers CB 5.17 does, per decoder layer, under CUDA graphs
(continuous_batching/model_runner.py, input_outputs.py, cache.py): the four linear layers over
the query count padded to `q_pad_tokens`; `index_copy_` of the new K/V into the cache and
`index_select` of every request's whole KV (padded to `kv_pad_tokens`) into one contiguous buffer;
FlashAttention-2 varlen with `max_seqlen_q` set to the padded query count over `min(padded
queries, max_requests_per_batch)` sequence slots (the padding slots are empty sequences, but each
still gets its grid of query tiles, one per 128 rows x head); norms, rotary, SiLU and residual
adds over every padded token. Once per step: the LM head over one row per sequence slot (the
model keeps `logits_indices[:num_sequences]`), the fp32 logits and their argmax. Each of these is
a basis term; the step time is an NNLS fit of a per-step overhead, a per-request cost and one
scale per term (`fit_physical`), so terms follow the hardware and extrapolate in the step size.

vLLM 0.26 (`kernels=vllm`, model runner V2, `cudagraph_mode` FULL_DECODE_ONLY) differs where its
kernels do (`vllm_terms`): a uniform decode step of at most the largest capture size replays a
full graph padded to the next capture size (`CudaGraphManager.dispatch`); any other step runs
eagerly and unpadded, and its host launch of every layer's ops bounds it from below
(`eager_floor_us`, the engine's measured launch); paged FlashAttention reads the KV in place (no
gather, only the new tokens' K/V written); the LM head runs over one row per request.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from scipy.optimize import nnls

from cachepilot_sim.config.engine_profile import PhysicalKernels
from cachepilot_sim.cost.gpu_profile import ATTENTION_BLOCK_Q, DECODER_LAYERS, GpuProfile

# Order of the basis columns and of PhysicalFit's coefficients.
TERMS = (
    "overhead_us",  # x 1: launch and host work of one graph replay
    "request_us",  # x requests in the step
    "gemm_scale",  # x GEMM time on the profile at the padded shape
    "kv_copy_scale",  # x KV gather + scatter bytes over the measured copy rate
    "attention_scale",  # x varlen attention time on the profile
    "elementwise_scale",  # x activation and logits bytes over the measured copy rate
    "grid_block_ns",  # x attention query tiles launched (thousands): empty ones exit early
)
# Activation elements read or written per padded token per decoder layer, in units of hidden
# (h), KV width (kv) and intermediate (i): two RMSNorms (2h each), rotary on q and k (2h + 2kv),
# two residual adds (3h each), SiLU x up (3i). The GEMMs' own reads and writes are in their times.
LOGIT_BYTES = 10  # per logit: bf16 written by the LM head read (2), fp32 written (4), argmax (4)


def activation_bytes(model: dict[str, int]) -> int:
    """Bytes of elementwise traffic per padded token per decoder layer (bf16)."""
    h, i = model["hidden"], model["intermediate"]
    kv = model["kv_heads"] * model["head_dim"]
    return 2 * (14 * h + 2 * kv + 3 * i)


@dataclass(frozen=True, slots=True)
class PaddingRules:
    """How the engine pads a step (transformers: `maybe_pad_inputs`, `_get_num_sequences`)."""

    q_pad_tokens: int  # queries to a multiple of this (q_padding_interval_size)
    kv_pad_tokens: int = 0  # KV read to a multiple of this (kv_padding_interval_size); 0: none
    max_batch_tokens: int = 0  # cap of the padded queries (the token budget); 0: none
    max_kv_tokens: int = 0  # cap of the padded KV read (the cache's pages); 0: none
    max_seqs: int = 0  # sequence slots = min(padded queries, this) (max_requests_per_batch)
    kernels: PhysicalKernels = PhysicalKernels.HF_CB  # whose kernels and padding (see module)
    # vLLM: the CUDA-graph capture sizes (cudagraph_capture_sizes); a uniform decode step of at
    # most max(graph_sizes) requests is padded to the next one, every other step runs eagerly.
    graph_sizes: tuple[int, ...] = ()


def _pad(num: np.ndarray, interval: int, cap: int) -> np.ndarray:
    """transformers' pad_to_interval: the next multiple of `interval`, 0 padded to one interval,
    capped at `cap` (when > 0)."""
    out = np.maximum(np.ceil(num / interval), 1.0) * interval
    return np.minimum(out, cap) if cap > 0 else out


@dataclass(frozen=True, slots=True)
class StepShapes:
    """The launch shapes of steps, one float64 entry per step."""

    q_tokens: np.ndarray
    q_padded: np.ndarray
    kv_read: np.ndarray  # KV tokens held before the step, summed over its requests
    kv_read_padded: np.ndarray
    longest: np.ndarray  # longest sequence after the step (max_seqlen_k, unpadded)
    prefill_tokens: np.ndarray  # tokens of requests computing more than one token
    num_prefill_requests: np.ndarray
    num_requests: np.ndarray
    seq_slots: np.ndarray  # sequence slots of the padded launch (also the LM head's rows)
    eager: np.ndarray | None = None  # vLLM: True where the step runs without a CUDA graph


def pad_shapes(
    rules: PaddingRules,
    q_tokens: np.ndarray,
    kv_read: np.ndarray,
    longest: np.ndarray,
    prefill: tuple[np.ndarray, np.ndarray],
    num_requests: np.ndarray,
) -> StepShapes:
    """Steps' shapes with the engine's padding applied; `prefill` = (tokens, requests)."""
    q = np.asarray(q_tokens, dtype=np.float64)
    kv = np.asarray(kv_read, dtype=np.float64)
    if rules.kernels == PhysicalKernels.VLLM:
        return vllm_shapes(rules, q, kv, longest, prefill, np.asarray(num_requests, np.float64))
    q_pad = _pad(q, rules.q_pad_tokens, rules.max_batch_tokens)
    kv_pad = _pad(kv, rules.kv_pad_tokens, rules.max_kv_tokens) if rules.kv_pad_tokens else kv
    slots = np.minimum(q_pad, rules.max_seqs) if rules.max_seqs else q_pad
    return StepShapes(
        q_tokens=q,
        q_padded=q_pad,
        kv_read=kv,
        kv_read_padded=kv_pad,
        longest=np.asarray(longest, dtype=np.float64),
        prefill_tokens=np.asarray(prefill[0], dtype=np.float64),
        num_prefill_requests=np.asarray(prefill[1], dtype=np.float64),
        num_requests=np.asarray(num_requests, dtype=np.float64),
        seq_slots=slots,
    )


def vllm_shapes(
    rules: PaddingRules,
    q: np.ndarray,
    kv: np.ndarray,
    longest: np.ndarray,
    prefill: tuple[np.ndarray, np.ndarray],
    num_requests: np.ndarray,
) -> StepShapes:
    """vLLM 0.26's launch shapes: a step whose every request computes one token (vLLM's
    `get_uniform_token_count` == 1) and whose token count fits a capture size is padded to the
    smallest capture size holding it (tokens and requests alike); any other step is unpadded."""
    sizes = np.asarray(sorted(rules.graph_sizes) or [0], dtype=np.float64)
    graph = (q == num_requests) & (q <= sizes[-1]) & (q > 0)
    padded = sizes[np.minimum(np.searchsorted(sizes, q), sizes.size - 1)]
    q_pad = np.where(graph, padded, q)
    return StepShapes(
        q_tokens=q,
        q_padded=q_pad,
        kv_read=kv,
        kv_read_padded=kv,
        longest=np.asarray(longest, dtype=np.float64),
        prefill_tokens=np.asarray(prefill[0], dtype=np.float64),
        num_prefill_requests=np.asarray(prefill[1], dtype=np.float64),
        num_requests=num_requests,
        seq_slots=num_requests,  # compute_logits runs on the sampled rows, outside the graph
        eager=~graph,
    )


def batch_shape(rules: PaddingRules, new: np.ndarray, ctx: np.ndarray) -> StepShapes:
    """The shape of one step: per request the tokens computed now and the KV tokens held."""
    new = np.asarray(new, dtype=np.float64)
    ctx = np.asarray(ctx, dtype=np.float64)
    is_prefill = new > 1
    return pad_shapes(
        rules,
        np.array([new.sum()]),
        np.array([ctx.sum()]),
        np.array([(ctx + new).max()]),
        (np.array([new[is_prefill].sum()]), np.array([float(is_prefill.sum())])),
        np.array([float(new.size)]),
    )


def decode_shapes(rules: PaddingRules, ctx: np.ndarray, num_steps: int) -> StepShapes:
    """`num_steps` pure-decode steps of one unchanged batch whose contexts grow by one per step:
    the same shapes `batch_shape` gives each step."""
    n = float(ctx.size)
    j = np.arange(num_steps, dtype=np.float64)
    zeros = np.zeros(num_steps)
    return pad_shapes(
        rules,
        np.full(num_steps, n),
        float(np.asarray(ctx, dtype=np.float64).sum()) + n * j,
        float(ctx.max()) + 1.0 + j,
        (zeros, zeros),
        np.full(num_steps, n),
    )


def prefill_pairs(s: StepShapes) -> np.ndarray:
    """(query, key) pairs of the step's prefill chunks, from its totals: chunks of equal size c,
    each ending at the longest sequence (exact for one chunk that is the longest sequence)."""
    chunk = s.prefill_tokens / np.maximum(s.num_prefill_requests, 1.0)
    per_query = np.maximum(s.longest - (chunk - 1) / 2, (chunk + 1) / 2)
    return np.where(s.prefill_tokens > 0, s.prefill_tokens * per_query, 0.0)


def attention_us(profile: GpuProfile, s: StepShapes) -> np.ndarray:
    """One layer's varlen attention as a padded CUDA-graph step launches it: max_seqlen_q is the
    padded query count, so every sequence takes the prefill path and a decode's one query fills a
    whole 128-row tile. Work = 128 x the decodes' keys + the prefill chunks' pairs, priced at the
    profile's prefill rate, or the longest sequence's tile walking its keys if that is longer."""
    chunk = s.prefill_tokens / np.maximum(s.num_prefill_requests, 1.0)
    prefill_ctx = np.clip(s.num_prefill_requests * (s.longest - chunk), 0.0, s.kv_read)
    num_decodes = s.num_requests - s.num_prefill_requests
    decode_keys = s.kv_read - prefill_ctx + num_decodes
    work = ATTENTION_BLOCK_Q * decode_keys + prefill_pairs(s)
    stream = np.where(work > 0, profile.prefill.at(np.maximum(work, 1.0)), 0.0)
    return np.maximum(stream, profile.critical.at(s.longest))


def vllm_terms(profile: GpuProfile, num_layers: int, s: StepShapes) -> np.ndarray:
    """vLLM's basis, columns in TERMS order: the same GEMMs, norms and logits as transformers';
    `reshape_and_cache_flash` writing the new tokens' K/V (no gather: FlashAttention-3 reads the
    paged KV in place); the decodes' attention on the profile's decode path plus the prefill
    chunks' pairs on its prefill path; no empty query tiles (no padded sequences)."""
    m = profile.model
    gemm = num_layers * sum(profile.gemm_us(layer, s.q_padded) for layer in DECODER_LAYERS)
    gemm = gemm + profile.gemm_us("lm_head", s.seq_slots)
    kv_copy = num_layers * profile.kv_bytes_per_token_layer() * 2 * s.q_padded  # read + write
    elementwise = num_layers * activation_bytes(m) * s.q_padded
    elementwise = elementwise + LOGIT_BYTES * m["vocab"] * s.seq_slots
    chunk = s.prefill_tokens / np.maximum(s.num_prefill_requests, 1.0)
    prefill_ctx = np.clip(s.num_prefill_requests * (s.longest - chunk), 0.0, s.kv_read)
    decode_keys = np.maximum(s.kv_read - prefill_ctx, 0.0) + (s.q_tokens - s.prefill_tokens)
    d = profile.decode
    decode = np.maximum(d.launch_us + d.token_us * decode_keys, d.single.at(s.longest))
    pairs = prefill_pairs(s)
    attention = np.where(decode_keys > 0, decode, 0.0)
    attention = attention + np.where(pairs > 0, profile.prefill.at(np.maximum(pairs, 1.0)), 0.0)
    return np.stack(
        [
            np.ones_like(s.q_padded),
            s.num_requests,
            gemm,
            kv_copy / profile.hbm_copy_bytes_per_us,
            num_layers * attention,
            elementwise / profile.hbm_copy_bytes_per_us,
            np.zeros_like(s.q_padded),
        ],
        axis=1,
    )


def physical_terms(
    profile: GpuProfile,
    num_layers: int,
    s: StepShapes,
    kernels: PhysicalKernels = PhysicalKernels.HF_CB,
) -> np.ndarray:
    """The basis: one row per step, columns in TERMS order, each in microseconds at scale 1."""
    if kernels == PhysicalKernels.VLLM:
        return vllm_terms(profile, num_layers, s)
    m = profile.model
    gemm = num_layers * sum(profile.gemm_us(layer, s.q_padded) for layer in DECODER_LAYERS)
    gemm = gemm + profile.gemm_us("lm_head", s.seq_slots)
    tokens_moved = 2 * (s.kv_read_padded + s.q_padded) + 2 * s.q_padded  # gather r+w, scatter r+w
    kv_copy = num_layers * profile.kv_bytes_per_token_layer() * tokens_moved
    elementwise = num_layers * activation_bytes(m) * s.q_padded
    elementwise = elementwise + LOGIT_BYTES * m["vocab"] * s.seq_slots
    tiles = np.ceil(s.q_padded / ATTENTION_BLOCK_Q) * s.seq_slots * m["heads"] * num_layers
    return np.stack(
        [
            np.ones_like(s.q_padded),
            s.num_requests,
            gemm,
            kv_copy / profile.hbm_copy_bytes_per_us,
            num_layers * attention_us(profile, s),
            elementwise / profile.hbm_copy_bytes_per_us,
            tiles / 1e3,
        ],
        axis=1,
    )


@dataclass(frozen=True, slots=True)
class PhysicalFit:
    """The engine's constants over the physical basis (names and units as in TERMS)."""

    overhead_us: float
    request_us: float
    gemm_scale: float
    kv_copy_scale: float
    attention_scale: float
    elementwise_scale: float
    grid_block_ns: float
    # vLLM: an eager step takes at least this long (its host launch of every layer's ops, which
    # the GPU overlaps); 0: no floor (transformers' steps are all graph replays).
    eager_floor_us: float = 0.0

    def coefficients(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in TERMS], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class PhysicalStepModel:
    """Everything a physical step time needs: the GPU, the model depth, the padding, the fit."""

    profile: GpuProfile
    num_layers: int
    rules: PaddingRules
    fit: PhysicalFit

    def steps_us(self, s: StepShapes) -> np.ndarray:
        """Durations (us, before rounding) of the steps in `s`. Summed term by term in TERMS
        order, not by a matrix product, whose order of summation may depend on the step count:
        a decode run then prices each step to the bit as a single step."""
        terms = physical_terms(self.profile, self.num_layers, s, self.rules.kernels)
        out = np.zeros(terms.shape[0])
        for i, c in enumerate(self.fit.coefficients()):
            out += c * terms[:, i]
        return with_eager_floor(out, s, self.fit.eager_floor_us)


def with_eager_floor(gpu_us: np.ndarray, s: StepShapes, floor_us: float) -> np.ndarray:
    """Step times with the eager steps' host floor applied: max(floor, GPU time) where eager."""
    if s.eager is None or floor_us <= 0:
        return gpu_us
    return np.where(s.eager, np.maximum(gpu_us, floor_us), gpu_us)


def fit_physical(
    terms: np.ndarray, step_us: np.ndarray, fixed: dict[str, float] | None = None
) -> tuple[PhysicalFit, np.ndarray]:
    """Non-negative least squares of relative error over the basis `terms` (physical_terms);
    returns the fit and each step's relative residual (model - measured) / measured. `fixed`
    holds coefficients not fitted (TERMS names): a term whose rate the profile measured (bytes
    over the measured copy rate) can be held at 1 instead of absorbing what the data cannot
    separate."""
    y = np.asarray(step_us, dtype=np.float64)
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - set(TERMS))
    if unknown:
        raise ValueError(f"no physical term {unknown[0]!r} (terms: {', '.join(TERMS)})")
    free = [i for i, name in enumerate(TERMS) if name not in fixed]
    if y.size < len(free) or (y <= 0).any():
        raise ValueError(f"need at least {len(free)} steps with positive times")
    rest = y - sum(v * terms[:, TERMS.index(k)] for k, v in fixed.items())
    coef = np.zeros(terms.shape[1])
    coef[free], _ = nnls(terms[:, free] / y[:, None], rest / y)
    for name, value in fixed.items():
        coef[TERMS.index(name)] = value
    fit = PhysicalFit(*(float(c) for c in coef))
    return fit, (terms @ coef - y) / y


def fit_fields() -> tuple[str, ...]:
    """Field names of PhysicalFit (the engine.physical_* YAML keys, without the prefix)."""
    return tuple(f.name for f in fields(PhysicalFit))
