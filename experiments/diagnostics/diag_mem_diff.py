"""Memory diagnosis (not a test): what a mixed_spike/PERC run allocates between two points and
still holds, by allocation site (tracemalloc, two frames), without the event trace (a run
without a trace folder would keep the trace in memory). GC-untracked objects (tuples of ints,
ints) count too, which `diag_mem_growth.py`'s object census misses.

    PYTHONPATH=. python experiments/diagnostics/diag_mem_diff.py 30000 90000

prints RSS and the session manager's record count at both points, then the 25 sites whose live
bytes grew most between them.
"""

import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.sim import Simulation, build


def rss_mib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def mixed_spike_sim(num_requests: int, out: Path) -> Simulation:
    """`mixed_spike`, PERC, one seed, `num_requests` requests, no event trace; the per-request
    table written under `out` (as the CLI writes it)."""
    register_configs()
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    overrides = [
        "+experiment=mixed_spike",
        f"workload.num_requests={num_requests}",
        "seeds=1",
        "trace.enabled=false",
    ]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(compose("config", overrides=overrides))
    return build(cfg, requests_path=out / "requests.parquet")


def main() -> None:
    first, second = int(sys.argv[1]), int(sys.argv[2])
    marks, snaps = [first, second], []
    tracemalloc.start(2)
    with tempfile.TemporaryDirectory() as out:
        sim = mixed_spike_sim(second * 2, Path(out))

        def probe(_num_events: int) -> None:
            if not marks or sim.clients.num_ended < marks[0]:
                return
            marks.pop(0)
            gc.collect()
            snaps.append(tracemalloc.take_snapshot())
            records = len(getattr(sim.kv, "sessions", ()))
            print(f"at {sim.clients.num_ended} requests: RSS {rss_mib()} MiB, {records} records")
            if marks:
                return
            for stat in snaps[1].compare_to(snaps[0], "traceback")[:25]:
                print(f"{stat.size_diff / 2**20:8.2f} MiB {stat.count_diff:9d} objects")
                for line in stat.traceback.format()[-4:]:
                    print("     ", line)
            raise SystemExit(0)

        sim.run(on_progress=probe, every_events=20_000)


if __name__ == "__main__":
    main()
