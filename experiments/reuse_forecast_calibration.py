"""Calibration of reuse_forecast on the evaluation seeds: forecast vs realized next use.

Called by `python experiments/reuse_forecast.py calibrate`. Three panels: at each release, the
forecast P(next use within 30 s) against the realized share (reliability diagram); at each
eviction, the forecast P(next use within the learned delta) against the realized share; and the
forecast median gap of returning releases against the realized gap. Numbers go to
reuse_forecast/calibration.json, the figure to reuse_forecast_calibration.png.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from cachepilot_sim.config import SimConfig, policy_config  # noqa: E402
from cachepilot_sim.policies.forecast_features import bucket_values  # noqa: E402
from cachepilot_sim.sim import build  # noqa: E402
from cachepilot_sim.tools.forecast_data import release_rows_from_log  # noqa: E402

HORIZON_US = 30e6
BINS = np.linspace(0, 1, 11)


def reliability(p: np.ndarray, hit: np.ndarray) -> dict[str, list[float]]:
    """Per bin of forecast P: mean forecast, realized share, count; plus Brier score."""
    idx = np.clip(np.digitize(p, BINS) - 1, 0, len(BINS) - 2)
    out: dict[str, list[float]] = {"p": [], "realized": [], "n": []}
    for b in range(len(BINS) - 1):
        m = idx == b
        if m.sum():
            out["p"].append(float(p[m].mean()))
            out["realized"].append(float(hit[m].mean()))
            out["n"].append(int(m.sum()))
    out["brier"] = [float(np.mean((p - hit) ** 2))]
    out["brier_climatology"] = [float(np.mean((hit.mean() - hit) ** 2))]
    return out


def median_gap_us(table, rows: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Median of the forecast gap given a return: where S falls half way to its never share."""
    grid = table.grid_us()
    curves = table.curves[rows]
    target = curves[:, -1:] + (1 - curves[:, -1:]) / 2
    first = np.argmax(curves <= target, axis=1)
    return grid[first]


def calibration(cfg: SimConfig, seeds: range, out_dir: Path) -> None:
    rel_p, rel_hit, ev_p, ev_hit, pred_med, real_gap = [], [], [], [], [], []
    for seed in seeds:
        pc = policy_config("reuse_forecast", forecast_record=True)
        sim = build(replace(cfg, seed=seed, policy=pc))
        sim.run()
        pol = sim.policy
        table = pol.table  # type: ignore[attr-defined]
        rows = release_rows_from_log(pol.release_log, pol.access_log)  # type: ignore[attr-defined]
        r = np.array([table.row(bucket_values(table.features, s)) for s, _, _ in rows])
        gap = np.array([g for _, _, g in rows], dtype=np.float64)
        zero = np.zeros(len(r))
        rel_p.append(table.resume_within(r, zero, HORIZON_US))
        rel_hit.append((gap >= 0) & (gap <= HORIZON_US))
        back = gap >= 0
        pred_med.append(median_gap_us(table, r[back]))
        real_gap.append(gap[back])
        nxt: dict[int, list[int]] = {}
        for e, t in pol.access_log:  # type: ignore[attr-defined]
            nxt.setdefault(e, []).append(t)
        for e, t, p, delta in pol.evict_log:  # type: ignore[attr-defined]
            times = nxt.get(e, [])
            k = int(np.searchsorted(times, t, side="right"))
            ev_p.append(p)
            ev_hit.append(k < len(times) and times[k] - t <= delta)
    at_release = reliability(np.concatenate(rel_p), np.concatenate(rel_hit).astype(float))
    at_evict = reliability(np.array(ev_p), np.array(ev_hit, dtype=float))
    med, real = np.concatenate(pred_med), np.concatenate(real_gap)
    rho = stats.spearmanr(med, real).statistic
    summary: dict[str, dict[str, Any]] = {
        "at_release_within_30s": at_release,
        "at_eviction_within_delta": at_evict,
        "median_gap": {
            "spearman": float(rho),
            "median_abs_log10_error": float(np.median(np.abs(np.log10(med / real)))),
            "n": int(len(real)),
        },
    }
    (out_dir / "calibration.json").write_text(json.dumps(summary, indent=1))
    fig, ax = plt.subplots(1, 3, figsize=(14, 4.3))
    for a, (title, d) in zip(
        ax[:2],
        [
            ("at release: P(next use ≤ 30 s)", at_release),
            ("at eviction: P(next use ≤ learned δ)", at_evict),
        ],  # fmt: skip
        strict=True,
    ):
        a.plot([0, 1], [0, 1], color="grey", lw=0.8)
        a.scatter(d["p"], d["realized"], s=[10 + n / 20 for n in d["n"]])
        brier = f"Brier {d['brier'][0]:.3f} (base rate {d['brier_climatology'][0]:.3f})"
        a.set(title=f"{title}\n{brier}", xlabel="forecast probability", ylabel="realized share")
        a.set(xlim=(0, 1), ylim=(0, 1))
    ax[2].scatter(real / 1e6, med / 1e6, s=3, alpha=0.25)
    lim = [0.5, 2000]
    ax[2].plot(lim, lim, color="grey", lw=0.8)
    ax[2].set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="realized gap s")
    ax[2].set(ylabel="forecast median gap s", title=f"returning releases: Spearman {rho:.2f}")
    fig.suptitle("reuse_forecast on mixed_spike, evaluation seeds 0-9 (table: seeds 100-199)")
    fig.tight_layout()
    fig.savefig(out_dir.parent / "reuse_forecast_calibration.png", dpi=110)
    print(
        json.dumps(
            {
                k: {
                    kk: vv
                    for kk, vv in v.items()
                    if kk in ("brier", "brier_climatology", "spearman", "median_abs_log10_error")
                }
                for k, v in summary.items()
            },
            indent=1,
        )
    )
