"""PERC's sensitivity to delta and the EMA weight on mixed_spike (not a test; about two minutes).

Every setting runs on the same seeds as LRU; realized restore seconds are what the run paid, the
gap is the shadow oracle's per-decision gap (expected cost, the quantity PERC's ranking optimises).

    python experiments/perc_sensitivity.py [--seeds 5] [--out experiments/perc_sensitivity.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.experiment.runner import run_cells

DELTAS_S = (5.0, 15.0, 30.0, 60.0, 120.0, 600.0)
EMA_WEIGHTS = (0.1, 0.3, 0.6, 1.0)
CONF = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"


def cells(overrides: list[str]) -> list[dict[str, float]]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = to_config(
            compose(
                "config",
                overrides=[
                    "+experiment=mixed_spike",
                    "trace.enabled=false",
                    "write_requests=false",
                    *overrides,
                ],
            )
        )
    return run_cells(cfg, None)


def fmt(values: list[float], spec: str = "{:.3f}") -> str:
    v = np.array(values)
    return f"{spec.format(v.mean())} ± {spec.format(v.std(ddof=1) if v.size > 1 else 0.0)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    register_configs()
    seeds = f"seeds={args.seeds}"
    lru = {c["seed"]: c["realized_restore_s"] for c in cells([seeds, "compare_policies=[lru]"])}
    rows = [
        "| delta s | EMA weight | realized restore s | vs LRU (paired) | oracle gap mean "
        "| oracle gap worst | TTFT p99 s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    settings = [(d, 0.3) for d in DELTAS_S] + [(30.0, w) for w in EMA_WEIGHTS if w != 0.3]
    for delta, weight in settings:
        run = cells(
            [
                seeds,
                "compare_policies=[perc]",
                f"policy.delta_s={delta}",
                f"policy.ema_weight={weight}",
                "policy.shadow_oracle=true",
            ]
        )
        restore = [c["realized_restore_s"] for c in run]
        ratio = [c["realized_restore_s"] / lru[c["seed"]] for c in run]
        rows.append(
            f"| {delta:g} | {weight:g} | {fmt(restore, '{:.2f}')} | {fmt(ratio)} | "
            f"{fmt([c['oracle_gap_mean'] for c in run], '{:.2f}')} | "
            f"{fmt([c['oracle_gap_worst'] for c in run], '{:.1f}')} | "
            f"{fmt([c['ttft_p99_s'] for c in run], '{:.2f}')} |"
        )
        print(rows[-1], flush=True)
    head = (
        "# PERC sensitivity to delta and the EMA weight "
        f"(mixed_spike, seeds 0-{args.seeds - 1})"
        "\n\nCommand: `python experiments/perc_sensitivity.py --seeds "
        f"{args.seeds} --out experiments/perc_sensitivity.md`; mean ± σ over seeds.\n\n"
    )
    text = head + "\n".join(rows) + "\n"
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
