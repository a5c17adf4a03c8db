"""A GPU's measured hardware rates (`gpu_profile.json` of kernels/profile_gpu.py), and the times of
an engine step's kernels read off them: GEMMs by token count, varlen attention, HBM copies.

Only `load_gpu_profile` reads a file. Curves are piecewise-linear between measured points and
extrapolate linearly past the last two (a GEMM of 12k tokens is priced, never clamped to 8k).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from cachepilot_sim.inputs import InputError, refuse_special_file

FORMAT = "cachepilot-gpu-profile/1"
LAYERS = ("qkv", "o", "gate_up", "down", "lm_head")
DECODER_LAYERS = LAYERS[:4]  # once per decoder layer; lm_head once per step
MODEL_KEYS = ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab")
RATE_KEYS = (
    "hbm_read_bytes_per_us",
    "hbm_copy_bytes_per_us",
    "launch_us",
    "graph_kernel_us",
    "pcie_h2d_bytes_per_us",
    "pcie_d2h_bytes_per_us",
)
BF16_BYTES = 2


class GpuProfileError(InputError):
    """A gpu_profile.json that cannot be used; one line naming the file and the key."""


@dataclass(frozen=True, slots=True)
class Curve:
    """y(x) through measured points (x increasing): linear between them, below the first point the
    first value (no kernel is cheaper than the smallest one measured), past the last point the
    line through the last two (never below the last value)."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    def at(self, x: float | np.ndarray) -> float | np.ndarray:
        xs, ys = np.asarray(self.x), np.asarray(self.y)
        q = np.asarray(x, dtype=np.float64)
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        out = np.where(q > xs[-1], ys[-1] + slope * (q - xs[-1]), np.interp(q, xs, ys))
        return float(out) if out.ndim == 0 else out


@dataclass(frozen=True, slots=True)
class DecodeAttention:
    """One layer's varlen attention over one-query sequences as the profile launches it
    (max_seqlen_q = 1: FlashAttention's grouped-query decode path): the larger of a throughput
    line (launch + KV tokens / measured rate, over batches of several sequences) and the longest
    sequence alone (batch-1 rows by context). A CUDA-graph engine that pads max_seqlen_q takes the
    prefill path instead (cost/step_physical.py)."""

    launch_us: float
    token_us: float
    single: Curve

    def us(self, kv_tokens: float, longest: float) -> float:
        return max(self.launch_us + self.token_us * kv_tokens, float(self.single.at(longest)))


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """The rates of one GPU: `path` is where they were read (or what they were derived from)."""

    path: str
    gpu: str
    model: dict[str, int]
    hbm_read_bytes_per_us: float
    hbm_copy_bytes_per_us: float  # bytes read + written per us of a device-to-device copy
    launch_us: float
    graph_kernel_us: float
    pcie_h2d_bytes_per_us: float
    pcie_d2h_bytes_per_us: float
    gemm: dict[str, Curve]  # layer -> time (us) by token count M
    prefill: Curve  # one layer's causal prefill of one sequence, time (us) by (query, key) pairs
    # One query tile's walk through its keys, time (us) by keys: the prefill rows whose tiles
    # fit in one wave of the SMs, where the last tile's walk is the kernel's time.
    critical: Curve
    decode: DecodeAttention

    def gemm_us(self, layer: str, num_tokens: float | np.ndarray) -> float | np.ndarray:
        """bf16 GEMM of `layer` over `num_tokens` rows (0 rows: 0)."""
        m = np.asarray(num_tokens, dtype=np.float64)
        out = np.where(m > 0, self.gemm[layer].at(m), 0.0)
        return float(out) if out.ndim == 0 else out

    def prefill_attention_us(self, pairs: float) -> float:
        """One layer's causal attention of prefill chunks holding `pairs` (query, key) pairs."""
        return 0.0 if pairs <= 0 else float(self.prefill.at(pairs))

    def decode_attention_us(self, kv_tokens: float, longest: float) -> float:
        """One layer's attention of one-query sequences reading `kv_tokens` keys in all, the
        longest of `longest` tokens."""
        return 0.0 if kv_tokens <= 0 else self.decode.us(kv_tokens, longest)

    def kv_bytes_per_token_layer(self) -> int:
        """K and V of one token in one layer (bf16)."""
        return 2 * self.model["kv_heads"] * self.model["head_dim"] * BF16_BYTES


def causal_pairs(num_tokens: float) -> float:
    """(query, key) pairs of a causal prefill of one sequence: L (L + 1) / 2."""
    return num_tokens * (num_tokens + 1) / 2


