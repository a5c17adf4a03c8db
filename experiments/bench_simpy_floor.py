"""SimPy's own floor under the simulator (not a test): how many requests per CPU second a run
could reach if our model code cost nothing and only SimPy's event loop remained.

Two bare costs are timed on this machine with the simulator's `SimEnvironment`:
* a process resume: a generator that yields `env.timeout(1)` again and again (one Timeout made,
  scheduled, popped, its callback resuming the generator) — µs per resume;
* a callback event: an event whose callback schedules the next one, no generator — µs per event.

Then each case (a short real run, in a fresh process, files written, as `bench_harness.py` runs
cases) gives SimPy events and process resumes per request; its floor is
resumes × (µs per resume) + (events − resumes) × (µs per callback event), against the CPU µs per
request the case actually took. The gap is our model's Python, the floor is what no change of our
model code can go under without fewer events.

    python experiments/bench_simpy_floor.py [--out experiments/bench_simpy_floor.json]

Replays read $CACHEPILOT_TRACES_DIR (default ../shared/traces), like the experiments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench_harness import child_or_none, run_child, run_meta, time_case

from cachepilot_sim.clock import SimEnvironment

# name -> (Hydra overrides, requests per second the issue asks for: 5,000 for replays, 10^6 in
# three minutes for the synthetic run)
CASES: dict[str, tuple[list[str], float]] = {
    "azure_conv, first 5,000 rows, lru": (
        ["+experiment=azure_conv", "replay.limit=5000", "compare_policies=[lru]", "seeds=1"],
        5000.0,
    ),
    "mooncake_synthetic, first 800 rows, lru": (
        ["+experiment=mooncake_synthetic", "replay.limit=800", "compare_policies=[lru]"],
        5000.0,
    ),
    "mooncake_synthetic, first 800 rows, perc": (
        ["+experiment=mooncake_synthetic", "replay.limit=800", "compare_policies=[perc]"],
        5000.0,
    ),
    "mixed_spike, 5,000 requests, perc": (
        ["+experiment=mixed_spike", "workload.num_requests=5000", "seeds=1"]
        + ["compare_policies=[perc]"],
        1e6 / 180,
    ),
}
BARE_EVENTS = 200_000
REPEATS = 5


def resume_us() -> float:
    """µs per process resume on a bare timeout chain (best of `REPEATS`)."""
    best = float("inf")
    for _ in range(REPEATS):
        env = SimEnvironment()

        def chain(env: SimEnvironment = env) -> Any:
            for _ in range(BARE_EVENTS):
                yield env.timeout(1)

        env.process(chain())
        start = time.process_time()
        env.run()
        best = min(best, (time.process_time() - start) / BARE_EVENTS * 1e6)
    return best


def callback_us() -> float:
    """µs per callback event on a bare chain of events (best of `REPEATS`)."""
    best = float("inf")
    for _ in range(REPEATS):
        env = SimEnvironment()
        left = [BARE_EVENTS]

        def fire(_: object, env: SimEnvironment = env, left: list[int] = left) -> None:
            left[0] -= 1
            if left[0] > 0:
                nxt = env.event()
                nxt.callbacks.append(fire)
                nxt.succeed()

        first = env.event()
        first.callbacks.append(fire)
        first.succeed()
        start = time.process_time()
        env.run()
        best = min(best, (time.process_time() - start) / BARE_EVENTS * 1e6)
    return best


def main() -> None:
    overrides = child_or_none()
    if overrides is not None:
        print(json.dumps(time_case(overrides)[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    proc_us, cb_us = resume_us(), callback_us()
    print(f"bare SimPy on this machine: {proc_us:.2f} µs per process resume, {cb_us:.2f} µs per")
    print("callback event\n")
    print(
        "| case | events / req | resumes / req | floor µs / req | measured CPU µs / req "
        "| floor share | floor req / CPU-s | goal req / s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    results: dict[str, Any] = {}
    for name, (case, goal) in CASES.items():
        r = run_child(__file__, case)
        n, events, resumes = r["simulated_requests"], r["simpy_events"], r["process_resumes"]
        floor_us = (resumes * proc_us + (events - resumes) * cb_us) / n
        cpu_us = r["cpu_s"] / n * 1e6
        r.update(
            floor_us_per_request=floor_us,
            cpu_us_per_request=cpu_us,
            floor_share=floor_us / cpu_us,
            floor_requests_per_cpu_s=1e6 / floor_us,
            goal_requests_per_s=goal,
        )
        results[name] = r
        print(
            f"| {name} | {events / n:.1f} | {resumes / n:.1f} | {floor_us:.1f} | {cpu_us:.0f} "
            f"| {floor_us / cpu_us:.1%} | {1e6 / floor_us:,.0f} | {goal:,.0f} |",
            flush=True,
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "meta": run_meta(),
            "bare_us_per_process_resume": proc_us,
            "bare_us_per_callback_event": cb_us,
            "results": results,
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
