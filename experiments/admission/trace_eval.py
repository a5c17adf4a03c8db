"""Admission on a trace: admit-all vs the threshold rule, Azure conversation trace (not a test).

    python experiments/admission/trace_eval.py [--limit 4000] [--time-scale 0.25]

The learned controller is left out: its weights were trained on mixed_spike's four classes and do
not load on a trace's single class (WeightsError, by design). `--time-scale` < 1 compresses the
recorded arrival times to overload the 16 GB setup. Appends its table to results.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.train_admission import run_episode, with_admission

HERE = Path(__file__).resolve().parent
CONF = HERE.parents[1] / "conf"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, default=4000)
    p.add_argument("--time-scale", type=float, default=0.25)
    args = p.parse_args()
    register_configs()
    teacher = json.loads((HERE / "weights_train_log.json").read_text())["teacher"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run = to_config(compose("config", overrides=[
            "+experiment=azure_conv", "trace.enabled=false", f"replay.limit={args.limit}",
            f"replay.time_scale={args.time_scale}"]))
    cfg = run.sim_for("perc", 0)
    tuned = {k: teacher[k] for k in ("threshold_load_fraction", "threshold_queue_depth")}
    rows = [f"\n### Azure conv trace, first {args.limit} requests, time x{args.time_scale:g} "
            "(one seed: replay is deterministic)\n",
            "| controller | goodput req/s | TTFT p99 s | TTFT p50 s | rejected | deferred |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, adm in (("all (admit everything)", {"name": "all"}),
                      ("threshold (default 0.9 / 16)", {}),
                      ("threshold tuned on mixed_spike", tuned)):
        m = run_episode(with_admission(cfg, 0, **adm))
        rows.append(f"| {name} | {m['goodput_req_s']:.3f} | {m['ttft_p99_s']:.2f} | "
                    f"{m['ttft_p50_s']:.3f} | {m['rejected']} | {m.get('admission_deferred', 0)} |")
    rows.append("| learned | not run: weights trained on 4 classes, the trace has 1 | | | | |")
    text = "\n".join(rows) + "\n"
    print(text)
    with (HERE / "results.md").open("a") as f:
        f.write(text)


if __name__ == "__main__":
    main()
