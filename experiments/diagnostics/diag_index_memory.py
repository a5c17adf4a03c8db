"""Memory diagnosis (not a test): the median cost of each `bisect_left` PERC's exact index makes
(`policies/perc_index.py` and the `SortedList`s it holds) during 2,000 decisions over n idle
sessions, in `bench_eviction.py`'s steady state. The comparisons per call grow with log n; the
cost per call, measured here with a timer around each call, shows how much of the growth of a
decision from 10^3 to 10^6 entries is cold memory rather than work. Medians, since a mean on a
shared machine is dominated by the process being descheduled.

    PYTHONPATH=.:experiments python experiments/diagnostics/diag_index_memory.py 1000
    PYTHONPATH=.:experiments python experiments/diagnostics/diag_index_memory.py 1000000
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import sortedcontainers.sortedlist as sortedlist_module
from bench_eviction import BLOCK_BYTES, SPARE, Entries, _policy

import cachepilot_sim.policies.perc_index as perc_index_module
from cachepilot_sim.policies.candidates import CandidateIndex

DECISIONS = 2_000


def main() -> None:
    n = int(sys.argv[1])
    policy, _ = _policy("perc")
    now = 2 * 10**9
    draws = Entries(n + SPARE, 1, now)
    index = CandidateIndex(policy, lambda e, offload: e.restore_us)  # type: ignore[arg-type]
    for i in range(n):
        e = draws.make(i, now)
        policy.on_release(e, now)  # type: ignore[attr-defined]
        index.add(e, now)
    spares = [draws.make(i, now) for i in range(n, n + SPARE)]

    def decide(k: int) -> None:  # as bench_eviction.bench_entries
        t = now + 1000 * (k + 1)
        victims = index.select(BLOCK_BYTES, t, lambda e: e, -1, True)
        for e in victims:
            policy.on_evict(e, t)  # type: ignore[attr-defined]
            index.discard(e.entry_id)
        for _ in victims:
            e = spares.pop()
            e.last_used_us = t
            policy.on_release(e, t)  # type: ignore[attr-defined]
            index.add(e, t)

    decide(0)  # builds the time index from every idle entry
    gc.collect()
    gc.freeze()
    calls: dict[tuple[str, int], list[int]] = {}

    def timed(name: str, module: Any) -> None:
        inner: Callable[..., int] = module.bisect_left

        def wrapper(a: Any, x: Any, *args: Any) -> int:
            start = time.perf_counter_ns()
            out = inner(a, x, *args)
            calls.setdefault((name, len(a) // 100 * 100), []).append(time.perf_counter_ns() - start)
            return out

        module.bisect_left = wrapper

    timed("perc_index", perc_index_module)
    timed("SortedList", sortedlist_module)
    for k in range(1, DECISIONS + 1):
        decide(k)
    print(f"{n} idle entries, {DECISIONS} decisions: bisect_left by caller and list length")
    print("| caller | list length | calls | median µs | mean µs |")
    print("|---|---:|---:|---:|---:|")
    for (name, length), ns in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:10]:
        print(
            f"| {name} | {length}-{length + 99} | {len(ns)} | {statistics.median(ns) / 1e3:.2f} "
            f"| {sum(ns) / len(ns) / 1e3:.2f} |"
        )


if __name__ == "__main__":
    main()
