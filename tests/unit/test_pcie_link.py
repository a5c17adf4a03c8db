"""The PCIe lane without simpy.Resource: the same grants, at the same points of the event order."""

from __future__ import annotations

from collections.abc import Generator

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.cost import TransferFit

# (start time, bytes, copy by callback rather than by a process, probe delay) per copy; small
# numbers so that many copies start, land and probe at the same microsecond.
Copy = tuple[int, int, bool, int]
COPIES = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 3), st.booleans(), st.integers(0, 4)),
    min_size=1,
    max_size=12,
)
FIT = TransferFit(latency_us=0.0, bytes_per_us=1.0)  # a copy of b bytes takes b us


def _resource_log(copies: list[Copy]) -> list[tuple[int, str]]:
    """The reference: one process per copy over `simpy.Resource(capacity=1)` (the old lane)."""
    env = SimEnvironment()
    lane = simpy.Resource(env, capacity=1)
    log: list[tuple[int, str]] = []

    def copy(i: int, num_bytes: int) -> Generator[simpy.Event, object, None]:
        with lane.request() as grant:
            yield grant
            log.append((env.now, f"granted {i}"))
            yield env.timeout(num_bytes)
        log.append((env.now, f"landed {i}"))

    _drive(env, copies, log, lambda i, b, _: env.process(copy(i, b)))
    return log


def _lane_log(copies: list[Copy]) -> list[tuple[int, str]]:
    env = SimEnvironment()
    link = PcieLink(env, FIT, FIT)
    log: list[tuple[int, str]] = []

    def by_process(i: int, num_bytes: int) -> Generator[simpy.Event, object, None]:
        lane = link.lanes["d2h"]
        yield lane.request()
        log.append((env.now, f"granted {i}"))
        yield env.timeout(num_bytes)
        lane.release()
        log.append((env.now, f"landed {i}"))

    def by_callback(i: int, num_bytes: int) -> None:
        # A process's start is an urgent event; the callback form schedules one in its place.
        def start(_: simpy.Event) -> None:
            link.transfer_then("d2h", num_bytes, lambda _: log.append((env.now, f"landed {i}")))

        env.schedule(_triggered(env, start), simpy.core.URGENT)

    def start_copy(i: int, num_bytes: int, callback: bool) -> None:
        if callback:
            by_callback(i, num_bytes)
        else:
            env.process(by_process(i, num_bytes))

    _drive(env, copies, log, start_copy)
    return log


def _triggered(env: SimEnvironment, then) -> simpy.Event:  # noqa: ANN001
    event = simpy.Event(env)
    event._ok, event._value = True, None
    event.callbacks.append(then)
    return event


def _is_process(copies: list[Copy], label: str) -> bool:
    return not copies[int(label.split()[1])][2]


def _drive(env: SimEnvironment, copies: list[Copy], log: list, start) -> None:  # noqa: ANN001
    """Start each copy at its time, with a probe timeout `probe` us later (a tie witness)."""

    def driver() -> Generator[simpy.Event, object, None]:
        for i, (t, num_bytes, callback, probe) in sorted(
            enumerate(copies), key=lambda x: (x[1][0], x[0])
        ):
            if t > env.now:
                yield env.timeout(t - env.now)
            start(i, num_bytes, callback)
            env.timeout(probe).callbacks.append(lambda _, i=i: log.append((env.now, f"probe {i}")))

    env.process(driver())
    env.run()


@settings(max_examples=300, deadline=None)
@given(COPIES)
def test_lane_grants_and_lands_copies_in_the_resource_event_order(copies: list[Copy]) -> None:
    reference = _resource_log(copies)
    expected = [e for e in reference if not e[1].startswith("granted") or _is_process(copies, e[1])]
    assert _lane_log(copies) == expected


def test_lane_serves_one_copy_at_a_time_in_request_order() -> None:
    env = SimEnvironment()
    link = PcieLink(env, FIT, FIT)
    landed: list[tuple[int, int, int]] = []
    for i, num_bytes in enumerate((5, 1, 2)):
        link.transfer_then("d2h", num_bytes, lambda d, i=i: landed.append((env.now, i, d)))
    env.run()
    assert landed == [(5, 0, 5), (6, 1, 1), (8, 2, 2)]
    assert link.busy_us["d2h"] == 8 and link.bytes_moved["d2h"] == 8
