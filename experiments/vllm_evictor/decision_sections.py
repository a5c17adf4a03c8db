"""Where a PERC decision's CPU µs go in the evictor benchmark: wall time (perf_counter) around the
parts of `evict`, per decision the least over R replays of the same op stream (so that other
load is filtered out), averaged over decisions and seeds. The timers wrap private methods of
`SessionChunkPolicy` / `PercChunkPolicy`, so figures include their own overhead (~0.2 µs each)
and run on any version of them since 2026-12-02 (older ones had a separate `_drop`).

    PYTHONPATH=$PWD:<vllm site> python experiments/vllm_evictor/decision_sections.py 1000 5 0,1,2
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.integrations.vllm import chunks, perc_chunks
from cachepilot_sim.integrations.vllm.evictor_bench import load_workload, run_policy, vllm_setup
from cachepilot_sim.integrations.vllm.params import PercParams
from cachepilot_sim.integrations.vllm.replay import ReplayConfig, make_turns

HELD, FLUSH, RANK, TAIL, REST, TOTAL = (
    "protected scan (`_held`)",
    "re-slot changed sessions (`_flush`)",
    "keys and order (`_ranked` less `_flush`)",
    "take tail chunks and forget them",
    "rest of `evict`",
    "total `evict`",
)
LABELS = (HELD, FLUSH, RANK, TAIL, REST, TOTAL)
spent: dict[str, int] = defaultdict(int)
rows: list[dict[str, int]] = []


def timed(cls: type, name: str, label: str) -> None:
    inner: Callable[..., Any] = getattr(cls, name)

    def wrapper(*args: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = inner(*args)
        spent[label] += time.perf_counter_ns() - t0
        return out

    setattr(cls, name, wrapper)


def instrument() -> None:
    timed(chunks.SessionChunkPolicy, "_held", HELD)
    timed(perc_chunks.PercChunkPolicy, "_flush", FLUSH)
    timed(chunks.SessionChunkPolicy, "_take_tail", TAIL)
    if hasattr(chunks.SessionChunkPolicy, "_drop"):
        timed(chunks.SessionChunkPolicy, "_drop", TAIL)
    ranked = perc_chunks.PercChunkPolicy._ranked

    def ranked_timed(self: Any, now: int, held: Any) -> Iterator[Any]:
        sessions = ranked(self, now, held)
        while True:
            t0 = time.perf_counter_ns()
            session = next(sessions, None)
            spent[RANK] += time.perf_counter_ns() - t0
            if session is None:
                return
            yield session

    perc_chunks.PercChunkPolicy._ranked = ranked_timed  # type: ignore[method-assign]
    evict = chunks.SessionChunkPolicy.evict

    def evict_timed(self: Any, n: int, protected: set[Any]) -> Any:
        spent.clear()
        t0 = time.perf_counter_ns()
        out = evict(self, n, protected)
        total = time.perf_counter_ns() - t0
        if n > 0:
            row = dict(spent)
            row[RANK] = row.get(RANK, 0) - row.get(FLUSH, 0)
            row[REST] = total - sum(row.values())
            row[TOTAL] = total
            rows.append(row)
        return out

    perc_chunks.PercChunkPolicy.evict = evict_timed  # type: ignore[method-assign]


def main(decisions: int, repeats: int, seeds: list[int]) -> None:
    instrument()
    workload = load_workload(CONF_DIR / "workload" / "mixed.yaml", 1.0)
    types, factories = vllm_setup(PercParams(delta_s=30.0, tokens_per_chunk=256))
    means: dict[str, list[float]] = defaultdict(list)
    for seed in seeds:
        turns = make_turns(workload, ReplayConfig(256, 20.0, 3000, seed))
        _, cut = run_policy(factories["lru"], types, turns, 2000, 256, decisions)
        replays = []
        for _ in range(repeats):
            rows.clear()
            run_policy(factories["perc"], types, turns[:cut], 2000, 256)
            replays.append([[row.get(label, 0) for label in LABELS] for row in rows])
        least = np.min(np.asarray(replays), axis=0) / 1e3  # decisions x labels, µs
        for i, label in enumerate(LABELS):
            means[label].append(float(least[:, i].mean()))
    print("| part of a decision | µs (mean) |\n|---|---:|")
    for label in LABELS:
        print(f"| {label} | {np.mean(means[label]):.1f} |")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")])
