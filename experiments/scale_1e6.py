"""Scale benchmark (not a test): wall time, CPU time and peak RSS of one synthetic run of N requests
(mixed_spike config, PERC, one seed, per-request table and trace written), measured from outside
by `/usr/bin/time -v`, with the load average before and after (the machine is shared).

    python experiments/scale_1e6.py 100000 1000000 [--out experiments/scale_1e6.json] [--no-nice]

Each N adds (or replaces) its entry in the JSON file; experiments/scale_1e6.md reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_harness import run_meta

ROOT = Path(__file__).resolve().parents[1]


def command(num_requests: int, out_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cachepilot_sim",
        "+experiment=mixed_spike",
        f"workload.num_requests={num_requests}",
        "seeds=1",
        "compare_policies=[perc]",
        f"hydra.run.dir={out_dir}",
    ]


def _clock_s(text: str) -> float:
    """`/usr/bin/time`'s elapsed time, `h:mm:ss` or `m:ss.ss`, in seconds."""
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def measure(num_requests: int, niced: bool = True) -> dict[str, Any]:
    """Run one case under `/usr/bin/time -v` (niced unless told not to) and read its figures."""
    before = list(os.getloadavg())
    uptime_before = _uptime()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "run"
        proc = subprocess.run(
            [*(["nice"] if niced else []), "/usr/bin/time", "-v", *command(num_requests, out_dir)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
        )
        cell = json.loads((out_dir / "metrics.json").read_text())["cells"][0]
        sizes = {p.name: p.stat().st_size for p in (out_dir / "requests").glob("*.parquet")}
    stats = dict(re.findall(r"^\s*(.+?): (.+)$", proc.stderr, re.MULTILINE))
    wall = _clock_s(stats["Elapsed (wall clock) time (h:mm:ss or m:ss)"])
    cpu = float(stats["User time (seconds)"]) + float(stats["System time (seconds)"])
    rss_mib = int(stats["Maximum resident set size (kbytes)"]) / 1024
    return {
        "num_requests": num_requests,
        "command": " ".join(command(num_requests, Path("OUT"))[1:]),
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mib": rss_mib,
        "wall_us_per_request": wall / num_requests * 1e6,
        "cpu_us_per_request": cpu / num_requests * 1e6,
        "load_avg_before": before,
        "load_avg_after": list(os.getloadavg()),
        "uptime_before": uptime_before,
        "uptime_after": _uptime(),
        "niced": niced,
        "completed": cell["completed"],
        "events": cell["events"],
        "simulated_s": cell["duration_s"],
        "requests_file_bytes": sizes,
    }


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("num_requests", type=int, nargs="+")
    parser.add_argument("--out", type=Path, default=None, help="add the figures to this JSON")
    parser.add_argument(
        "--no-nice", action="store_true", help="not niced (a machine busy with others' jobs)"
    )
    args = parser.parse_args()
    record: dict[str, Any] = {"runs": {}}
    if args.out is not None and args.out.is_file():
        record = json.loads(args.out.read_text())
    for n in args.num_requests:
        figures = run_meta() | measure(n, niced=not args.no_nice)
        print(json.dumps(figures, indent=1), flush=True)
        record["runs"][str(n)] = figures
        if args.out is not None:
            args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
