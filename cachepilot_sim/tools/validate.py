"""Validate the simulator against a real engine's ground truth (docs/validation.md).

    python -m cachepilot_sim.validate GROUND_TRUTH_DIR [--engine hf_cb] [--json OUT.json]
                                      [--plot DIR] [--workloads a,b]
    python -m cachepilot_sim.validate --compare-policies GROUND_TRUTH_DIR [--json OUT.json]

GROUND_TRUTH_DIR is one run folder, a workload folder (run1 is validated, run2 is the engine's own
spread) or a dated folder of workloads. Per workload: the signed relative error (sim - real) / real
of mean, p50, p90, p99 TTFT, TPOT, ITL and E2E, of throughput and preemptions, and the per-request
MAPE. Bad ground truth: one line naming the file and the column, exit status 2. With
`--compare-policies`: predicted vs measured differences between cached-block reuse policies
(validation/policy_effects.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.config import RunConfig, register_configs, to_config
from cachepilot_sim.entry import entry_point
from cachepilot_sim.inputs import one_line
from cachepilot_sim.outputs import check_file, check_folder, staged_folder, write_text
from cachepilot_sim.tools import CONF_DIR
from cachepilot_sim.validation.block_hashes import shared_blocks_rule
from cachepilot_sim.validation.engine_settings import EngineSettingsError, resolve
from cachepilot_sim.validation.ground_truth import (
    GroundTruth,
    GroundTruthError,
    find_runs,
    load_ground_truth,
)
from cachepilot_sim.validation.gt_stats import request_latencies, summarize
from cachepilot_sim.validation.prefix_hits import compare_prefix_hits
from cachepilot_sim.validation.replay import simulate

LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")
TABLE = (
    "ttft_mean_err",
    "ttft_p99_err",
    "tpot_mean_err",
    "tpot_p99_err",
    "itl_mean_err",
    "itl_p99_err",
    "e2e_mean_err",
    "e2e_p99_err",
    "throughput_err",
)


def sim_config(engine: str, extra: list[str]) -> RunConfig:
    """The composed config of an engine profile (package conf/engine/<engine>.yaml), for replay."""
    from hydra import compose, initialize_config_dir

    register_configs()
    overrides = [
        f"engine={engine}",
        "model=llama3_8b",
        "trace.enabled=false",
        "replay.format=MOONCAKE",
        "replay.path=ground_truth",
        "replay.measuring=true",
        *extra,
    ]
    if not any(o.startswith("vram_gb=") for o in extra):  # the H200; the pool: kv_pool_blocks
        overrides.insert(2, "vram_gb=141")
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            return to_config(compose("config", overrides=overrides))
    except (HydraException, OmegaConfBaseException) as err:
        first = one_line(str(err).split("Config search path")[0])
        raise EngineSettingsError(f"--engine {engine}: {first}") from None


def _rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def _mape(sim: GroundTruth, real: GroundTruth, col: str) -> float | None:
    a = request_latencies(real).select("request_id", col)
    b = request_latencies(sim).select("request_id", pl.col(col).alias("sim"))
    both = a.join(b, on="request_id").drop_nulls()
    both = both.filter(pl.col(col) > 0)
    if not both.height:
        return None
    value = ((both["sim"] - both[col]).abs() / both[col]).mean()
    return float(value) if isinstance(value, int | float) else None


def compare(sim: GroundTruth, real: GroundTruth) -> dict[str, Any]:
    """Errors of one workload: `<metric>_<stat>_err`, throughput, preemptions, per-request MAPE."""
    s, r = summarize(sim), summarize(real)
    out: dict[str, Any] = {"requests": r["requests"], "finished_sim": s["finished"]}
    for lat in LATENCIES:
        for st in STATS:
            out[f"{lat}_{st}_err"] = _rel(s[f"{lat}_ms_{st}"], r[f"{lat}_ms_{st}"])
            out[f"{lat}_{st}_real_ms"] = r[f"{lat}_ms_{st}"]
    out["throughput_err"] = _rel(s["throughput_tok_s"], r["throughput_tok_s"])
    real_pre = (r["num_soft_resets"] or 0) + (r["num_cpu_swaps"] or 0)
    sim_pre = (s["num_soft_resets"] or 0) + (s["num_cpu_swaps"] or 0)
    out["preemptions_real"], out["preemptions_sim"] = real_pre, sim_pre
    out["soft_resets_real"], out["soft_resets_sim"] = r["num_soft_resets"], s["num_soft_resets"]
    out["cpu_swaps_real"], out["cpu_swaps_sim"] = r["num_cpu_swaps"], s["num_cpu_swaps"]
    for lat in ("ttft", "tpot", "e2e"):
        out[f"{lat}_mape"] = _mape(sim, real, f"{lat}_us")
    return out


def spread(run1: GroundTruth, run2: GroundTruth) -> dict[str, float | None]:
    """The engine's own run-to-run difference (run2 - run1) / run1 on the table's metrics."""
    cmp = compare(run2, run1)
    return {k: cmp[k] for k in TABLE}


def validate_runs(
    root: Path, engine: str, only: list[str] | None = None
) -> tuple[dict[str, Any], dict[str, tuple[GroundTruth, GroundTruth]]]:
    """Validate every workload under `root` (run1 of each); run2, when present, is the spread."""
    runs = find_runs(root)
    if not runs:
        raise GroundTruthError(f"{root}: no requests.parquet under this folder")
    by_workload: dict[str, list[Path]] = {}
    for path in runs:
        if path == root:
            name = load_ground_truth(path).workload
        else:  # the folder below root, `<config>/<workload>` where configurations nest
            folder = path.parent if path.name.startswith("run") else path
            name = folder.name if folder == root else folder.relative_to(root).as_posix()
        by_workload.setdefault(name, []).append(path)
    unknown = sorted(set(only or []) - set(by_workload))
    if unknown:
        raise GroundTruthError(
            f"{root}: --workloads names {', '.join(unknown)}, not under this folder (found: "
            f"{', '.join(sorted(by_workload))})"
        )
    out: dict[str, Any] = {}
    pairs: dict[str, tuple[GroundTruth, GroundTruth]] = {}
    for name, paths in sorted(by_workload.items()):
        if only and name not in only:
            continue
        if name in ("microbench",):
            continue  # cost micro-runs: the fit's data, not a validation workload
        real = load_ground_truth(paths[0])
        settings = resolve(paths[0], real.engine, sim_config(engine, []))
        run_cfg = sim_config(engine, settings.overrides)
        cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
        sim, metrics = simulate(cfg, real, shared_blocks_rule(real.engine.get("engine")))
        row = compare(sim, real)
        # lazy CUDA-graph captures while serving: the engine's (steps.parquet) and the replay's
        steps = real.steps
        if steps is not None and "graph_captures" in steps.columns:
            row["graph_captures_real"] = int(steps["graph_captures"].sum())
            row["graph_captures_sim"] = int(metrics.get("graph_captures", 0))
        row["engine_settings"] = settings.as_dict()
        if "prefix_hit_tokens" in real.requests.columns:
            row["prefix_hits"] = compare_prefix_hits(sim, real)
        if len(paths) > 1:
            row["spread"] = spread(real, load_ground_truth(paths[1]))
        out[name] = row
        pairs[name] = (sim, real)
    if not out:  # an empty table with exit 0 reads as "no error found"
        raise GroundTruthError(
            f"{root}: nothing to validate (found only {', '.join(sorted(by_workload))}: cost "
            "micro-runs are the fit's data, not a workload)"
        )
    return out, pairs


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _hits(hits: dict[str, Any] | None) -> str:
    """Prefix-hit tokens, sim vs real: the relative error of the total, or n/a."""
    if not hits:
        return "n/a"
    return _pct(hits.get("hit_tokens_err")) if hits.get("real_hit_tokens") else "0/0"


def markdown(workloads: dict[str, Any]) -> str:
    """The error table: sim vs run 1, with run 2's difference (the engine's spread) in brackets."""
    head = [
        "workload",
        "requests",
        *TABLE,
        "resets (sim/real)",
        "swaps (sim/real)",
        "prefix hits",
        "E2E MAPE",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * (len(head) - 2)]
    for name, row in workloads.items():
        sp = row.get("spread", {})
        cells = [f"{_pct(row[k])} ({_pct(sp.get(k))})" if sp else _pct(row[k]) for k in TABLE]
        lines.append(
            f"| `{name}` | {row['requests']} | "
            + " | ".join(cells)
            + f" | {row['soft_resets_sim'] or 0}/{row['soft_resets_real'] or 0}"
            + f" | {row['cpu_swaps_sim'] or 0}/{row['cpu_swaps_real'] or 0}"
            + f" | {_hits(row.get('prefix_hits'))}"
            + f" | {_pct(row['e2e_mape']).lstrip('+')} |"
        )
    return "\n".join(lines)


def settings_text(workloads: dict[str, Any]) -> str:
    """The resolved engine settings the workloads were replayed with: a key with one value in
    every workload once, a key that differs with each workload's value; then every transfer to a
    GPU the step cost was not measured on."""
    per_key: dict[str, dict[str, str]] = {}
    for name, row in workloads.items():
        for key, v in row["engine_settings"]["settings"].items():
            per_key.setdefault(key, {})[name] = f"{v['value']}: {v['use']}"
    lines = ["engine settings replayed (engine.json key = value: what the replay did):"]
    for key, by_name in per_key.items():
        values = set(by_name.values())
        if len(values) == 1 and len(by_name) == len(workloads):
            lines.append(f"  {key} = {values.pop()}")
        else:
            lines += [f"  {key} [{name}] = {v}" for name, v in by_name.items()]
    for name, row in workloads.items():
        lines += [f"note ({name}): {n}" for n in row["engine_settings"]["notes"]]
    return "\n".join(lines)


def plot(pairs: dict[str, tuple[GroundTruth, GroundTruth]], out_dir: Path) -> None:
    """Per workload: sim vs real CDFs of TTFT, TPOT and E2E, and a per-request E2E scatter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    from cachepilot_sim.plotting import seaborn_data

    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (sim, real) in pairs.items():
        frames = []
        for label, gt in (("sim", sim), ("real", real)):
            lat = request_latencies(gt).select("request_id", "ttft_us", "tpot_us", "e2e_us")
            frames.append(lat.with_columns(source=pl.lit(label)))
        both = pl.concat(frames)
        df = seaborn_data(both)  # numpy columns: no pandas/pyarrow conversion of the frame
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
        for ax, col in zip(axes[:3], ("ttft_us", "tpot_us", "e2e_us"), strict=True):
            sns.ecdfplot(data=df, x=col, hue="source", ax=ax)
        wide = both.pivot(
            on="source", index="request_id", values="e2e_us", aggregate_function="mean"
        ).select("real", "sim")
        sns.scatterplot(data=seaborn_data(wide), x="real", y="sim", ax=axes[3], s=12)
        hi = float(np.nanmax(wide.cast(pl.Float64).to_numpy()))
        axes[3].plot([0, hi], [0, hi], lw=0.8, color="grey")
        axes[3].set_title("E2E per request (us)")
        fig.suptitle(name)
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=110)
        plt.close(fig)


