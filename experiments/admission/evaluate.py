"""Learned admission vs admitting everything vs the threshold rule, on held-out seeds (not a test).

    python -m cachepilot_sim.tools.train_admission --out experiments/admission/weights.npz --seed 0
    python experiments/admission/evaluate.py [--seeds 10] [--first-seed 100]

Training used seeds 1000..1002 of the overloaded variant; these seeds (100..) were never seen.
Writes results.md, results.json and training_curve.png beside this file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cachepilot_sim.config import register_configs  # noqa: E402
from cachepilot_sim.tools.train_admission import (  # noqa: E402
    OVERLOAD,
    base_config,
    run_episode,
    with_admission,
)

HERE = Path(__file__).resolve().parent
WEIGHTS = HERE / "weights.npz"
SCENARIOS = {"mixed_spike (stock)": [], "mixed_spike overload (256 slots, spike x16)": OVERLOAD}
METRICS = (
    ("goodput_req_s", "goodput req/s", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("rejected", "rejected", "{:.1f}"),
    ("admission_deferred", "deferred", "{:.1f}"),
)


def controllers(teacher: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tuned = {
        "threshold_load_fraction": teacher["threshold_load_fraction"],
        "threshold_queue_depth": teacher["threshold_queue_depth"],
    }
    return {
        "all (admit everything)": {"name": "all"},
        "threshold (default 0.9 / 16)": {"name": "threshold"},
        "threshold tuned (teacher)": {"name": "threshold", **tuned},
        "learned": {"name": "learned", "weights": str(WEIGHTS)},
    }


def plot_curve(log: dict[str, Any], path: Path) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(np.arange(1, len(log["imitation_loss"]) + 1), log["imitation_loss"])
    a.set(xlabel="imitation epoch", ylabel="cross-entropy vs teacher", title="1. imitation")
    rl = log["rl_mean_goodput"]
    its = np.arange(1, len(rl) + 1)
    for k in range(3):  # iteration i trains on training seed i % 3: one line per seed
        sel = its % 3 == k
        b.plot(its[sel], np.array(rl)[sel], ".-", alpha=0.5, label=f"sampled, train seed #{k}")
    g = np.array(log["greedy"])
    b.plot(g[:, 0], g[:, 1], "o-", label="greedy policy, training seeds")
    b.axhline(log["teacher"]["goodput_req_s"], color="gray", ls="--", label="teacher")
    b.set(xlabel="REINFORCE iteration", ylabel="goodput under SLA, req/s", title="2. REINFORCE")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=100)
    args = p.parse_args()
    register_configs()
    log = json.loads((HERE / "weights_train_log.json").read_text())
    plot_curve(log, HERE / "training_curve.png")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    out: dict[str, Any] = {"seeds": seeds, "teacher": log["teacher"], "results": {}}
    lines = [
        f"Held-out seeds {seeds[0]}..{seeds[-1]}, PERC eviction, 1000 requests; mean ± σ "
        "over seeds, then paired differences per seed.\n"
    ]
    for scen, overrides in SCENARIOS.items():
        cfg = base_config(list(overrides))
        lines += [
            f"\n### {scen}\n",
            "| controller | " + " | ".join(t for _, t, _ in METRICS) + " |",
            "|---|" + "---:|" * len(METRICS),
        ]
        cells: dict[str, list[dict[str, Any]]] = {}
        for name, adm in controllers(log["teacher"]).items():
            runs = []
            for s in seeds:
                m = run_episode(with_admission(cfg, s, **adm))
                runs.append({k: float(m.get(k, 0)) for k, _, _ in METRICS})
            cells[name] = runs
            row = []
            for k, _, fmt in METRICS:
                v = np.array([r[k] for r in runs])
                row.append(f"{fmt.format(v.mean())} ± {fmt.format(v.std(ddof=1))}")
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        lines.append("")
        for base in ("all (admit everything)", "threshold tuned (teacher)"):
            for k in ("goodput_req_s", "ttft_p99_s"):
                pairs = zip(cells["learned"], cells[base], strict=True)
                d = np.array([a[k] - b[k] for a, b in pairs])
                wins = int((d > 0).sum()) if k == "goodput_req_s" else int((d < 0).sum())
                lines.append(
                    f"- learned − {base}, {k}: mean {d.mean():+.4f}, σ "
                    f"{d.std(ddof=1):.4f}, better on {wins}/{len(d)} seeds"
                )
        out["results"][scen] = cells
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    (HERE / "results.json").write_text(json.dumps(out, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
