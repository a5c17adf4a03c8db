"""Memory diagnosis (not a test): RSS of one mixed_spike/PERC run every 10^6 SimPy events, with
the requests ended and the session manager's record count, after `malloc_trim(0)` (so that
memory glibc could give back does not count), without the event trace.

    PYTHONPATH=. python experiments/diagnostics/diag_mem_curve.py 300000
"""

import ctypes
import resource
import sys
import tempfile
from pathlib import Path

from diag_mem_diff import mixed_spike_sim, rss_mib

EVERY = 1_000_000


def main() -> None:
    libc = ctypes.CDLL("libc.so.6")
    with tempfile.TemporaryDirectory() as out:
        sim = mixed_spike_sim(int(sys.argv[1]), Path(out))

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
