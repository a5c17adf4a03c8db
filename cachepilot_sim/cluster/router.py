"""The router: puts each client request, at the instant it arrives, into the scheduler of the
replica its strategy (cluster/routers.py) chooses."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Protocol

import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.cluster.routers import Router
from cachepilot_sim.components.request import Request


class ReplicaPort(Protocol):
    """What the router sees of a replica: how to hand it a request, and its KV load."""

    def submit(self, req: Request) -> simpy.Event:
        """Start serving `req`; the event fires when this replica's part of it is done."""

    def kv_load(self) -> float:
        """(Used + in-flight KV bytes) / pool bytes."""


class RequestRouter:
    """Clients put requests here (a `RequestSink`); each goes to the chosen replica at once.

    It counts each replica's outstanding requests (routed, its part not yet done: the event
    `submit` returns fires on completion and on rejection alike) and records where every
    request went (`placement`); it is also the `ClusterView` its strategy reads.
    """

    def __init__(
        self, env: SimEnvironment, strategy: Router, replicas: Sequence[ReplicaPort]
    ) -> None:
        self.env, self.strategy, self.replicas = env, strategy, list(replicas)
        self.num_routed = [0] * len(self.replicas)
        self._outstanding = [0] * len(self.replicas)
        self.placement: dict[int, int] = {}  # req_id -> replica

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    def outstanding(self, replica: int) -> int:
        """Requests routed to `replica` and not yet done."""
        return self._outstanding[replica]

    def kv_load(self, replica: int) -> float:
        """The replica's KV pool load."""
        return self.replicas[replica].kv_load()

    def put(self, req: Request) -> None:
        """A client's request: placed now (`dispatch`)."""
        self.dispatch(req)

    def dispatch(self, req: Request) -> int:
        """Place `req` on the strategy's replica now; returns the replica."""
        r = self.strategy.choose(req, self)
        if not 0 <= r < len(self.replicas):
            raise IndexError(f"router chose replica {r} of {len(self.replicas)}")
        if req.req_id in self.placement:
            raise RuntimeError(f"request {req.req_id} routed twice")
        self.placement[req.req_id] = r
        self.num_routed[r] += 1
        self._outstanding[r] += 1
        self.replicas[r].submit(req).callbacks.append(partial(self._finished, r))
        return r

    def _finished(self, replica: int, _event: simpy.Event) -> None:
        self._outstanding[replica] -= 1
