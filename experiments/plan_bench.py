"""Speed of the capacity planner: one plan over the Azure conversation trace sample, timed.

    CACHEPILOT_TRACES_DIR=/work/shared/traces python experiments/plan_bench.py [--config ...]

Runs `cachepilot-sim plan` once, then again into a second folder to check that the answer is
identical, and writes experiments/plan_bench.json: configurations simulated, wall seconds of each
run, date, commit, CPU count and the load average before and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "config": Path(args.config).name,
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "runs": [],
    }
    for name in ("a", "b"):
        t0 = time.perf_counter()
        assert plan_tool.main(["--config", args.config, "--out", f"{args.out}/{name}"]) == 0
        wall = time.perf_counter() - t0
        answer = json.loads(Path(f"{args.out}/{name}/plan.json").read_text())
        record["runs"].append({"wall_s": round(wall, 1), "simulated": answer["num_simulated"]})
    a, b = (Path(f"{args.out}/{n}/plan.json").read_bytes() for n in ("a", "b"))
    record["identical_on_rerun"] = a == b
    record["load_after"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
