"""What live metrics cost (not a test): CPU seconds of the same cells with the simulated-time
publisher on (`telemetry.live_metrics_every_s=1`, metrics.prom written) and off (`=0`), in one
process (jobs=1), alternating on/off so machine load hits both alike; median over repeats. CPU
time (getrusage, this process) rather than wall time: the machine is shared.

    python experiments/bench_live_overhead.py [--experiment smoke] [--repeats 5] [overrides...]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from hydra import compose, initialize_config_dir
from rich.console import Console

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.experiment.runner import run_cells
from cachepilot_sim.experiment.telemetry import RunMonitor


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one_run(experiment: str, every_s: float, overrides: list[str]) -> float:
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(
            compose(
                "config",
                overrides=[
                    f"+experiment={experiment}",
                    "jobs=1",
                    "telemetry.progress=false",
                    f"telemetry.live_metrics_every_s={every_s}",
                    *overrides,
                ],
            )
        )
    with tempfile.TemporaryDirectory() as out:
        monitor = RunMonitor(cfg.telemetry, Console(file=io.StringIO()))
        start = cpu_s()
        cells = run_cells(cfg, Path(out), monitor)
        monitor.close(cells, Path(out))
        return cpu_s() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--experiment", default="mixed_spike")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    register_configs()
    one_run(args.experiment, 0.0, args.overrides)  # warm-up: imports, caches
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.repeats):
        times["off"].append(one_run(args.experiment, 0.0, args.overrides))
        times["on"].append(one_run(args.experiment, 1.0, args.overrides))
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, load {os.getloadavg()[0]:.1f}")
    print(f"+experiment={args.experiment} jobs=1 {' '.join(args.overrides)}")
    print(f"CPU s, off: {[round(t, 2) for t in times['off']]}")
    print(f"CPU s, on:  {[round(t, 2) for t in times['on']]}")
    print(f"median off {off:.2f} s, on {on:.2f} s, overhead {100 * (on / off - 1):+.1f} %")


if __name__ == "__main__":
    main()
