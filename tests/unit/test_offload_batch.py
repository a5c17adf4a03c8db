"""One eviction call's offloads started together: the same conversions, grants and landings, at
the same points of the event order, as one start event per copy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.kv.protocol import KvStats
from cachepilot_sim.components.kv.transfers import Transfers
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.cost import TransferFit
from tests.conftest import make_sim_config
from tests.unit.test_prefix_offload import make_kv as make_prefix_kv
from tests.unit.test_prefix_offload import request, serve

FIT = TransferFit(latency_us=0.0, bytes_per_us=1.0)  # a copy of b bytes takes b us
QUANTIZE_BYTES_PER_US = 2.0  # converting g GPU bytes to c CPU bytes takes ceil((g + c) / 2) us

# Per group of copies started in one call: (start time, number of copies, CPU bytes a copy,
# quantized (GPU bytes twice the CPU bytes) or not, delay of a probe scheduled at each landing).
Group = tuple[int, int, int, bool, int]
GROUPS = st.lists(
    st.tuples(
        st.integers(0, 8),
        st.integers(1, 4),
        st.integers(1, 3),
        st.booleans(),
        st.integers(0, 4),
    ),
    min_size=1,
    max_size=8,
)


def _run(groups: list[Group], batched: bool) -> tuple[list[tuple[int, str]], list[int]]:
    """Start each group's copies at its time (one call per group when `batched`, else one
    `offload_then` per copy); log landings and the probes they schedule (tie witnesses), and
    probes scheduled when each group starts at the copy time of one block."""
    env = SimEnvironment()
    pool = VramPool(make_sim_config())
    stats = KvStats()
    transfers = Transfers(env, pool, PcieLink(env, FIT, FIT), stats, QUANTIZE_BYTES_PER_US)
    log: list[tuple[int, str]] = []

    def probe(delay: int, label: str) -> None:
        env.timeout(delay).callbacks.append(lambda _: log.append((env.now, label)))

    def landed_then(delay: int) -> Callable[[str, int], None]:
        def done(label: str, paid_us: int) -> None:
            log.append((env.now, f"landed {label} after {paid_us}"))
            probe(delay, f"probe after {label}")

        return done

    def start(g: int, group: Group) -> None:
        _, num_copies, cpu_bytes, quantized, delay = group
        gpu_bytes = 2 * cpu_bytes if quantized else cpu_bytes
        labels = [f"{g}.{i}" for i in range(num_copies)]
        pool.allocate(gpu_bytes * num_copies)
        for _ in labels:
            transfers.start_offload(gpu_bytes)
        done = landed_then(delay)
        if batched:
            transfers.offload_each_then(gpu_bytes, cpu_bytes, labels, done)
        else:
            for label in labels:
                transfers.offload_then(gpu_bytes, cpu_bytes, lambda d, label=label: done(label, d))
        probe(cpu_bytes, f"probe at start of {g}")

    def driver() -> simpy.events.ProcessGenerator:
        for g, group in sorted(enumerate(groups), key=lambda x: (x[1][0], x[0])):
            if group[0] > env.now:
                yield env.timeout(group[0] - env.now)
            start(g, group)

    env.process(driver())
    env.run()
    counters = [pool.free_bytes, pool.used_bytes, pool.in_flight_bytes]
    return log, [*counters, transfers.pending_free_bytes, stats.convert_us]


@settings(max_examples=300, deadline=None)
@given(GROUPS)
def test_offloads_started_together_land_as_offloads_started_one_by_one(
    groups: list[Group],
) -> None:
    one_by_one, counters = _run(groups, batched=False)
    together, counters_together = _run(groups, batched=True)
    assert together == one_by_one
    assert counters_together == counters
    assert counters[2:4] == [0, 0]  # every copy landed: nothing in flight


def test_offloads_started_together_queue_on_the_lane_in_order() -> None:
    log, (free, used, in_flight, pending, convert_us) = _run([(0, 3, 2, False, 0)], batched=True)
    landings = [e for e in log if e[1].startswith("landed")]
    assert landings == [
        (2, "landed 0.0 after 2"),
        (4, "landed 0.1 after 2"),
        (6, "landed 0.2 after 2"),
    ]
    assert (used, in_flight, pending, convert_us) == (0, 0, 0, 0)


def test_quantized_offloads_started_together_convert_once_each() -> None:
    # 4 GPU bytes -> 2 CPU bytes: ceil(6 / 2) = 3 us of conversion per copy, then 2 us on the lane
    log, (*_, convert_us) = _run([(0, 2, 2, True, 0)], batched=True)
    landings = [e for e in log if e[1].startswith("landed")]
    assert landings == [(5, "landed 0.0 after 5"), (7, "landed 0.1 after 5")]
    assert convert_us == 6


def test_an_eviction_call_schedules_only_its_copies_start_and_conserves_bytes(
    tmp_path: Path,
) -> None:
    # A store of one block: tail 4 goes out, then 3 finds no room and is dropped with 4 (in
    # flight, not yet started: an orphan whose landing frees its store bytes).
    kv = make_prefix_kv(tmp_path, cpu_blocks=1)
    serve(kv, request(kv, 0))
    scheduled: list[tuple[simpy.Event, int]] = []
    schedule = kv.env.schedule

    def spy(event: simpy.Event, priority: int = simpy.core.NORMAL, delay: int = 0) -> None:
        scheduled.append((event, priority))
        schedule(event, priority, delay)

    kv.env.schedule = spy  # type: ignore[method-assign]
    assert kv._evict_blocks(2) == 2
    assert [p for _, p in scheduled] == [simpy.core.URGENT]  # one start for the call's copies
    assert (kv.stats.evictions_offload, kv.stats.evictions_drop) == (1, 1)
    assert kv.cpu_tier.orphans == 1 and 4 not in kv.tree.blocks
    kv.env.schedule = schedule  # type: ignore[method-assign]
    kv.env.run()
    pool = kv.pool
    assert pool.in_flight_bytes == 0 and kv.transfers.pending_free_bytes == 0
    assert pool.free_bytes + pool.used_bytes == pool.capacity_bytes
    assert pool.used_bytes == 2 * kv.hash_bytes  # blocks 1 and 2
    assert kv.cpu_tier.orphans == 0 and kv.cpu.used_bytes == 0
