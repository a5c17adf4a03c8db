"""PERC's first victim among n idle sessions: policies/perc_index.py's exact index against the
vLLM adapter's arrays as they were until 2026-12-02 morning (perc_chunks.PercChunkPolicy at
2d8c0e4: PercPolicy.order's lines over arrays kept per session, then a lexsort), CPU µs per
decision on random sessions.

Needs `cachepilot_sim/policies/perc_index.py` (branch pidx). Sessions: last use uniform over the
last 600 s, 30 % without a gap of their own, the others a gap EMA of 1-200 s, restore 1e3-1e6 µs,
1-50 chunks of 256 tokens. A decision advances time by 1 µs; the index pops the smallest and takes
it back (n stays), the arrays rank all n (lexsort up to 512 sessions, else one minimum).

    python experiments/vllm_evictor/index_vs_arrays.py
"""

from __future__ import annotations

import time

import numpy as np

from cachepilot_sim.policies.reuse import GapEstimator

DELTA_US, POPULATION_GAP_US = 30e6, 20e6
SORT_UP_TO = 512  # PercChunkPolicy.sort_up_to_sessions at 2d8c0e4


def sessions(n: int, now: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(n)
    last = (now - rng.integers(0, 600_000_000, n)).astype(np.float64)
    gap = np.where(rng.random(n) < 0.3, -1.0, rng.uniform(1e6, 2e8, n))
    cost = rng.uniform(1e3, 1e6, n)
    size = rng.integers(1, 51, n) * 256.0
    return last, gap, cost, size, np.arange(n, dtype=np.int64)


def index_us(n: int, reps: int) -> float:
    # Imported here: the module comes with branch pidx (a bare import would sort differently
    # for ruff before and after that merge).
    from cachepilot_sim.policies import perc_index

    now = 10**10
    last, gap, cost, size, _ = sessions(n, now)
    index = perc_index.PercIndex(DELTA_US)
    for i in range(n):
        index.add(i, int(last[i]), float(gap[i]), float(cost[i]), float(size[i]))
    t0 = time.thread_time_ns()
    for r in range(reps):
        i = index.pop_min(now + r, POPULATION_GAP_US)
        assert i is not None
        index.add(i, int(last[i]), float(gap[i]), float(cost[i]), float(size[i]))
    return (time.thread_time_ns() - t0) / reps / 1e3


def arrays_us(n: int, reps: int) -> float:
    now = 10**10
    last, gap, cost, size, ids = sessions(n, now)
    est = GapEstimator(0.3, POPULATION_GAP_US, DELTA_US)
    t0 = time.thread_time_ns()
    for r in range(reps):
        score = est.resume_probabilities(gap, np.subtract(now + r, last)) * cost / size
        if n <= SORT_UP_TO:
            np.lexsort((ids, score)).tolist()
        else:
            ties = np.flatnonzero(score == score.min())
            int(ties[0] if ties.shape[0] == 1 else ties[np.argmin(ids[ties])])
    return (time.thread_time_ns() - t0) / reps / 1e3


def main() -> None:
    print("| sessions | PercIndex pop + re-add, µs | arrays, µs |")
    print("|---:|---:|---:|")
    for n in (100, 1_000, 4_000, 16_000):
        reps = max(20, 20_000 // n)
        print(f"| {n} | {index_us(n, reps):.1f} | {arrays_us(n, reps):.1f} |")


if __name__ == "__main__":
    main()
