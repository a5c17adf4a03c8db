"""Clients: sessions that arrive as a Poisson process and come back for more turns.

A session takes one of `max_active_sessions` slots (the front end's concurrency limit), sends a
turn, waits for the full answer, thinks, and sends the next turn, whose prompt extends its whole
earlier context. The arrival rate is multiplied by `spike_multiplier` once `spike_at_request`
requests have been issued; a think time that starts once `think_drift_at_request` requests have
been issued is multiplied by `think_drift_multiplier` (the draws are unchanged). TTFT counts from
the moment a turn is sent; the time a new session waited for a slot is recorded separately on its
first turn (`session_wait_us`).

A request is handed to the `on_end` watchers (the run's request log, live telemetry) when it ends
and then forgotten: the clients hold only the requests in flight, so a 10^6-request run does not
keep 10^6 `Request`s. `keep_requests` keeps them all (`requests`) for callers that read them after
the run (the cluster's per-request table, tests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import simpy

from cachepilot_sim.clock import SimEnvironment, ms_to_us, s_to_us
from cachepilot_sim.components.request import Outcome, Request, RequestSink
from cachepilot_sim.config import SimConfig
from cachepilot_sim.rng import RngStreams
from cachepilot_sim.trace.events import TraceEvents
from cachepilot_sim.trace.recorder import NullRecorder

if TYPE_CHECKING:  # the session factory is built by sim.py and handed in
    from cachepilot_sim.workloads.synthetic import SessionFactory, SessionSpec


class Clients:
    """Synthetic sessions: Poisson arrivals, front-end slots, turns separated by think times."""

    def __init__(
        self,
        env: SimEnvironment,
        cfg: SimConfig,
        streams: RngStreams,
        factory: SessionFactory,
        inbox: RequestSink,
        events: TraceEvents | None = None,
        keep_requests: bool = False,
    ) -> None:
        self.env = env
        self.events = events if events is not None else TraceEvents(NullRecorder())
        self.wl = cfg.workload
        self.inbox = inbox
        self.streams = streams
        self.factory = factory
        self.class_names = factory.class_names
        # Front-end slots, as a `simpy.Resource(max_active_sessions)` would grant them (FIFO; one
        # grant per arrival or release, scheduled as its events are), but a session waiting for a
        # slot is only its arrival time: no process, no spec (drawn when it gets the slot, in the
        # same order). Under overload the queue of waiting sessions grows with the run.
        self.free_slots = cfg.workload.max_active_sessions
        self.waiting: deque[int] = deque()
        classes = self.factory.classes
        self.ttft_slo_us = [ms_to_us(c.ttft_slo_ms) for c in classes]
        self.tpot_slo_us = [ms_to_us(c.tpot_slo_ms) for c in classes]
        self.num_issued = 0  # requests sent so far (the workload's request budget counts these)
        self.num_ended = 0
        self.on_end: list[Callable[[Request], None]] = []  # called with each request as it ends
        # Called with a session's id when it will send no more turns (last turn answered, a turn
        # rejected, or the request budget spent).
        self.on_session_end: list[Callable[[int], None]] = []
        self._open: dict[int, Request] = {}  # in flight, by id
        self._kept: list[Request] | None = [] if keep_requests else None
        self.num_sessions = 0
        self.spike_start_us = -1

    @property
    def requests(self) -> list[Request]:
        """Every request sent, in the order sent (only with `keep_requests`)."""
        if self._kept is None:
            raise AttributeError(
                "Clients(keep_requests=False) keeps no requests: read the run's table"
            )
        return self._kept

    def pending_ids(self) -> list[int]:
        """Ids of the requests sent that have not ended, in the order sent."""
        return list(self._open)

    def _ended(self, req: Request) -> None:
        del self._open[req.req_id]
        self.num_ended += 1
        for watch in self.on_end:
            watch(req)

    def _rate_per_us(self) -> float:
        rate = self.wl.session_rate_per_s
        if self.wl.spike_multiplier != 1.0 and self.num_issued >= self.wl.spike_at_request:
            if self.spike_start_us < 0:
                self.spike_start_us = self.env.now
            rate *= self.wl.spike_multiplier
        return rate / s_to_us(1.0)

    def arrivals(self) -> Generator[simpy.Event, object, None]:
        """Process: Poisson session arrivals until `num_requests` requests have been issued."""
        while self.num_issued < self.wl.num_requests:
            gap_us = self.streams.arrivals.exponential() / self._rate_per_us()
            yield self.env.timeout(max(1, round(gap_us)))
            if self.num_issued >= self.wl.num_requests:
                break
            self.num_sessions += 1
            self.waiting.append(self.env.now)
            self._grant_slot()

    def _grant_slot(self) -> None:
        """A free slot goes to the session that has waited longest: its grant is an event now,
        on which the session starts."""
        if not self.waiting or self.free_slots == 0:
            return
        self.free_slots -= 1
        arrived_us = self.waiting.popleft()
        grant = self.env.event()
        grant.callbacks.append(lambda _event: self._start_session(arrived_us))
        grant.succeed()

    def _start_session(self, arrived_us: int) -> None:
        self.env.process(self.session(arrived_us))

    def _release_slot(self) -> None:
        """The slot is free now; the next waiting session gets it when this release is processed."""
        self.free_slots += 1
        release = self.env.event()
        release.callbacks.append(lambda _event: self._grant_slot())
        release.succeed()

    def session(self, arrived_us: int) -> Generator[simpy.Event, object, None]:
        """Process: a session that has its slot sends each turn, waits for its answer, thinks,
        and gives the slot back."""
        spec = self.factory.make()
        yield from self._turns(spec, arrived_us)
        for watch in self.on_session_end:
            watch(spec.session_id)
        self._release_slot()

    def _turns(self, spec: SessionSpec, arrived_us: int) -> Generator[simpy.Event, object, None]:
        """Send each turn of `spec`, wait for its answer, think (a session holding a slot)."""
        # The session's turn 0 will be request `first` (-1: the request budget is spent).
        first = self.num_issued if self.num_issued < self.wl.num_requests else -1
        self.events.session_start(
            self.env.now,
            spec.session_id,
            first,
            spec.model_index,
            self.env.now - arrived_us,
            spec.class_index,
        )
        context = 0
        for turn in range(spec.num_turns):
            if self.num_issued >= self.wl.num_requests:
                return
            req = self._make_request(spec, turn, context, self.env.now)
            think_us = self._think_us(spec, turn)
            if turn + 1 < spec.num_turns:
                req.next_gap_us = think_us
            if turn == 0:
                req.session_wait_us = self.env.now - arrived_us
            self.num_issued += 1
            self._open[req.req_id] = req
            if self._kept is not None:
                self._kept.append(req)
            self.inbox.put(req)  # queued at once
            yield req.done
            self._ended(req)
            if req.outcome != Outcome.COMPLETED:
                return
            context = req.total_tokens
            if turn + 1 < spec.num_turns:
                yield self.env.timeout(think_us)

    def _think_us(self, spec: SessionSpec, turn: int) -> int:
        """The think time after `turn`, drifted when the drift has begun (decided as the turn is
        sent, so the clairvoyant `next_gap_us` is the gap the session then waits)."""
        think_us = int(spec.think_us[turn]) if turn < len(spec.think_us) else 0
        wl = self.wl
        if wl.think_drift_multiplier != 1.0 and self.num_issued >= wl.think_drift_at_request:
            think_us = max(0, round(think_us * wl.think_drift_multiplier))
        return think_us

    def _make_request(self, spec: SessionSpec, turn: int, context: int, sent_us: int) -> Request:
        ci = spec.class_index
        return Request(
            self.env,
            req_id=self.num_issued,
            session_id=spec.session_id,
            turn=turn,
            class_index=ci,
            model_index=spec.model_index,
            priority=self.factory.classes[ci].priority,
            arrival_us=sent_us,
            deadline_us=sent_us + self.ttft_slo_us[ci],
            tpot_slo_us=self.tpot_slo_us[ci],
            context_tokens=context,
            prompt_tokens=int(spec.prompt_tokens[turn]),
            output_tokens=int(spec.output_tokens[turn]),
        )
