"""Least-squares fits of the simulator's cost parameters to raw GPU measurements (pure functions).

Models (cachepilot_sim/cost/model.py):
  iteration_us = step_overhead_us + (weight_bytes + kv_bytes_read) / hbm_bytes_per_us
                 + prefill_token_us * num_tokens
                 + attention_token2_us * sum_i new_i (ctx_i + new_i / 2)
  transfer_us  = latency_us + bytes / bytes_per_us            (one fit per PCIe direction)
  quantize_us  = bytes / quantize_bytes_per_us                (bytes read + written)
Every fit minimises squared relative error (each point counts the same whatever its size) with
non-negative parameters, and reports the relative error of every measured point.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

HARDWARE_KEYS = (
    "name",
    "hbm_bytes_per_us",
    "prefill_token_us",
    "attention_token2_us",
    "step_overhead_us",
    "pcie_h2d_latency_us",
    "pcie_h2d_bytes_per_us",
    "pcie_d2h_latency_us",
    "pcie_d2h_bytes_per_us",
    "quantize_bytes_per_us",
    "source",
)
PCIE_PATH = "swap_zero_copy_cuda"  # the measured series the PCIe parameters are fitted to
QUANT_VARIANT = "triton_tok_int8_rows4_w4"  # the measured series quantize bandwidth is fitted to


@dataclass(frozen=True, slots=True)
class PointError:
    """Relative error (pred - measured) / measured of one measured point."""

    label: str
    measured_us: float
    predicted_us: float

    @property
    def rel_error(self) -> float:
        return (self.predicted_us - self.measured_us) / self.measured_us


def _solve(features: np.ndarray, measured_us: np.ndarray) -> np.ndarray:
    """Non-negative x minimising sum(((features @ x) - t) / t)^2."""
    a = features / measured_us[:, None]
    col_scale = np.maximum(np.abs(a).max(axis=0), 1e-300)  # conditioning only
    res = lsq_linear(
        a / col_scale, np.ones(len(measured_us)), bounds=(0.0, np.inf), method="bvls", tol=1e-12
    )
    return np.asarray(res.x / col_scale)


def _errors(labels: list[str], measured: np.ndarray, predicted: np.ndarray) -> list[PointError]:
    return [
        PointError(lab, float(m), float(p))
        for lab, m, p in zip(labels, measured, predicted, strict=True)
    ]


def fit_transfer(points: list[dict[str, Any]]) -> tuple[float, float, list[PointError]]:
    """points: {"bytes", "median_us"} -> (latency_us, bytes_per_us, errors)."""
    nbytes = np.array([p["bytes"] for p in points], dtype=np.float64)
    t = np.array([p["median_us"] for p in points], dtype=np.float64)
    x = _solve(np.stack([np.ones_like(nbytes), nbytes], axis=1), t)
    pred = x[0] + nbytes * x[1]
    labels = [f"{int(b)}B" for b in nbytes]
    return float(x[0]), float(1.0 / x[1]), _errors(labels, t, pred)


def fit_bandwidth(points: list[dict[str, Any]]) -> tuple[float, list[PointError]]:
    """points: {"bytes", "median_us"} -> (bytes_per_us through the origin, errors)."""
    nbytes = np.array([p["bytes"] for p in points], dtype=np.float64)
    t = np.array([p["median_us"] for p in points], dtype=np.float64)
    x = _solve(nbytes[:, None], t)
    labels = [f"{int(b)}B" for b in nbytes]
    return float(1.0 / x[0]), _errors(labels, t, nbytes * x[0])


def iteration_features(raw: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rows [1, weight + kv bytes read, num_tokens, attention pairs] for prefill and decode."""
    w = float(raw["model"]["weight_bytes"])
    kv = float(raw["model"]["kv_bytes_per_token"])
    rows, t, labels = [], [], []
    for p in raw["prefill"]:
        n = float(p["num_tokens"])
        rows.append([1.0, w, n, n * n / 2.0])
        t.append(p["median_us"])
        labels.append(f"prefill n={int(n)}")
    for p in raw["decode"]:
        b, c = float(p["batch_size"]), float(p["context_tokens"])
        rows.append([1.0, w + b * (c + 1.0) * kv, b, b * (c + 0.5)])
        t.append(p["median_us"])
        labels.append(f"decode b={int(b)} ctx={int(c)}")
    return np.array(rows), np.array(t, dtype=np.float64), labels


