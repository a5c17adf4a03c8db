"""The PCIe link to the CPU store: one FIFO lane per direction.

Transfers in one direction queue behind each other (one DMA stream each way); the two directions and
the GPU's compute run concurrently, as with separate copy engines.

A lane is `simpy.Resource(capacity=1)` without its objects: a request is an event triggered when the
lane is granted, a release grants the next waiter through an event, at the same points of SimPy's
event order as the Resource (so runs are unchanged). `transfer_then` is the copy for a caller that
would only wait for it in a process of its own: the same events, without a generator per copy
(an eviction storm starts one copy per evicted block); `transfer_each_then` queues several such
copies at once, as consecutive requests would, with a per-copy item passed to one callback.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

import simpy
from simpy.core import NORMAL

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.cost import TransferFit, transfer_us

T = TypeVar("T")


def triggered(env: SimEnvironment, then: Callable[[simpy.Event], None]) -> simpy.Event:
    """A succeeded event with one callback, not yet scheduled (the caller schedules it)."""
    event = simpy.Event(env)
    event._ok, event._value = True, None
    event.callbacks.append(then)  # type: ignore[union-attr]
    return event


class FifoLane:
    """One DMA lane: serves one transfer at a time, in request order."""

    __slots__ = ("env", "busy", "waiting")

    def __init__(self, env: SimEnvironment) -> None:
        self.env = env
        self.busy = False
        # (grant event, its value when granted), in request order
        self.waiting: deque[tuple[simpy.Event, Any]] = deque()

    def request(self, value: Any = None) -> simpy.Event:
        """An event triggered when this request holds the lane (at once when it is free), with
        `value` as its value (a callback's way to know which copy it serves)."""
        grant = simpy.Event(self.env)
        self.waiting.append((grant, value))
        self._grant(grant)
        return grant

    def _grant(self, _: simpy.Event) -> None:
        if not self.busy and self.waiting:
            self.busy = True
            grant, value = self.waiting.popleft()
            grant._ok, grant._value = True, value
            self.env.schedule(grant, NORMAL)

    def release(self) -> None:
        """The holder is done; the next waiter is granted by an event (as a Resource release)."""
        self.busy = False
        if self.waiting:  # with nobody waiting, the Resource's release event grants nothing
            self.env.schedule(triggered(self.env, self._grant), NORMAL)


class PcieLink:
    """Two DMA lanes (h2d, d2h), each serving one transfer at a time."""

    def __init__(self, env: SimEnvironment, h2d: TransferFit, d2h: TransferFit) -> None:
        self.env = env
        self.fits = {"h2d": h2d, "d2h": d2h}
        self.lanes = {"h2d": FifoLane(env), "d2h": FifoLane(env)}
        self.busy_us = {"h2d": 0, "d2h": 0}
        self.bytes_moved = {"h2d": 0, "d2h": 0}

    def duration_us(self, direction: str, num_bytes: int) -> int:
        """Service time of one transfer of `num_bytes` in `direction` (µs)."""
        return transfer_us(self.fits[direction], num_bytes)

    def copy_on_stream(self, direction: str, num_bytes: int) -> int:
        """A copy that the engine's compute stream serializes (transformers CB's CPU swap runs on
        it): counted on the link and returned as the time the next step waits (µs), not queued on
        a lane, because nothing else on that engine copies. Schedules no event."""
        duration = self.duration_us(direction, num_bytes)
        self.busy_us[direction] += duration
        self.bytes_moved[direction] += num_bytes
        return duration

    def transfer(self, direction: str, num_bytes: int) -> Generator[simpy.Event, object, int]:
        """Process: queue for the direction's lane, hold it for the transfer time.

        Yields the lane request and one timeout; returns the service time in microseconds.
        """
        duration = self.duration_us(direction, num_bytes)
        lane = self.lanes[direction]
        yield lane.request()
        yield self.env.timeout(duration)
        lane.release()
        self.busy_us[direction] += duration
        self.bytes_moved[direction] += num_bytes
        return duration

    def transfer_then(self, direction: str, num_bytes: int, done: Callable[[int], None]) -> None:
        """`transfer` without a process: queue now, then `done(service time in µs)` when the
        copy lands, where a process running `transfer` would continue."""
        duration = self.duration_us(direction, num_bytes)
        lane = self.lanes[direction]

        def landed(_: simpy.Event) -> None:
            lane.release()
            self.busy_us[direction] += duration
            self.bytes_moved[direction] += num_bytes
            done(duration)

        def hold(_: simpy.Event) -> None:
            self.env.timeout(duration).callbacks.append(landed)  # type: ignore[union-attr]

        lane.request().callbacks.append(hold)  # type: ignore[union-attr]

    def transfer_each_then(
        self, direction: str, num_bytes: int, items: Sequence[T], done: Callable[[T, int], None]
    ) -> None:
        """`transfer_then` of `num_bytes` once per item, requested now in the items' order (as
        consecutive calls would): `done(item, service time in µs)` as each copy lands. The same
        events per copy (grant, copy timeout, the next grant); fewer Python objects per copy."""
        duration = self.duration_us(direction, num_bytes)
        lane = self.lanes[direction]
        timeout = self.env.timeout
        busy_us, bytes_moved = self.busy_us, self.bytes_moved

        def landed(copy: simpy.Event) -> None:
            lane.release()
            busy_us[direction] += duration
            bytes_moved[direction] += num_bytes
            done(copy._value, duration)

        def hold(grant: simpy.Event) -> None:
            timeout(duration, grant._value).callbacks.append(landed)  # type: ignore[union-attr]

        for item in items:
            lane.request(item).callbacks.append(hold)  # type: ignore[union-attr]
