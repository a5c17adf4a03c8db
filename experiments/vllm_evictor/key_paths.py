"""Where PERC's vLLM adapter should switch from Python keys to NumPy keys: CPU µs to rank n
sessions and take the first victim with each path of `SessionArrays` (perc_chunks.py), least of
15 timings of 2,000 decisions each.

Sessions: last use uniform over the last 600 s, a quarter without a gap EMA of their own, the
others 1-200 s, restore 1e3-1e6 µs, 1-50 chunks of 256 tokens.

    python experiments/vllm_evictor/key_paths.py
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from functools import partial

import numpy as np

from cachepilot_sim.integrations.vllm.chunks import _Session
from cachepilot_sim.integrations.vllm.perc_chunks import SessionArrays
from cachepilot_sim.policies import CacheEntry

DELTA_US, POPULATION_GAP_US, NOW_US = 30e6, 20e6, 10**10
SIZES = (4, 8, 16, 24, 32, 48, 64, 128, 256)


def arrays_of(n: int) -> SessionArrays:
    rng = np.random.default_rng(n)
    arrays = SessionArrays()
    arrays.refresh_population(POPULATION_GAP_US)
    for i in range(n):
        entry = CacheEntry(i, i, 0, 0, 0, 0, 0, 0, NOW_US - int(rng.integers(0, 600_000_000)))
        entry.gap_ema_us = -1.0 if rng.random() < 0.25 else float(rng.uniform(1e6, 2e8))
        size = float(rng.integers(1, 51) * 256)
        arrays.put(_Session(entry), float(rng.uniform(1e3, 1e6)), size)
    return arrays


def python_first(arrays: SessionArrays) -> int:
    """As PercChunkPolicy._ranked below `vectorise_from`: every key, sorted."""
    keyed = arrays.keys(NOW_US, DELTA_US)
    keyed.sort()
    return keyed[0][2]


def numpy_first(arrays: SessionArrays) -> int:
    """As PercChunkPolicy._ranked from `vectorise_from` on: the maximum of the negated keys,
    then the next one (the tie check)."""
    neg, _ = arrays.negated_keys(NOW_US, DELTA_US)
    slot = int(neg.argmax())
    top = neg.item(slot)
    neg[slot] = -np.inf
    assert neg.item(int(neg.argmax())) != top
    return slot


def least_us(first: Callable[[SessionArrays], int], arrays: SessionArrays) -> float:
    return min(timeit.repeat(partial(first, arrays), number=2000, repeat=15)) / 2000 * 1e6


def main() -> None:
    print("| sessions | Python keys, µs | NumPy keys, µs |")
    print("|---:|---:|---:|")
    for n in SIZES:
        arrays = arrays_of(n)
        assert python_first(arrays) == numpy_first(arrays)  # no ties here: same first victim
        us = [least_us(f, arrays) for f in (python_first, numpy_first)]
        print(f"| {n} | {us[0]:.1f} | {us[1]:.1f} |")


if __name__ == "__main__":
    main()
