"""Engine-loop A/B (not a test): CPU seconds, SimPy events and process resumes per simulated
request, for the same cases on one or more checkouts, interleaved (each case in a fresh process
per checkout, round after round, so that the shared machine's load falls on both sides alike),
with the date, each checkout's commit, `uptime` before and after every run, and the command.

    python experiments/bench_engine_loop.py [--checkout DIR ...] [--rounds 3]
        [--cases azure_conv,mixed_spike_2e4] [--out FILE.json]

Default checkout: this one. A checkout that is not a git work tree (a `git archive` of the
commit before a change, say) names its commit in a file `COMMIT` at its root. A case's time is
`run_cells` as the CLI runs a cell (trace read, simulation, per-request Parquet written) in the
checkout's own code (`experiments/bench_harness.py`'s `time_case`). Traces are read from
$CACHEPILOT_TRACES_DIR, as the experiments read them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = {
    "azure_conv": ["+experiment=azure_conv", "compare_policies=[lru]", "seeds=1"],
    "mixed_spike_2e4": [
        "+experiment=mixed_spike",
        "workload.num_requests=20000",
        "seeds=1",
        "compare_policies=[perc]",
    ],
    "mixed_spike_1e5": [
        "+experiment=mixed_spike",
        "workload.num_requests=100000",
        "seeds=1",
        "compare_policies=[perc]",
    ],
}
CHILD = (
    "import json, sys; sys.path.insert(0, 'experiments'); from bench_harness import time_case; "
    "print(json.dumps(time_case(sys.argv[1:])[1]))"
)


def commit_of(checkout: Path) -> str:
    """The checkout's commit: git's short hash, else its COMMIT file, else 'unknown'."""
    proc = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        dirty = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return proc.stdout.strip() + (" (uncommitted changes)" if dirty else "")
    marker = checkout / "COMMIT"
    return marker.read_text().strip() if marker.exists() else "unknown"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def run_case(checkout: Path, overrides: list[str]) -> dict[str, Any]:
    """One case in a fresh process of `checkout`'s code; its figures and the command."""
    before = uptime()
    env = os.environ | {"PYTHONPATH": str(checkout)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *overrides],
        capture_output=True,
        text=True,
        check=True,
        cwd=checkout,
        env=env,
    )
    figures = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    n = figures["simulated_requests"]
    return {
        "uptime_before": before,
        "uptime_after": uptime(),
        "cpu_s": round(figures["cpu_s"], 3),
        "wall_s": round(figures["wall_s"], 3),
        "requests": n,
        "req_per_cpu_s": round(n / figures["cpu_s"], 1),
        "cpu_us_per_request": round(figures["cpu_s"] / n * 1e6, 1),
        "simpy_events_per_request": round(figures["simpy_events"] / n, 3),
        "process_resumes_per_request": round(figures["process_resumes"] / n, 3),
        "peak_rss_mib": round(figures["peak_rss_mib"], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", action="append", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="azure_conv,mixed_spike_2e4")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args()
    checkouts = [c.resolve() for c in (args.checkout or [HERE.parent])]
    record: dict[str, Any] = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "checkouts": {str(c): commit_of(c) for c in checkouts},
        "cases": {name: CASES[name] for name in args.cases.split(",")},
        "runs": [],
    }
    for rnd in range(args.rounds):
        order = checkouts if rnd % 2 == 0 else checkouts[::-1]  # alternate who goes first
        for name in args.cases.split(","):
            for checkout in order:
                r = {"round": rnd, "case": name, "checkout": str(checkout)}
                r |= run_case(checkout, CASES[name])
                record["runs"].append(r)
                print(
                    f"{name} {record['checkouts'][str(checkout)]}: {r['requests']} requests, "
                    f"{r['cpu_s']:.2f} CPU s = {r['req_per_cpu_s']:,.0f} req/CPU-s, "
                    f"{r['simpy_events_per_request']:.2f} events and "
                    f"{r['process_resumes_per_request']:.2f} resumes a request "
                    f"({r['uptime_after'].split('load average: ')[-1]})",
                    flush=True,
                )
                if args.out:  # after every run: a long A/B that is stopped keeps its rows
                    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