def _repo_relative(path: Path) -> str:
    """`path` relative to the repository when inside it (the registry of tools/trust_table.py
    finds the captures from there), else as given."""
    repo = CONF_DIR.parents[1]
    try:
        return path.resolve().relative_to(repo).as_posix()
    except ValueError:
        return str(path)


def _compare_policies(args: argparse.Namespace, only: list[str] | None) -> None:
    """`--compare-policies`: validation/policy_effects.py; its table, and `--json` as given."""
    from cachepilot_sim.validation.policy_effects import (
        PolicyEffectsError,
        compare_policies,
        markdown,
    )

    if args.plot:
        print("error: --plot: not available with --compare-policies", file=sys.stderr)
        raise SystemExit(2)
    try:
        result = compare_policies(args.ground_truth, args.engine, sim_config, only)
    except (GroundTruthError, EngineSettingsError, PolicyEffectsError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    labels = sorted({p["predicted_by"] for p in result["policies"]})
    print("\n".join(f"profile: {label}" for label in labels))
    print(f"engine profile: {args.engine}; cells: (b - a) / a, measured = mean of the runs")
    print(markdown(result))
    if args.json:
        result["ground_truth"] = _repo_relative(args.ground_truth)
        write_text(args.json, json.dumps(result, indent=1) + "\n")


@entry_point("cachepilot-sim validate")
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m cachepilot_sim.validate", description=__doc__.splitlines()[0]
    )
    ap.add_argument("ground_truth", type=Path)
    ap.add_argument("--engine", default="hf_cb", help="engine profile (conf/engine/NAME.yaml)")
    ap.add_argument("--json", type=Path, help="write the errors as JSON")
    ap.add_argument("--plot", type=Path, help="write sim-vs-real figures to this folder")
    ap.add_argument("--workloads", default="", help="comma-separated subset of workloads")
    ap.add_argument(
        "--compare-policies",
        action="store_true",
        help="GROUND_TRUTH_DIR holds one workload under several policies (capture.py --phase "
        "policy_ab): report predicted vs measured differences between policies",
    )
    args = ap.parse_args(argv)
    only = [w for w in args.workloads.split(",") if w] or None
    if args.json:  # refused before the replay, not after it
        check_file(args.json)
    if args.plot:
        check_folder(args.plot)
    if args.compare_policies:
        _compare_policies(args, only)
        return
    workloads, pairs = validate_runs(args.ground_truth, args.engine, only)
    print(settings_text(workloads))
    print(f"engine profile: {args.engine}; cells: sim vs run 1 (run 2 vs run 1)")
    print(markdown(workloads))
    if args.json:
        text = json.dumps(
            {
                "engine": args.engine,
                "ground_truth": _repo_relative(args.ground_truth),
                "workloads": workloads,
            },
            indent=1,
        )
        write_text(args.json, text + "\n")
    if args.plot:
        with staged_folder(args.plot, ("*.png",)) as stage:
            plot(pairs, stage)


if __name__ == "__main__":
    sys.exit(main())
