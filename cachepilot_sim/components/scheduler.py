"""Request scheduler: a priority queue whose requests are promoted as their TTFT deadline nears.

Order: requests handed back by the KV manager or preempted (front queue, FIFO) first; then requests
within `promote_slack_ms` of their TTFT deadline, earliest deadline first; then by class priority
(higher first), arrival time, and request id. Removed entries are deleted lazily from both heaps.

`RequestQueue` is the queue (the port the KV manager, the batcher and the admission gate are
given); `Scheduler` takes each arrival into the queue at the instant a client puts it.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Protocol

import simpy

from cachepilot_sim.clock import SimEnvironment, ceil_us, ms_to_us, s_to_us
from cachepilot_sim.components.request import Request
from cachepilot_sim.components.signal import Signal
from cachepilot_sim.config import SchedulerConfig
from cachepilot_sim.trace.events import TraceEvents


class ArrivalListener(Protocol):
    """Told of every request as it reaches the scheduler, before it is queued."""

    def on_arrival(self, req: Request) -> None:
        """Called once per request, at its arrival, before it is queued."""


class RequestQueue:
    """The engine's queue: push, requeue-front, peek/pop in scheduling order; every hand-back
    wakes the engine through the signal it was given."""

    def __init__(self, env: SimEnvironment, cfg: SchedulerConfig, wake: Signal) -> None:
        self.env = env
        self.wake = wake
        self.promote_slack_us = ms_to_us(cfg.promote_slack_ms)
        self.promote = cfg.deadline_promotion
        self.queue_timeout_us = s_to_us(cfg.queue_timeout_s)
        self._front: deque[Request] = deque()
        self._by_priority: list[tuple[int, int, int]] = []
        self._by_deadline: list[tuple[int, int]] = []
        self._queued: dict[int, Request] = {}
        self._place: dict[int, int] = {}  # a queued request's place among its priority
        self.num_promoted = 0

    def push(self, req: Request, order_us: int | None = None) -> None:
        """Queue `req` in scheduling order (no wake-up: see `requeue`); `order_us` replaces its
        arrival time as its place among requests of its priority."""
        self._queued[req.req_id] = req
        place = req.arrival_us if order_us is None else order_us
        self._place[req.req_id] = place
        heapq.heappush(self._by_priority, (-req.priority, place, req.req_id))
        heapq.heappush(self._by_deadline, (req.deadline_us, req.req_id))

    def requeue(self, req: Request) -> None:
        """Queue `req` again in its normal place (a deferred admission) and wake the engine."""
        self.push(req)
        self.wake.notify()

    def requeue_back(self, req: Request) -> None:
        """A preempted request that waits its turn again: behind every request queued now (an
        engine that appends it to its waiting list), ahead of later arrivals."""
        self.push(req, order_us=int(self.env.now))
        self.wake.notify()

    def requeue_front(self, req: Request) -> None:
        """A request whose KV just landed, or that was preempted: it goes before everything else."""
        self._front.append(req)
        self.wake.notify()

    def __len__(self) -> int:
        return len(self._front) + len(self._queued)

    def min_slack_us(self) -> int | None:
        """Time to the earliest TTFT deadline among queued requests (None when empty)."""
        self._clean(self._by_deadline, 1)
        if not self._by_deadline:
            return None
        return self._by_deadline[0][0] - self.env.now

    def _clean(self, heap: list, id_pos: int) -> None:
        while heap and heap[0][id_pos] not in self._queued:
            heapq.heappop(heap)

    def expired(self, req: Request) -> bool:
        """True when `req` waited past `scheduler.queue_timeout_s` without a first token."""
        return (
            self.queue_timeout_us > 0
            and req.first_token_us < 0
            and self.env.now - req.arrival_us > self.queue_timeout_us
        )

    def peek(self) -> Request | None:
        """The next request to admit, without removing it."""
        if self._front:
            return self._front[0]
        self._clean(self._by_deadline, 1)
        if (
            self.promote
            and self._by_deadline
            and self._by_deadline[0][0] - self.env.now <= self.promote_slack_us
        ):
            return self._queued[self._by_deadline[0][1]]
        self._clean(self._by_priority, 2)
        if self._by_priority:
            return self._queued[self._by_priority[0][2]]
        return None

    def in_order(self) -> list[Request]:
        """Every queued request in the order `peek` would return them (O(q log q): for an engine
        that looks past a request it cannot admit, `engine.admit_past_blocked`)."""
        now, slack = self.env.now, self.promote_slack_us
        queued = self._queued.values()
        promoted = sorted(
            (r for r in queued if self.promote and r.deadline_us - now <= slack),
            key=lambda r: (r.deadline_us, r.req_id),
        )
        seen = {r.req_id for r in promoted}
        rest = sorted(
            (r for r in queued if r.req_id not in seen),
            key=lambda r: (-r.priority, self._place[r.req_id], r.req_id),
        )
        return [*self._front, *promoted, *rest]

    def pop(self, req: Request) -> None:
        """Remove `req` (the one `peek` returned, or one of `in_order`)."""
        if self._front and self._front[0] is req:
            self._front.popleft()
            return
        if req in self._front:
            self._front.remove(req)
            return
        if (
            self._by_deadline
            and self._by_deadline[0][1] == req.req_id
            and (not self._by_priority or self._by_priority[0][2] != req.req_id)
        ):
            self.num_promoted += 1
        del self._queued[req.req_id]
        del self._place[req.req_id]


class Scheduler:
    """Arrivals: tell the arrival listener and queue each request at the instant it is put.

    No event of its own: a put used to go through a `simpy.Store` and a process (two events and
    a resume per request, at the same instant); the wake-up it sends the engine is the one event
    an arrival causes."""

    def __init__(
        self,
        env: SimEnvironment,
        queue: RequestQueue,
        arrivals: ArrivalListener,
        events: TraceEvents,
        intake_us: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        """`intake_us`: a request reaches the queue (a + b x prompt tokens) us after it was sent
        (vLLM's AsyncLLM front end: engine.frontend_in_us, frontend_in_token_us); 0: at once."""
        self.env = env
        self.queue = queue
        self.arrivals = arrivals
        self.events = events
        self.intake_us = intake_us

    def put(self, req: Request) -> None:
        """`req` is sent now: it reaches the queue at once, or after the front end's intake
        delay (`intake_us`), as one timeout."""
        a, b = self.intake_us
        if a or b:
            delay = ceil_us(a + b * req.prompt_tokens)
            self.env.timeout(delay, req).callbacks.append(self._arrive_event)
        else:
            self._arrive(req)

    def _arrive_event(self, event: simpy.Event) -> None:
        req = event.value
        assert isinstance(req, Request)
        self._arrive(req)

    def _arrive(self, req: Request) -> None:
        """`req` arrives now: traced, told to the arrival listener, queued; the engine wakes."""
        self.events.arrive(self.env.now, req)
        self.arrivals.on_arrival(req)
        self.queue.requeue(req)
