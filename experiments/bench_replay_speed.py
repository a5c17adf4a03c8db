"""Replay speed (not a test): wall seconds to replay a whole trace once per registered policy,
through `run_cells` as the CLI does (trace rows recorded and the per-request Parquet written), with
the full Azure 2023 conversation trace (19,366 requests) by default.

    python experiments/bench_replay_speed.py [--experiment azure_conv] [--policies a,b]
        [--out FILE.json]

Reads the trace from $CACHEPILOT_TRACES_DIR (default ../shared/traces), like the experiment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from datetime import date
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.experiment.runner import run_cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="azure_conv")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--policies", default="", help="comma-separated (default: the experiment's)"
    )
    args = parser.parse_args()
    register_configs()
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(compose("config", overrides=[f"+experiment={args.experiment}"]))
    results = {}
    for policy in args.policies.split(",") if args.policies else cfg.policy_names():
        one = to_config(compose_one(conf, args.experiment, policy))
        with tempfile.TemporaryDirectory() as out:
            start, cpu_start = time.perf_counter(), time.process_time()
            cell = run_cells(one, Path(out))[0]
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        results[policy] = {
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "requests": cell["requests"],
            "completed": cell["completed"],
            "iterations": cell["iterations"],
            "trace_events": cell["events"],
            "simulated_s": cell["duration_s"],
        }
        print(
            f"{args.experiment} {policy}: {cell['requests']} requests replayed in {wall:.2f} s "
            f"wall, {cpu:.2f} s CPU ({cell['duration_s']:.0f} s simulated, "
            f"{cell['iterations']} iterations)"
        )
    if args.out:
        meta = {
            "date": date.today().isoformat(),
            "experiment": args.experiment,
            "trace": cfg.replay.path,
            "machine": platform.machine(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "load_average_1_5_15_min": os.getloadavg(),
            "note": "per policy: trace read + simulation + per-request Parquet, in this "
            "process (one cell, no worker pool); the machine's 2 CPUs are shared "
            "with other jobs, so CPU seconds and the load average are recorded too",
        }
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


def compose_one(conf: Path, experiment: str, policy: str):  # noqa: ANN201
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(
            "config",
            overrides=[f"+experiment={experiment}", f"compare_policies=[{policy}]", "seeds=1"],
        )


if __name__ == "__main__":
    main()
