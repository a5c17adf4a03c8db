"""Simulation speed benchmark (not a test): simulated requests per wall-second, events per second,
peak memory; for the mixed_spike experiment (5 seeds x 3 policies, results written) and for one
100,000-request run. Each case runs in a fresh subprocess so its peak RSS is its own.

    python experiments/bench_sim_speed.py [--out experiments/bench_sim_speed.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import simpy

CASES = {
    "mixed_spike (1000 req x 5 seeds x 3 policies, files written), one worker per core": [],
    "mixed_spike, the same, all cells in one process (jobs=1)": ["jobs=1"],
    "100k requests (mixed_spike config, perc, 1 seed, files written)": [
        "workload.num_requests=100000",
        "seeds=1",
        "compare_policies=[perc]",
    ],
}


def run_case(overrides: list[str]) -> dict[str, float]:
    """Runs in the child process: compose the config, run it, time it, count SimPy events."""
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
        cfg = to_config(compose("config", overrides=["+experiment=mixed_spike", *overrides]))
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        cells = run_cells(cfg, Path(out))
        wall = time.perf_counter() - start
    num_requests = sum(c["requests"] for c in cells)
    in_process = cfg.jobs == 1 or len(cells) == 1
    return {
        "runs": len(cells),
        "simulated_requests": num_requests,
        "wall_s": wall,
        "requests_per_wall_s": num_requests / wall,
        # SimPy events are counted in this process only, not in cells on worker processes.
        "simpy_events": num_events if in_process else None,
        "events_per_wall_s": num_events / wall if in_process else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_case(args.child)))
        return
    results = {}
    for name, overrides in CASES.items():
        proc = subprocess.run(
            [sys.executable, __file__, "--child", *overrides],
            capture_output=True,
            text=True,
            check=True,
        )
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[name]
        events = r["events_per_wall_s"]
        print(
            f"{name}: {r['simulated_requests']} requests in {r['wall_s']:.2f} s = "
            f"{r['requests_per_wall_s']:,.0f} req/s, "
            + (f"{events:,.0f} SimPy events/s, " if events is not None else "")
            + f"peak RSS {r['peak_rss_mib']:.0f} MiB (this process)"
        )
    if args.out:
        meta = {
            "date": date.today().isoformat(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "cpus": __import__("os").cpu_count(),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
