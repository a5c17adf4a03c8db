"""Cluster simulation speed (not a test): 64 replicas x 100,000 requests, wall seconds, simulated
requests per wall-second, SimPy events, peak memory. The load is mixed_spike's per GPU times the
number of replicas (session rate and session slots scaled), so every replica is as busy as the
single-GPU headline; the router is session_affinity (a synthetic session workload needs a sticky
router). Each case runs in a fresh subprocess so its peak RSS is its own.

    python experiments/bench_cluster.py [--replicas 64] [--requests 100000] [--router NAME]
        [--out experiments/bench_cluster.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import simpy

BASE_RATE_PER_S = 0.25  # conf/workload/mixed.yaml, one GPU
BASE_SESSIONS = 48  # conf/experiment/mixed_spike.yaml, one GPU


def overrides(replicas: int, requests: int, router: str) -> list[str]:
    """mixed_spike on `replicas` GPUs: the per-GPU load of the headline, one seed, one policy."""
    return [
        "+experiment=mixed_spike",
        f"cluster.replicas={replicas}",
        f"router={router}",
        f"workload.num_requests={requests}",
        f"workload.session_rate_per_s={BASE_RATE_PER_S * replicas}",
        f"workload.max_active_sessions={BASE_SESSIONS * replicas}",
        f"workload.spike_at_request={requests * 3 // 10}",
        "seeds=1",
        "compare_policies=[perc]",
    ]


def run_case(args: list[str]) -> dict[str, float]:
    """Runs in the child process: compose, run one cell (files written), time it, count events."""
    from hydra import compose, initialize_config_dir

    from cachepilot_sim.config import register_configs, to_config
    from cachepilot_sim.experiment.runner import run_cells

    num_events = 0
    schedule = simpy.Environment.schedule

    def counting(self, event, priority=1, delay=0):  # noqa: ANN001, ANN202
        nonlocal num_events
        num_events += 1
        return schedule(self, event, priority, delay)

    simpy.Environment.schedule = counting  # type: ignore[method-assign]
    register_configs()
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(compose("config", overrides=args))
    with tempfile.TemporaryDirectory() as out:
        start, cpu0 = time.perf_counter(), time.process_time()
        (cell,) = run_cells(cfg, Path(out))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {
        "replicas": cell["cluster_replicas"],
        "simulated_requests": cell["requests"],
        "completed": cell["completed"],
        "wall_s": wall,
        # CPU seconds of this process: on a shared machine wall time also counts other users.
        "cpu_s": cpu,
        "requests_per_wall_s": cell["requests"] / wall,
        "requests_per_cpu_s": cell["requests"] / cpu,
        "simpy_events": num_events,
        "events_per_wall_s": num_events / wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "simulated_s": cell["duration_s"],
        "ttft_p99_s": cell["ttft_p99_s"],
        "load_imbalance": cell["load_imbalance"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--router", default="session_affinity")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_case(args.child)))
        return
    case = overrides(args.replicas, args.requests, args.router)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *case], capture_output=True, text=True, check=True
    )
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    record = {
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
        "commit": commit,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_avg_1_5_15": list(os.getloadavg()),
        "overrides": case,
        **figures,
    }
    print(json.dumps(record, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
