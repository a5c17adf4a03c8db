"""What exact ITL costs (not a test): CPU seconds of one mixed_spike cell (perc, seed 0, no trace)
with the engine's inter-token gap counting on, and off (EngineStats' three recording methods
replaced by no-ops), alternated; median over repeats.

    python experiments/bench_itl_overhead.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import resource
import statistics
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.components.engine_stats import EngineStats
from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.sim import build


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    register_configs()
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    overrides = ["+experiment=mixed_spike", "seeds=1", "trace.enabled=false"]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(compose("config", overrides=overrides)).sim_for("perc", 0)
    real = (EngineStats.add_gaps, EngineStats.add_run, EngineStats.resumed)
    noop = (lambda self, *a: None, lambda self, ends, n: len(ends), lambda self, *a: None)
    times: dict[str, list[float]] = {"off": [], "on": []}
    build(cfg).run()  # warm-up
    for _ in range(args.repeats):
        for name, methods in (("off", noop), ("on", real)):
            EngineStats.add_gaps, EngineStats.add_run, EngineStats.resumed = methods  # type: ignore[method-assign, assignment]
            start = cpu_s()
            build(cfg).run()
            times[name].append(cpu_s() - start)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print({k: [round(t, 3) for t in v] for k, v in times.items()})
    print(f"median off {off:.3f} s, on {on:.3f} s ({100 * (on / off - 1):+.1f} %)")


if __name__ == "__main__":
    main()
