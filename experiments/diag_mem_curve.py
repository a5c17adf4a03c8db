"""Memory diagnosis (not a test): RSS of one mixed_spike/PERC run every 10^6 SimPy events, with
the requests ended and the session manager's record count, after `malloc_trim(0)` (so that
memory glibc could give back does not count), without the event trace.

    PYTHONPATH=. python experiments/diag_mem_curve.py 300000
"""

import ctypes
import resource
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.sim import build

EVERY = 1_000_000


def rss_mib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def main() -> None:
    register_configs()
    conf = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "conf"
    overrides = [
        "+experiment=mixed_spike",
        f"workload.num_requests={int(sys.argv[1])}",
        "seeds=1",
        "trace.enabled=false",
    ]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(compose("config", overrides=overrides))
    libc = ctypes.CDLL("libc.so.6")
    with tempfile.TemporaryDirectory() as out:
        sim = build(cfg, requests_path=Path(out) / "requests.parquet")

        def probe(num_events: int) -> None:
            libc.malloc_trim(0)
            records = len(getattr(sim.kv, "sessions", ()))
            print(
                f"events {num_events}: {sim.clients.num_ended} requests ended, "
                f"{records} records, RSS {rss_mib()} MiB",
                flush=True,
            )

        sim.run(on_progress=probe, every_events=EVERY)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"peak RSS {peak} MiB (with the end-of-run Parquet combine)")


if __name__ == "__main__":
    main()
