"""Replay clients: an open loop that sends each trace request at its recorded arrival time.

Unlike synthetic sessions, a replayed request does not wait for an earlier turn's answer: the trace
already fixes when it was sent. Each request is its own engine-level session (`session_id` = request
id) so that two requests of one inferred session may run at once; the inferred session is kept in
the workload and reported in the per-request table.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import simpy

from cachepilot_sim.clock import SimEnvironment, ms_to_us
from cachepilot_sim.components.request import Outcome, Request, RequestSink
from cachepilot_sim.config import SimConfig

if TYPE_CHECKING:  # the workload is built by sim.py and handed in; no component reads files
    from cachepilot_sim.workloads.replay import ReplayWorkload


class ReplayClients:
    """Open-loop replay of a trace's requests at their (scaled) recorded times."""

    def __init__(
        self, env: SimEnvironment, cfg: SimConfig, workload: ReplayWorkload, inbox: RequestSink
    ) -> None:
        self.env = env
        self.workload = workload
        self.inbox = inbox
        rc = cfg.replay
        self.class_names = [f"{rc.format!s}_trace"]
        self.ttft_slo_us = [ms_to_us(rc.ttft_slo_ms)]
        self.tpot_slo_us = ms_to_us(rc.tpot_slo_ms)
        self.priority = rc.priority
        self.requests: list[Request] = []  # filled in id order at the end
        self._slots: list[Request | None] = []  # request i once sent
        self.num_ended = 0
        self.on_end: list[Callable[[Request], None]] = []  # called with each request as it ends
        self.num_sessions = workload.sessions.num_sessions

    def arrivals(self) -> Generator[simpy.Event, object, None]:
        """Process: one timeout per distinct arrival time, then every request due is put; a
        closed-loop turn is sent instead by its parent's `_after_parent` process."""
        wl = self.workload
        think = wl.think_us.tolist() if wl.think_us is not None else [-1] * wl.num_requests
        parents = wl.sessions.parent.tolist()
        self._children: dict[int, list[int]] = {}
        closed = [parents[i] >= 0 and think[i] >= 0 for i in range(wl.num_requests)]
        for i in range(wl.num_requests):
            if closed[i]:
                self._children.setdefault(parents[i], []).append(i)
        self._slots = [None] * wl.num_requests
        for i, t in enumerate(wl.arrival_us.tolist()):
            if closed[i]:
                continue
            if t > int(self.env.now):
                yield self.env.timeout(t - int(self.env.now))
            self._send(i)
        self.requests = [r for r in self._slots if r is not None]

    def _after_parent(self, i: int, parent: Request) -> Generator[simpy.Event, object, None]:
        """Process: send turn i its think time after its parent's last token."""
        yield parent.done
        assert self.workload.think_us is not None
        yield self.env.timeout(int(self.workload.think_us[i]))
        self._send(i)
        self.requests = [r for r in self._slots if r is not None]

    def pending_ids(self) -> list[int]:
        """Ids of the requests sent that have not ended, in id order."""
        return [r.req_id for r in self._slots if r is not None and r.outcome == Outcome.PENDING]

    def _ended(self, req: Request) -> None:
        self.num_ended += 1
        for watch in self.on_end:
            watch(req)

    def _send(self, i: int) -> None:
        wl = self.workload
        now = int(self.env.now)
        req = Request(
            self.env,
            req_id=i,
            session_id=i,
            turn=int(wl.sessions.turn[i]),
            class_index=0,
            model_index=0,
            priority=self.priority,
            arrival_us=now,
            deadline_us=now + self.ttft_slo_us[0],
            tpot_slo_us=self.tpot_slo_us,
            context_tokens=0,
            prompt_tokens=int(wl.table.input_tokens[i]),
            output_tokens=int(wl.table.output_tokens[i]),
        )
        # What the prefix KV manager reads: the prompt's block hashes, the inferred session,
        # and the earlier request this one continues (parents come first in the trace).
        req.hash_ids = wl.table.hash_ids(i).tolist()
        req.group_id = int(wl.sessions.session[i])
        parent = int(wl.sessions.parent[i])
        req.parent = self._slots[parent] if parent >= 0 else None
        self._slots[i] = req
        req.done.callbacks.append(lambda _event: self._ended(req))
        self.inbox.put(req)  # queued at once
        for child in self._children.get(i, ()):
            self.env.process(self._after_parent(child, req))
