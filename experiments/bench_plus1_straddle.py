"""perc_plus1's indexed decision when the need falls inside a size class (its worst case).

The session manager's path as `bench_eviction.py` drives it (the same entries, restore fixed while
idle, each victim replaced by a new idle entry), for needs of 64 MiB (a power of two: no class
straddles it) and 100, 1000, 3000 MiB (inside a class: `policies/plus1_index.py` scans it). Prints
µs per decision (including the adds), class heads read and entries keyed, per decision.

    PYTHONPATH=. python experiments/bench_plus1_straddle.py
"""

from __future__ import annotations

import time

from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.plus1_index import PlusOneIndex
from experiments.bench_eviction import Entries, _policy

DECISIONS = 100


def run(need_mib: int, n: int) -> str:
    """One row: `DECISIONS` decisions over n idle entries asking for `need_mib` MiB each."""
    policy, _ = _policy("perc_plus1")
    now = 2 * 10**9
    draws = Entries(n + 30 * DECISIONS, 1, now)
    index = CandidateIndex(policy, lambda e, offload: e.restore_us)  # type: ignore[arg-type]
    for i in range(n):
        e = draws.make(i, now)
        policy.on_release(e, now)  # type: ignore[attr-defined]
        index.add(e, now)
    spares = [draws.make(i, now) for i in range(n, n + 30 * DECISIONS)]
    need = need_mib << 20
    index.select(need, now, lambda e: e, -1, True)  # builds the index (setup)
    plus1 = index._timed[True]
    assert isinstance(plus1, PlusOneIndex)
    heads, keyed, victims = plus1.num_visits, plus1.num_keyed(), 0
    start = time.perf_counter()
    for k in range(DECISIONS):
        t = now + 1000 * (k + 1)
        chosen = index.select(need, t, lambda e: e, -1, True)
        victims += len(chosen)
        for e in chosen:
            index.discard(e.entry_id)
            new = spares.pop()
            new.last_used_us = t
            index.add(new, t)
    us = (time.perf_counter() - start) / DECISIONS * 1e6
    return (
        f"need {need_mib} MiB, {n} entries: {us:,.0f} µs/decision, "
        f"{(plus1.num_visits - heads) / DECISIONS:.1f} heads, "
        f"{(plus1.num_keyed() - keyed) / DECISIONS:.0f} keyed, {victims / DECISIONS:.2f} victims"
    )


def main() -> None:
    for need_mib in (64, 100, 1000, 3000):
        for n in (10_000, 100_000):
            print(run(need_mib, n), flush=True)


if __name__ == "__main__":
    main()
