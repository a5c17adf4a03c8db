"""Admission on a trace: admit-all vs the threshold rule, Azure conversation trace (not a test).

    python experiments/admission/trace_eval.py [--limit 4000] [--time-scale 0.25]

The mixed_spike weights do not load on a trace's single class (WeightsError, by design); the learned
row uses trace_weights.npz, trained on the first 2000 requests at x0.3 (so the evaluation's first
2000 requests were seen in training, at another rate: this is not a held-out result):

    python -m cachepilot_sim.tools.train_admission --out experiments/admission/trace_weights.npz \
        --seed 0 --experiment azure_conv --override replay.limit=2000 \
        --override replay.time_scale=0.3 --train-seeds 1 --iterations 20 --episodes 4

`--time-scale` < 1 compresses the recorded arrival times to overload the 16 GB setup. Appends its
table to results.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.tools.train_admission import run_episode, with_admission

HERE = Path(__file__).resolve().parent
CONF = HERE.parents[1] / "cachepilot_sim" / "conf"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, default=4000)
    p.add_argument("--time-scale", type=float, default=0.25)
    p.add_argument(
        "--experiment",
        default="azure_conv",
        help="azure_conv (the training trace) or azure_code (a held-out trace)",
    )
    args = p.parse_args()
    register_configs()
    teacher = json.loads((HERE / "weights_train_log.json").read_text())["teacher"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run = to_config(
            compose(
                "config",
                overrides=[
                    f"+experiment={args.experiment}",
                    "trace.enabled=false",
                    f"replay.limit={args.limit}",
                    f"replay.time_scale={args.time_scale}",
                ],
            )
        )
    cfg = run.sim_for("perc", 0)
    tuned = {k: teacher[k] for k in ("threshold_load_fraction", "threshold_queue_depth")}
    rows = [
        f"\n### {args.experiment}, first {args.limit} requests, time x{args.time_scale:g} "
        "(one seed: replay is deterministic)\n",
        "| controller | goodput req/s | TTFT p99 s | TTFT p50 s | rejected | deferred |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    controllers = [
        ("all (admit everything)", {"name": "all"}),
        ("threshold (default 0.9 / 16)", {}),
        ("threshold tuned on mixed_spike", tuned),
    ]
    weights = HERE / "trace_weights.npz"
    if weights.exists():
        held_out = args.experiment != "azure_conv"
        label = (
            "learned (trained on azure_conv: a held-out trace)"
            if held_out
            else "learned (trained on this trace, not held out)"
        )
        controllers.append((label, {"name": "learned", "weights": str(weights)}))
    for name, adm in controllers:
        m = run_episode(with_admission(cfg, 0, **adm))
        rows.append(
            f"| {name} | {m['goodput_req_s']:.3f} | {m['ttft_p99_s']:.2f} | "
            f"{m['ttft_p50_s']:.3f} | {m['rejected']} | {m.get('admission_deferred', 0)} |"
        )
    text = "\n".join(rows) + "\n"
    print(text)
    with (HERE / "results.md").open("a") as f:
        f.write(text)


if __name__ == "__main__":
    main()