class _Reader:
    """Typed access to the JSON, every failure one line naming the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, why: str) -> GpuProfileError:
        return GpuProfileError(f"{self.path}: key '{key}' {why}")

    def get(self, obj: Any, name: str, key: str) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(key.rsplit(".", 1)[0], "must be an object")
        if name not in obj:
            raise self.fail(key, "is missing")
        return obj[name]

    def number(self, obj: Any, name: str, key: str) -> float:
        value = self.get(obj, name, key)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value <= 0:
            raise self.fail(key, f"= {value!r}: must be a finite number > 0")
        return float(value)

    def rows(self, obj: Any, name: str, key: str) -> list[Any]:
        value = self.get(obj, name, key)
        if not isinstance(value, list):
            raise self.fail(key, "must be a list")
        return value

    def curve(self, points: list[tuple[float, float]], key: str) -> Curve:
        points = sorted(points)
        xs = [p[0] for p in points]
        if len(set(xs)) != len(xs):
            raise self.fail(key, f"repeats a point (x = {xs})")
        if len(xs) < 2:
            raise self.fail(key, "needs at least 2 measured points")
        return Curve(tuple(xs), tuple(p[1] for p in points))


def _gemm(r: _Reader, data: dict[str, Any]) -> dict[str, Curve]:
    points: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYERS}
    for i, row in enumerate(r.rows(data, "gemm", "gemm")):
        key = f"gemm[{i}]"
        layer = r.get(row, "layer", f"{key}.layer")
        if layer not in points:
            raise r.fail(f"{key}.layer", f"= {layer!r}: not one of {list(LAYERS)}")
        m = r.number(row, "m", f"{key}.m")
        points[layer].append((m, r.number(row, "us", f"{key}.us")))
    return {name: r.curve(pts, f"gemm[layer={name}]") for name, pts in points.items()}


ATTENTION_BLOCK_Q = 128  # FlashAttention-2 forward's query tile (kBlockM) for head_dim 128


def _critical(r: _Reader, rows: list[tuple[float, float]], heads: int, sm_count: float) -> Curve:
    """Prefill rows (tokens, us) whose ceil(tokens / 128) x heads tiles fit in one wave; the two
    smallest rows when fewer do."""
    rows = sorted(rows)
    one_wave = [(t, us) for t, us in rows if math.ceil(t / ATTENTION_BLOCK_Q) * heads <= sm_count]
    return r.curve(one_wave if len(one_wave) >= 2 else rows[:2], "attention.prefill")


def _attention(
    r: _Reader, data: dict[str, Any], heads: int
) -> tuple[Curve, Curve, DecodeAttention]:
    attn = r.get(data, "attention", "attention")
    prefill, by_tokens = [], []
    for i, row in enumerate(r.rows(attn, "prefill", "attention.prefill")):
        key = f"attention.prefill[{i}]"
        tokens = r.number(row, "tokens", f"{key}.tokens")
        us = r.number(row, "us", f"{key}.us")
        prefill.append((causal_pairs(tokens), us))
        by_tokens.append((tokens, us))
    single: list[tuple[float, float, float]] = []
    multi: list[tuple[float, float, float]] = []
    for i, row in enumerate(r.rows(attn, "decode", "attention.decode")):
        key = f"attention.decode[{i}]"
        batch = r.number(row, "batch", f"{key}.batch")
        ctx = r.number(row, "context", f"{key}.context")
        us = r.number(row, "us", f"{key}.us")
        (single if batch == 1 else multi).append((ctx, batch * ctx, us))
    single_curve = r.curve([(c, us) for c, _, us in single], "attention.decode[batch=1]")
    if len(multi) < 2:
        raise r.fail("attention.decode[batch>1]", "needs at least 2 measured rows")
    x = np.array([[1.0, kv] for _, kv, _ in multi])
    y = np.array([us for _, _, us in multi])
    coef, _ = nnls(x / y[:, None], np.ones_like(y))  # relative error, like the step fits
    decode = DecodeAttention(float(coef[0]), float(coef[1]), single_curve)
    prefill_curve = r.curve(prefill, "attention.prefill")
    sm_count = r.number(data, "sm_count", "sm_count")
    return prefill_curve, _critical(r, by_tokens, heads, sm_count), decode


def parse_gpu_profile(data: Any, path: Path) -> GpuProfile:
    """A GpuProfile from the decoded JSON of `path` (GpuProfileError on any bad key)."""
    r = _Reader(path)
    fmt = r.get(data, "format", "format")
    if fmt != FORMAT:
        raise r.fail("format", f"= {fmt!r}: expected {FORMAT!r}")
    gpu = r.get(data, "gpu", "gpu")
    if not isinstance(gpu, str) or not gpu:
        raise r.fail("gpu", f"= {gpu!r}: must be a non-empty string")
    model_obj = r.get(data, "model", "model")
    model = {k: int(r.number(model_obj, k, f"model.{k}")) for k in MODEL_KEYS}
    rates = {k: r.number(data, k, k) for k in RATE_KEYS}
    prefill, critical, decode = _attention(r, data, model["heads"])
    gemm = _gemm(r, data)
    return GpuProfile(
        str(path), gpu, model, **rates, gemm=gemm, prefill=prefill, critical=critical, decode=decode
    )


def load_gpu_profile(path: str | Path) -> GpuProfile:
    """Read and check `gpu_profile.json`; every problem is a GpuProfileError naming file and key
    (a missing key is an error: no figure is borrowed from another GPU)."""
    p = Path(path)
    refuse_special_file(p, "GPU profile", GpuProfileError)
    try:
        text = p.read_text()
    except OSError as exc:
        raise GpuProfileError(f"{p}: cannot read ({exc.strerror})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuProfileError(f"{p}: not JSON (line {exc.lineno}: {exc.msg})") from exc
    return parse_gpu_profile(data, p)


def resolve_profile_path(path: str, roots: tuple[Path, ...]) -> Path:
    """`path` itself when absolute, else the first `roots[i] / path` that exists."""
    p = Path(path)
    if p.is_absolute():
        return p
    for root in roots:
        if (root / p).is_file():
            return root / p
    where = ", ".join(str(r) for r in roots)
    raise GpuProfileError(f"{path}: no such GPU profile under {where}")


def check_model(profile: GpuProfile, kv_heads: int, head_dim: int, heads: int) -> None:
    """Refuse a profile measured for another attention geometry than the simulated model's."""
    for key, want in (("kv_heads", kv_heads), ("head_dim", head_dim), ("heads", heads)):
        if profile.model[key] != want:
            raise GpuProfileError(
                f"{profile.path}: key 'model.{key}' = {profile.model[key]}: the simulated model "
                f"has {want} (the profile's GEMMs and attention were measured for another model)"
            )


