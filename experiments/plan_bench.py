"""Speed of the capacity planner: one plan over the Azure conversation trace sample, timed.

    CACHEPILOT_TRACES_DIR=/work/shared/traces python experiments/plan_bench.py [--config ...]
        [--runs 2] [--json FILE] [key=value ...]

Runs `cachepilot-sim plan` once, then again into a second folder to check that the answer is
identical (`--runs 1`: once), and writes experiments/plan_bench.json (or `--json`): configurations
simulated, wall seconds of each run, date, commit, the command, CPU count, the load average and
`uptime` before and after (the machine is shared). Trailing key=value words override the plan
config, as `cachepilot-sim plan` takes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from cachepilot_sim.tools import plan as plan_tool

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parent / "cachepilot_sim" / "conf" / "plan" / "azure_conv_sample_x10.yaml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(DEFAULT))
    ap.add_argument("--out", default="/tmp/plan_bench")
    ap.add_argument("--json", default=str(HERE / "plan_bench.json"))
    ap.add_argument("--runs", type=int, default=2, help="2: rerun and compare the answers")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the plan config")
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "command": " ".join(["plan_bench.py", *sys.argv[1:]]),
        "config": Path(args.config).name,
        "overrides": args.overrides,
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "uptime_before": _uptime(),
        "runs": [],
    }
    names = ("a", "b")[: max(1, min(args.runs, 2))]
    for name in names:
        t0 = time.perf_counter()
        argv = ["--config", args.config, "--out", f"{args.out}/{name}", *args.overrides]
        assert plan_tool.main(argv) == 0
        wall = time.perf_counter() - t0
        answer = json.loads(Path(f"{args.out}/{name}/plan.json").read_text())
        record["runs"].append({"wall_s": round(wall, 1), "simulated": answer["num_simulated"]})
    if len(names) == 2:
        a, b = (Path(f"{args.out}/{n}/plan.json").read_bytes() for n in names)
        record["identical_on_rerun"] = a == b
    record["load_after"] = os.getloadavg()
    record["uptime_after"] = _uptime()
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


if __name__ == "__main__":
    main()
