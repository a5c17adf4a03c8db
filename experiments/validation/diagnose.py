"""Two checks behind sentences of the README's "How close to a real engine" section.

`step-bias`: the fitted hf_cb step cost against the engine's measured device time and wall time,
on the validation workloads' own steps (mixed prefill+decode steps and decode-only steps apart).
Nothing is fitted here: it reads the committed `steps.parquet` and the `engine=hf_cb` config.

    PYTHONPATH=. python experiments/validation/diagnose.py step-bias \
        experiments/validation/hf_cb/2026-12-01 poisson_r3 multiturn pressure_queue poisson_r9

`prefix-hits`: replays one workload and prints, per request, the prompt blocks the simulator's
prefix cache hit against the blocks the engine reported as hits (`prefix_hit_tokens`), and the sums.

    PYTHONPATH=. python experiments/validation/diagnose.py prefix-hits \
        experiments/validation/hf_cb/2026-12-01/multiturn
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from cachepilot_sim.cost.engine_step import FEATURES, EngineStepFit, step_features
from cachepilot_sim.sim import build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.ground_truth import GroundTruthError, load_ground_truth
from cachepilot_sim.validation.replay import engine_overrides, workload_from_ground_truth

BLOCK_TOKENS = 256  # the engine's block size (engine.json of every capture)


def step_bias(root: Path, workloads: list[str]) -> None:
    """Median ratio of the fitted step cost to measured device and wall time, per step kind."""
    e = sim_config("hf_cb", []).engine
    fit = EngineStepFit(
        *(getattr(e, name) for name in FEATURES),
        q_pad_tokens=e.q_pad_tokens,
        q_shape_us=tuple(e.q_shape_us),
    )
    print("| workload | steps | n | fit / device | fit / wall | device ms | wall ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for wl in workloads:
        path = root / wl / "run1" / "steps.parquet"
        s = pl.read_parquet(path).filter(pl.col("gpu_us") > 0)
        x = step_features(
            s["q_tokens"].to_numpy(),
            s["kv_read_tokens"].to_numpy(),
            s["max_seqlen_k"].to_numpy(),
            s["prefill_tokens"].to_numpy(),
            s["num_requests"].to_numpy(),
            e.q_pad_tokens,
            len(e.q_shape_us),
        )
        pred = x @ fit.coefficients()
        wall = (s["end_us"] - s["start_us"]).to_numpy()
        gpu = s["gpu_us"].to_numpy()
        mixed = s["prefill_tokens"].to_numpy() > 0
        for kind, m in (("mixed", mixed), ("decode", ~mixed)):
            if m.sum():
                print(
                    f"| {wl} | {kind} | {int(m.sum())} | {np.median(pred[m] / gpu[m]):.3f} | "
                    f"{np.median(pred[m] / wall[m]):.3f} | {gpu[m].mean() / 1e3:.1f} | "
                    f"{wall[m].mean() / 1e3:.1f} |"
                )


def prefix_hits(folder: Path) -> None:
    """Per request: blocks hit in the simulator's replay vs the engine's reported hits."""
    real = load_ground_truth(folder)
    run_cfg = sim_config("hf_cb", [*engine_overrides(real, BLOCK_TOKENS), "trace.enabled=true"])
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    wl, order = workload_from_ground_truth(real, BLOCK_TOKENS)
    with tempfile.TemporaryDirectory() as tmp:
        res = build(cfg, Path(tmp), wl).run()
        parts = sorted(Path(tmp).rglob("*.parquet"))
        trace = pl.concat([pl.read_parquet(p) for p in parts], how="diagonal_relaxed")
    admit = (
        trace.filter(pl.col("kind") == "admit")
        .group_by("request")
        .agg(pl.col("value").first().alias("prefill"))
    )
    sim = (
        res.requests.sort("request")
        .with_columns(request_id=order["request_id"])
        .join(admit, on="request", how="left")
        .with_columns(hit_sim=(pl.col("prompt_tokens") - pl.col("prefill")) // BLOCK_TOKENS)
    )
    hits_real = real.requests.select(
        "request_id", (pl.col("prefix_hit_tokens") // BLOCK_TOKENS).alias("hit_real")
    )
    joined = sim.join(hits_real, on="request_id").sort("arrival_us")
    with pl.Config(tbl_rows=-1):
        print(joined.select("request_id", "prompt_tokens", "hit_sim", "hit_real", "preemptions"))
    print(f"blocks hit: simulator {joined['hit_sim'].sum()}, engine {joined['hit_real'].sum()}")


def main(argv: list[str] | None = None) -> int:
    """Command line: `step-bias ROOT WORKLOAD...` or `prefix-hits FOLDER`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sb = sub.add_parser("step-bias")
    sb.add_argument("root", type=Path)
    sb.add_argument("workloads", nargs="+")
    ph = sub.add_parser("prefix-hits")
    ph.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "step-bias":
            step_bias(args.root, args.workloads)
        else:
            prefix_hits(args.folder)
    except (GroundTruthError, FileNotFoundError, pl.exceptions.ColumnNotFoundError) as exc:
        print(f"diagnose: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
