"""Would a lazily re-ranked top be exact and cheap for PERC's vLLM adapter? At each decision of
the evictor benchmark (seed 0), how many sessions could still be among the two first victims
within the next H seconds: those whose key at now + H (a lower bound: the key only decays while
its inputs stay put) is at most the second smallest key now. Also the sessions without a gap EMA
of their own, whose key moves with the population's EMA (at every return of any session), and
the time between decisions.

    PYTHONPATH=$PWD:<vllm site> python experiments/vllm_evictor/bound_candidates.py 1000
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.integrations.vllm import perc_chunks
from cachepilot_sim.integrations.vllm.evictor_bench import load_workload, run_policy, vllm_setup
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.replay import ReplayConfig, make_turns

HORIZONS_S = (1, 5, 20, 60)
rows: list[list[int]] = []
times_us: list[int] = []


def keys(arrays: perc_chunks.SessionArrays, now_us: float, delta_us: float) -> np.ndarray:
    n = arrays.num_slots
    last_used, base, cost, size = (v[:n] for v in arrays.views[:4])
    return -np.expm1(-delta_us / np.maximum(now_us - last_used, base)) * cost / size


def main(decisions: int) -> None:
    ranked = perc_chunks.PercChunkPolicy._ranked

    def probed(self: Any, now: int, held: Any) -> Iterator[Any]:
        sessions = ranked(self, now, held)
        first = next(sessions, None)  # the arrays are flushed now
        if first is None:
            return
        arrays, delta = self.arrays, self.estimator.delta_us
        if arrays.num_slots > 1:
            second = np.partition(keys(arrays, now, delta), 1)[1]
            row = [arrays.num_slots, arrays.num_without_gap]
            for h in HORIZONS_S:
                row.append(int((keys(arrays, now + h * 1e6, delta) <= second).sum()))
            rows.append(row)
            times_us.append(now)
        yield first
        yield from sessions

    perc_chunks.PercChunkPolicy._ranked = probed  # type: ignore[method-assign]
    workload = load_workload(CONF_DIR / "workload" / "mixed.yaml", 1.0)
    types, factories = vllm_setup(PercParams(delta_s=30.0, tokens_per_chunk=256))
    turns = make_turns(workload, ReplayConfig(256, 20.0, 3000, 0))
    _, cut = run_policy(factories["lru"], types, turns, 2000, 256, decisions)
    run_policy(factories["perc"], types, turns[:cut], 2000, 256)
    table = np.asarray(rows, dtype=np.float64)
    heads = ["sessions", "without own gap"] + [f"candidates, H = {h} s" for h in HORIZONS_S]
    print("| | " + " | ".join(heads) + " |\n|---|" + "---:|" * len(heads))
    for name, values in (("mean", table.mean(axis=0)), ("p90", np.percentile(table, 90, axis=0))):
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
    gaps = np.diff(np.asarray(times_us)) / 1e6
    print(f"\ntime between decisions: mean {gaps.mean():.2f} s, median {np.median(gaps):.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]))
