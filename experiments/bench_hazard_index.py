"""µs per decision of perc_hazard's time index (`policies/hazard_index.py`) once every class has
returned gaps, at 10^3..10^6 idle entries: `bench_eviction.py`'s session-manager steady state,
with `--gaps` returned gaps per class (1 s to 1000 s, the spread of the bench's gap EMAs).

`bench_eviction.py` releases entries but never sees one return, so there every perc_hazard
decision runs on the EMA model (each class's `PercIndex`, `num_fallback`). This one measures the
curve path, and prints the index's operation counts per decision beside the times.

    PYTHONPATH=. python experiments/bench_hazard_index.py --json /tmp/bench_hazard_index.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from cachepilot_sim.policies import CacheEntry
from cachepilot_sim.policies.candidates import CandidateIndex
from cachepilot_sim.policies.hazard_index import HazardIndex
from experiments.bench_eviction import BLOCK_BYTES, SIZES, SPARE, Entries, _policy, _timed


def bench(n: int, gaps: int, budget_s: float) -> dict[str, float]:
    """µs per decision and the index's counts per decision over n idle entries."""
    policy, _ = _policy("perc_hazard")
    now = 2 * 10**9
    draws = Entries(n + SPARE, 1, now)
    index = CandidateIndex(policy, lambda e, offload: e.restore_us)  # type: ignore[arg-type]
    for i in range(n):
        e = draws.make(i, now)
        policy.on_release(e, now)  # type: ignore[attr-defined]
        index.add(e, now)
    # Then the returned gaps, oldest first, for classes 0..2: released after the idle entries,
    # they fill each class's window of `hazard_max_gaps` records (the decisions' releases push
    # one out each), so the classes keep their curves throughout.
    rng = np.random.default_rng(2)
    for k in range(3 * gaps):
        e = CacheEntry(-1 - k, -1 - k, 0, k % 3, 0, 16, 4096, 0, 0)
        t = now - 2 * 10**9 + k * (10**9 // gaps)
        policy.on_release(e, t)  # type: ignore[attr-defined]
        policy.on_access(e, t + int(rng.integers(10**6, 10**9)))  # type: ignore[attr-defined]
    spares = [draws.make(i, now) for i in range(n, n + SPARE)]
    decisions = 0

    def decide(k: int) -> None:
        nonlocal decisions
        decisions += 1
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

    us = _timed(decide, budget_s, warm=True)
    (hazard,) = index._timed.values()
    assert isinstance(hazard, HazardIndex)
    return {
        "us_per_decision": us,
        "keyed_per_decision": hazard.num_keyed / decisions,
        "numpy_keyed_per_decision": hazard.num_approx / decisions,
        "fallback_decisions": hazard.num_fallback,
        "blocks": hazard.num_blocks(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--budget-s", type=float, default=0.3, help="seconds per timing window")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--gaps", type=int, default=512, help="returned gaps per class")
    args = parser.parse_args(argv)
    out = {}
    for n in (int(s) for s in args.sizes.split(",")):
        out[str(n)] = bench(n, args.gaps, args.budget_s)
        print(n, out[str(n)], file=sys.stderr, flush=True)
    text = json.dumps({"perc_hazard": out}, indent=1, sort_keys=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
