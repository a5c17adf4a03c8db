"""Replay speed (not a test): wall and CPU seconds to replay a whole trace once per policy, through
`run_cells` as the CLI does (trace read, simulation, trace rows recorded, per-request Parquet
written), for the Azure 2023 conversation trace (19,366 requests) and the Mooncake synthetic trace
(3,993 requests), every registered policy except the exact oracle by default.

    python experiments/bench_replay_speed.py [--experiments azure_conv,mooncake_synthetic]
        [--policies lru,perc] [--limit N] [--out FILE.json] [--markdown FILE.md]

Reads the traces from $CACHEPILOT_TRACES_DIR (default ../shared/traces), like the experiments.
The markdown file gets one table row per (trace, policy): requests per wall second and per CPU
second, and the key scope (how the policy's eviction is indexed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.config.policy import POLICIES
from cachepilot_sim.experiment.runner import run_cells

EXPERIMENTS = ("azure_conv", "mooncake_synthetic")
EXCLUDED = ("oracle",)  # the exact knapsack oracle: a cover problem per decision, by design
TARGET_REQ_PER_S = 5000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
    parser.add_argument("--policies", default="", help="comma-separated (default: all but oracle)")
    parser.add_argument("--limit", type=int, default=0, help="replay.limit (0: whole trace)")
    parser.add_argument("--out", type=Path, default=None, help="JSON results")
    parser.add_argument("--markdown", type=Path, default=None, help="markdown table")
    args = parser.parse_args()
    register_configs()
    import cachepilot_sim.policies  # noqa: F401  (registers every policy)

    policies = (
        args.policies.split(",")
        if args.policies
        else [p for p in POLICIES.names() if p not in EXCLUDED]
    )
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    results: list[dict[str, Any]] = []
    for experiment in args.experiments.split(","):
        for policy in policies:
            results.append(run_one(conf, experiment, policy, args.limit))
            r = results[-1]
            print(
                f"{experiment} {policy}: {r['requests']} requests in {r['wall_s']:.2f} s wall, "
                f"{r['cpu_s']:.2f} s CPU = {r['req_per_wall_s']:.0f} req/wall-s, "
                f"{r['req_per_cpu_s']:.0f} req/CPU-s (load {r['load_1min']:.1f})",
                flush=True,
            )
            write(args, results)  # after every cell: a long sweep that is stopped keeps its rows


def write(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """The JSON and markdown outputs asked for, with the run's metadata."""
    meta = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "commit": _commit(),
        "limit": args.limit,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_average_1_5_15_min_at_end": os.getloadavg(),
        "note": "per (trace, policy): trace read + simulation + per-request Parquet, in this "
        "process (one cell, no worker pool); the machine's 2 CPUs are shared with other jobs, "
        "so CPU seconds and the load average are recorded too",
    }
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(meta, results))


def run_one(conf: Path, experiment: str, policy: str, limit: int) -> dict[str, Any]:
    """One cell of `experiment` with `policy`, timed; its figures as a JSON-ready dict."""
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(
            compose(
                "config",
                overrides=[
                    f"+experiment={experiment}",
                    f"compare_policies=[{policy}]",
                    "seeds=1",
                    f"replay.limit={limit}",
                ],
            )
        )
    scope = getattr(POLICIES.entry(policy).factory, "key_scope", None)
    with tempfile.TemporaryDirectory() as out:
        load = os.getloadavg()[0]
        start, cpu_start = time.perf_counter(), time.process_time()
        cell = run_cells(cfg, Path(out))[0]
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "experiment": experiment,
        "policy": policy,
        "key_scope": str(scope.name) if scope is not None else "",
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "requests": cell["requests"],
        "completed": cell["completed"],
        "req_per_wall_s": round(cell["requests"] / wall, 1),
        "req_per_cpu_s": round(cell["requests"] / cpu, 1),
        "iterations": cell["iterations"],
        "trace_events": cell["events"],
        "simulated_s": cell["duration_s"],
        "load_1min": round(load, 2),
    }


def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The results as a markdown table (one row per trace and policy)."""
    load = ", ".join(f"{x:.1f}" for x in meta["load_average_1_5_15_min_at_end"])
    lines = [
        f"Measured {meta['date_utc']} UTC, commit {meta['commit']}, replay.limit={meta['limit']}, "
        f"load average at the end {load}.",
        "",
        "| trace | policy | key scope | requests | wall s | CPU s | req/wall-s | req/CPU-s | "
        f">= {TARGET_REQ_PER_S} | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        ok = "yes" if r["req_per_wall_s"] >= TARGET_REQ_PER_S else "no"
        lines.append(
            f"| {r['experiment']} | {r['policy']} | {r['key_scope']} | {r['requests']} | "
            f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['req_per_wall_s']:.0f} | "
            f"{r['req_per_cpu_s']:.0f} | {ok} | {r['load_1min']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
