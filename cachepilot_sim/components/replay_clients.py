"""Replay clients: an open loop that sends each trace request at its recorded arrival time.

Unlike synthetic sessions, a replayed request does not wait for an earlier turn's answer: the trace
already fixes when it was sent. Each request is its own engine-level session (`session_id` = request
id) so that two requests of one inferred session may run at once; the inferred session is kept in
the workload and reported in the per-request table.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import simpy

from cachepilot_sim.clock import SimEnvironment, ms_to_us
from cachepilot_sim.components.request import Request
from cachepilot_sim.config import SimConfig

if TYPE_CHECKING:  # the workload is built by sim.py and handed in; no component reads files
    from cachepilot_sim.workloads.replay import ReplayWorkload


class ReplayClients:
    """Open-loop replay of a trace's requests at their (scaled) recorded times."""

    def __init__(
        self, env: SimEnvironment, cfg: SimConfig, workload: ReplayWorkload, inbox: simpy.Store
    ) -> None:
        self.env = env
        self.workload = workload
        self.inbox = inbox
        rc = cfg.replay
        self.class_names = [f"{rc.format!s}_trace"]
        self.ttft_slo_us = [ms_to_us(rc.ttft_slo_ms)]
        self.tpot_slo_us = ms_to_us(rc.tpot_slo_ms)
        self.priority = rc.priority
        self.requests: list[Request] = []
        self.num_sessions = workload.sessions.num_sessions

    def arrivals(self) -> Generator[simpy.Event, object, None]:
        """Process: one timeout per distinct arrival time, then every request due is put."""
        wl = self.workload
        arrival = wl.arrival_us.tolist()
        inputs, outputs = wl.table.input_tokens.tolist(), wl.table.output_tokens.tolist()
        turns = wl.sessions.turn.tolist()
        groups, parents = wl.sessions.session.tolist(), wl.sessions.parent.tolist()
        for i, t in enumerate(arrival):
            if t > int(self.env.now):
                yield self.env.timeout(t - int(self.env.now))
            req = Request(
                self.env,
                req_id=i,
                session_id=i,
                turn=turns[i],
                class_index=0,
                model_index=0,
                priority=self.priority,
                arrival_us=int(self.env.now),
                deadline_us=int(self.env.now) + self.ttft_slo_us[0],
                tpot_slo_us=self.tpot_slo_us,
                context_tokens=0,
                prompt_tokens=inputs[i],
                output_tokens=outputs[i],
            )
            # What the prefix KV manager reads: the prompt's block hashes, the inferred session,
            # and the earlier request this one continues (parents come first in the trace).
            req.hash_ids = wl.table.hash_ids(i).tolist()
            req.group_id = groups[i]
            req.parent = self.requests[parents[i]] if parents[i] >= 0 else None
            self.requests.append(req)
            self.inbox.put(req)  # unbounded Store: succeeds at once
