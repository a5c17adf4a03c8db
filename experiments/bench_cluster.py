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
from pathlib import Path
from typing import Any

from bench_harness import child_or_none, run_child, run_meta, time_case

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


def run_case(args: list[str]) -> dict[str, Any]:
    """Runs in the child process: one cell (files written), timed (bench_harness.time_case), with
    the cluster's figures."""
    (cell,), figures = time_case(args)
    return figures | {
        "replicas": cell["cluster_replicas"],
        "completed": cell["completed"],
        "simulated_s": cell["duration_s"],
        "ttft_p99_s": cell["ttft_p99_s"],
        "load_imbalance": cell["load_imbalance"],
    }


def main() -> None:
    child = child_or_none()
    if child is not None:
        print(json.dumps(run_case(child)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--router", default="session_affinity")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    case = overrides(args.replicas, args.requests, args.router)
    figures = run_child(__file__, case)
    record = run_meta() | {"overrides": case, **figures}
    print(json.dumps(record, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