# Token counts of the datasheet profile's GEMM points (kernels/profile_gpu.py's GEMM_TOKENS).
DATASHEET_TOKENS = (1, 64, 256, 1024, 4096, 8192)


def linear_shapes(model: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(K, N) of each linear layer of one decoder layer and of the LM head (profile_gpu's)."""
    h, kv = model["hidden"], model["kv_heads"] * model["head_dim"]
    q = model["heads"] * model["head_dim"]
    return {
        "qkv": (h, q + 2 * kv),
        "o": (q, h),
        "gate_up": (h, 2 * model["intermediate"]),
        "down": (model["intermediate"], h),
        "lm_head": (h, model["vocab"]),
    }


def datasheet_profile(
    name: str, hbm_gbps: float, bf16_tflops: float, pcie_gbps: float, model: dict[str, int]
) -> GpuProfile:
    """The profile a datasheet implies, nothing measured: each GEMM at the larger of its FLOPs at
    peak dense BF16 and its bytes at peak HBM bandwidth, attention FLOPs at peak and KV bytes at
    peak bandwidth (no critical path), no launch overhead. What a derived GPU costs in accuracy
    is this profile's error against a measured one."""
    flops_per_us, bytes_per_us = bf16_tflops * 1e6, hbm_gbps * 1e3
    gemm = {}
    for layer, (k, n) in linear_shapes(model).items():
        us = [
            max(2 * m * k * n / flops_per_us, (m * k + k * n + m * n) * BF16_BYTES / bytes_per_us)
            for m in DATASHEET_TOKENS
        ]
        gemm[layer] = Curve(tuple(float(m) for m in DATASHEET_TOKENS), tuple(us))
    pair_us = 4 * model["heads"] * model["head_dim"] / flops_per_us
    kv_token_us = 2 * model["kv_heads"] * model["head_dim"] * BF16_BYTES / bytes_per_us
    return GpuProfile(
        path=f"datasheet:{name}",
        gpu=name,
        model=dict(model),
        hbm_read_bytes_per_us=bytes_per_us,
        hbm_copy_bytes_per_us=bytes_per_us,
        launch_us=0.0,
        graph_kernel_us=0.0,
        pcie_h2d_bytes_per_us=pcie_gbps * 1e3,
        pcie_d2h_bytes_per_us=pcie_gbps * 1e3,
        gemm=gemm,
        prefill=Curve((1.0, 2.0), (pair_us, 2 * pair_us)),
        critical=Curve((1.0, 2.0), (0.0, 0.0)),  # a datasheet knows no critical path
        decode=DecodeAttention(0.0, kv_token_us, Curve((1.0, 2.0), (kv_token_us, 2 * kv_token_us))),
    )
