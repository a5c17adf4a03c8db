"""Simulation speed benchmark (not a test): simulated requests per wall-second, events per second,
peak memory; for the mixed_spike experiment (5 seeds x 3 policies, results written) and for one
100,000-request run. Each case runs in a fresh subprocess so its peak RSS is its own.

    python experiments/bench_sim_speed.py [--out experiments/bench_sim_speed.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench_harness import child_or_none, run_child, run_meta, time_case

CASES = {
    "mixed_spike (1000 req x 5 seeds x 3 policies, files written), one worker per core": [],
    "mixed_spike, the same, all cells in one process (jobs=1)": ["jobs=1"],
    "100k requests (mixed_spike config, perc, 1 seed, files written)": [
        "workload.num_requests=100000",
        "seeds=1",
        "compare_policies=[perc]",
    ],
}


def main() -> None:
    overrides = child_or_none()
    if overrides is not None:
        print(json.dumps(time_case(["+experiment=mixed_spike", *overrides])[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    results = {}
    for name, case in CASES.items():
        r = results[name] = run_child(__file__, case)
        events = r["events_per_wall_s"]
        print(
            f"{name}: {r['simulated_requests']} requests in {r['wall_s']:.2f} s = "
            f"{r['requests_per_wall_s']:,.0f} req/s, "
            + (f"{events:,.0f} SimPy events/s, " if events is not None else "")
            + f"peak RSS {r['peak_rss_mib']:.0f} MiB (this process)"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"meta": run_meta(), "results": results}
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