def fit_iteration(raw: dict[str, Any]) -> tuple[dict[str, float], list[PointError]]:
    """Fit step overhead, HBM bandwidth, per-token and per-token-pair costs jointly.

    If the free fit puts HBM bandwidth above the device copy ceiling measured in the same run
    (or at infinity: the KV term unresolved), bandwidth is pinned to that ceiling and the other
    three parameters are refitted: a rate the memory cannot deliver is not a cost model.
    """
    features, t, labels = iteration_features(raw)
    x = _solve(features, t)
    ceiling = hbm_ceiling_bytes_per_us(raw)
    if ceiling is not None and (x[1] <= 0 or 1.0 / x[1] > ceiling):
        inv = 1.0 / ceiling
        rest = _solve(features[:, [0, 2, 3]], t - features[:, 1] * inv)
        x = np.array([rest[0], inv, rest[1], rest[2]])
    params = {
        "step_overhead_us": float(x[0]),
        "hbm_bytes_per_us": float(1.0 / x[1]) if x[1] > 0 else float("inf"),
        "prefill_token_us": float(x[2]),
        "attention_token2_us": float(x[3]),
    }
    return params, _errors(labels, t, features @ x)


def hbm_ceiling_bytes_per_us(raw: dict[str, Any]) -> float | None:
    """Device copy rate (bytes read + written per us) measured with the calibration, if any."""
    copy = raw.get("hbm_copy")
    if not copy:
        return None
    return float(copy["bytes_counted"]) / float(copy["median_us"])


def fit_all(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[PointError]]]:
    """All hardware parameters (HARDWARE_KEYS) from one raw calibration file, with point errors."""
    it_params, it_err = fit_iteration(raw)
    params: dict[str, Any] = dict(it_params)
    errors = {"iteration": it_err}
    for direction in ("h2d", "d2h"):
        pts = [p for p in raw["pcie"][direction] if p["path"] == PCIE_PATH]
        lat, bw, err = fit_transfer(pts)
        params[f"pcie_{direction}_latency_us"] = lat
        params[f"pcie_{direction}_bytes_per_us"] = bw
        errors[f"pcie_{direction}"] = err
    quant = [p for p in raw["quantize"] if p["variant"] == QUANT_VARIANT]
    params["quantize_bytes_per_us"], errors["quantize"] = fit_bandwidth(quant)
    env = raw["environment"]
    params["name"] = "h200"
    params["source"] = (
        f"experiments/calibration/{raw['date']}_h200.json, {env['device']}, {raw['date']}"
    )
    return {k: params[k] for k in HARDWARE_KEYS}, errors


def error_summary(errors: dict[str, list[PointError]]) -> dict[str, Any]:
    """Median and worst |relative error| per fit and over all points."""
    out: dict[str, Any] = {}
    every = []
    for name, errs in errors.items():
        rel = [abs(e.rel_error) for e in errs]
        every += rel
        out[name] = {"median_abs_rel": statistics.median(rel), "max_abs_rel": max(rel)}
    out["all"] = {"median_abs_rel": statistics.median(every), "max_abs_rel": max(every)}
    return out


def hardware_yaml(params: dict[str, Any], comment: str = "") -> str:
    """The conf/hardware file: exactly HARDWARE_KEYS, floats written with full precision."""
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    for key in HARDWARE_KEYS:
        v = params[key]
        lines.append(f'{key}: "{v}"' if isinstance(v, str) else f"{key}: {float(v)!r}")
    return "\n".join(lines) + "\n"
