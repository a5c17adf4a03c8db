"""What a lazy CUDA-graph capture costs, per workload, against the one constant the engine profile
prices it at (`engine.graph_capture_us`): where the H100 defaults' TTFT underestimate comes from.

Per step that captured a graph (`graph_captures` = 1 in steps.parquet), its excess is its time
(`end_us - start_us`) less the physical step cost's price of its recorded shape (the profile's
fit on its GPU micro-profile: nothing is fitted here). Prints, per workload, the captures, the
median excess and the stall the replay leaves out (sum of excess less the profile's constant per
capture). `--replay RUN` then replays one run with the profile's constant and with that
workload's own median excess and prints the TTFT mean error of each.

    PYTHONPATH=. python experiments/validation/capture_stall.py \\
        experiments/validation/hf_cb/2026-12-06-h100/defaults \\
        --replay experiments/validation/hf_cb/2026-12-06-h100/defaults/shared_prompt/run1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.cost.gpu_profile import load_gpu_profile
from cachepilot_sim.cost.step_physical import TERMS, PhysicalFit, physical_terms
from cachepilot_sim.tools.fit_physical import NUM_LAYERS, recorded_shapes
from cachepilot_sim.tools.validate import (
    compare,
    load_ground_truth,
    resolve,
    shared_blocks_rule,
    sim_config,
    simulate,
)

PROFILE = "hf_cb_physical"


def _engine() -> dict:
    import yaml

    return yaml.safe_load((CONF_DIR / "engine" / f"{PROFILE}.yaml").read_text())["engine"]


def capture_excess(root: Path) -> pl.DataFrame:
    """One row per capture step under `root`: workload, run, shape and excess (us)."""
    eng = _engine()
    fit = PhysicalFit(**{t: float(eng[f"physical_{t}"]) for t in TERMS})
    profile = load_gpu_profile(str(CONF_DIR / eng["gpu_profile"]))
    rows = []
    for path in sorted(root.glob("*/run*/steps.parquet")):
        settings = json.loads((path.parent / "engine.json").read_text())
        steps = pl.read_parquet(path).filter(pl.col("graph_captures") == 1)
        if steps.height == 0:
            continue
        steps = steps.with_columns(max_seqs=pl.lit(settings["max_requests_per_batch"]))
        price = physical_terms(profile, NUM_LAYERS, recorded_shapes(steps)) @ fit.coefficients()
        rows.append(
            steps.select(
                workload=pl.lit(path.parent.parent.name),
                run=pl.lit(path.parent.name),
                q_tokens_padded="q_tokens_padded",
                kv_read_padded="kv_read_padded",
                excess_us=(pl.col("end_us") - pl.col("start_us")).cast(pl.Float64)
                - pl.Series(np.asarray(price, dtype=np.float64)),
            )
        )
    if not rows:
        raise SystemExit(f"{root}: no run with a lazy capture (graph_captures) under it")
    return pl.concat(rows)


def replay_ttft(run: Path, capture_us: int | None) -> float:
    """TTFT mean error (sim - real) / real of one run, the capture stall optionally replaced."""
    real = load_ground_truth(run)
    settings = resolve(run, real.engine, sim_config(PROFILE, []))
    extra = [] if capture_us is None else [f"engine.graph_capture_us={capture_us}"]
    run_cfg = sim_config(PROFILE, settings.overrides + extra)
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    sim, _ = simulate(cfg, real, shared_blocks_rule(real.engine.get("engine")))
    return float(compare(sim, real)["ttft_mean_err"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="a folder of <workload>/run<k> captures")
    ap.add_argument("--replay", type=Path, help="one run folder to replay both ways")
    args = ap.parse_args()
    const = int(_engine()["graph_capture_us"])
    df = capture_excess(args.root)
    per = (
        df.group_by("workload")
        .agg(
            captures=pl.len(),
            median_ms=pl.col("excess_us").median() / 1e3,
            p10_ms=pl.col("excess_us").quantile(0.1) / 1e3,
            p90_ms=pl.col("excess_us").quantile(0.9) / 1e3,
            missed_s=(pl.col("excess_us") - const).sum() / 1e6,
        )
        .sort("workload")
    )
    print(f"{PROFILE}: engine.graph_capture_us = {const} us per capture")
    for r in per.iter_rows(named=True):
        print(
            f"{r['workload']:>14}: {r['captures']:4d} captures, excess median "
            f"{r['median_ms']:.1f} ms (p10 {r['p10_ms']:.1f}, p90 {r['p90_ms']:.1f}); "
            f"stall left out of the replay {r['missed_s']:+.2f} s"
        )
    if args.replay:
        name = args.replay.parent.name
        own = per.filter(pl.col("workload") == name)["median_ms"]
        if own.len() == 0:
            raise SystemExit(f"--replay {args.replay}: no captures of workload {name} under root")
        own_us = round(float(own.item()) * 1e3)
        print(f"{args.replay}: TTFT mean error with {const} us per capture ", end="")
        print(
            f"{replay_ttft(args.replay, None):+.1%}, with {own_us} us (this workload's median) ",
            end="",
        )
        print(f"{replay_ttft(args.replay, own_us):+.1%}")


if __name__ == "__main__":
    main()
