"""Prefill/decode disaggregation (DistServe, OSDI'24; Splitwise, ISCA'24; Mooncake, FAST'25):
prefill GPUs compute a request's KV and first token, the KV crosses the network to a decode GPU,
which generates the rest.

A client request is served as two engine requests with the same id: its prefill half (the
request with one output token) on the prefill replica the router chose, then, once the KV has
landed, its decode half on a decode replica: a `HandedOverRequest` whose prompt is the whole
context plus the first token, of which all but that token arrived precomputed. The client's
request takes its TTFT from the prefill half and its end from the decode half, so its TPOT pays
the handover and the decode-side queue, as in DistServe's accounting.

Decode-side admission: the decode replica is the one with the least active KV (used + in
flight - evictable idle KV) under `cluster.decode_max_kv_fraction`; while none is under it the
handover waits, holding its KV on the prefill GPU (the prefill side backs up, as Mooncake's
early rejection and DistServe's pull-based transfer both avoid overrunning decode memory).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from cachepilot_sim.clock import SimEnvironment, ms_to_us
from cachepilot_sim.cluster.network import Network
from cachepilot_sim.cluster.replica import Replica
from cachepilot_sim.components.request import Outcome, Request
from cachepilot_sim.config import SimConfig


class HandedOverRequest(Request):
    """A decode half: its first `kv_ready_tokens` of KV arrived over the network, so an
    admission prefills only what lies beyond them (after a preemption the KV is gone and
    everything is recomputed, as for any request)."""

    __slots__ = ("kv_ready_tokens", "_prefill_tokens")

    def __init__(self, env: SimEnvironment, src: Request, kv_ready_tokens: int) -> None:
        self.kv_ready_tokens = kv_ready_tokens
        self._prefill_tokens = 0
        super().__init__(
            env,
            src.req_id,
            -1 - src.req_id,  # its own session: the decode GPU keeps no session state
            0,
            src.class_index,
            src.model_index,
            src.priority,
            int(env.now),
            src.deadline_us,
            src.tpot_slo_us,
            0,
            kv_ready_tokens + 1,  # the context, then the first token as input
            src.output_tokens - 1,
        )
        self.group_id = self.session_id

    @property  # type: ignore[override]
    def prefill_tokens(self) -> int:
        return self._prefill_tokens

    @prefill_tokens.setter
    def prefill_tokens(self, num_tokens: int) -> None:
        ready = 0 if self.num_preemptions else self.kv_ready_tokens
        self._prefill_tokens = max(1, num_tokens - ready) if num_tokens else 0


def prefill_half(env: SimEnvironment, req: Request) -> Request:
    """The request with one output token: what a prefill replica runs."""
    half = Request(
        env, req.req_id, req.session_id, req.turn, req.class_index, req.model_index,
        req.priority, req.arrival_us, req.deadline_us, req.tpot_slo_us, req.context_tokens,
        req.prompt_tokens, 1,
    )  # fmt: skip
    half.hash_ids, half.group_id, half.parent = req.hash_ids, req.group_id, req.parent
    half.next_gap_us = req.next_gap_us
    return half


class PrefillPort:
    """What the router sees of a prefill replica: `submit` starts the request's P/D journey and
    returns the event that ends the prefill replica's part (its load while outstanding)."""

    def __init__(self, pd: Disaggregation, index: int) -> None:
        self.pd, self.index = pd, index

    def submit(self, req: Request) -> simpy.Event:
        """Put `req`'s prefill half on this replica; the rest follows by itself."""
        half = prefill_half(self.pd.env, req)
        self.pd.env.process(self.pd.serve(req, half, self.index))
        return half.done

    def kv_load(self) -> float:
        """The prefill replica's KV load."""
        return self.pd.prefill[self.index].kv_load()


class Disaggregation:
    """The P/D journeys: prefill half, decode choice, handover over the network, decode half."""

    def __init__(
        self,
        env: SimEnvironment,
        cfg: SimConfig,
        replicas: list[Replica],
        network: Network,
    ) -> None:
        num_prefill = cfg.cluster.prefill_replicas
        self.env, self.cfg, self.network = env, cfg, network
        self.prefill, self.decode = replicas[:num_prefill], replicas[num_prefill:]
        self.ports = [PrefillPort(self, i) for i in range(num_prefill)]
        self.decode_routed = [0] * len(self.decode)
        self._decode_outstanding = [0] * len(self.decode)
        self.landed_us: dict[int, int] = {}  # req_id -> when its KV reached the decode GPU
        self.decode_half: dict[int, Request] = {}
        self.handover_bytes = 0
        self.handover_busy_us = 0
        self.handover_wait_us = 0

    def serve(self, req: Request, half: Request, p: int) -> Generator[simpy.Event, Any, None]:
        """Process: prefill half, then (if more tokens are wanted) decode choice, handover and
        decode half; ends by triggering `req.done`."""
        self.prefill[p].inbox.put(half)
        yield half.done
        req.admitted_us, req.first_token_us = half.admitted_us, half.first_token_us
        req.kv_source, req.prefill_tokens = half.kv_source, half.prefill_tokens
        req.reload_us_paid, req.recompute_us_paid = half.reload_us_paid, half.recompute_us_paid
        req.num_preemptions, req.generated = half.num_preemptions, half.generated
        req.num_cpu_swaps = half.num_cpu_swaps
        end: Request = half
        if half.outcome == Outcome.COMPLETED and req.output_tokens > 1:
            d = yield from self._choose_decode()
            tokens = req.context_tokens + req.prompt_tokens
            num_bytes = tokens * self.cfg.models[req.model_index].kv_bytes_per_token
            self.handover_bytes += num_bytes
            self.handover_busy_us += yield from self.network.transfer(
                p, len(self.prefill) + d, num_bytes
            )
            self.landed_us[req.req_id] = int(self.env.now)
            end = self.decode_half[req.req_id] = HandedOverRequest(self.env, req, tokens)
            self.decode[d].inbox.put(end)
            yield end.done
            self._decode_outstanding[d] -= 1
            req.generated += end.generated
            req.num_preemptions += end.num_preemptions
            req.num_cpu_swaps += end.num_cpu_swaps
        req.outcome, req.reject_reason, req.finish_us = (
            end.outcome,
            end.reject_reason,
            end.finish_us,
        )
        req.done.succeed()

    def active_load(self, d: int) -> float:
        """Decode replica d's KV that cannot be evicted (used + in flight - idle) / pool."""
        r = self.decode[d]
        active = r.pool.used_bytes + r.pool.in_flight_bytes - r.kv.evictable_bytes()
        return active / r.pool.capacity_bytes

    def _choose_decode(self) -> Generator[simpy.Event, Any, int]:
        """The decode replica with the least active KV under the cap; waits while none is."""
        cap = self.cfg.cluster.decode_max_kv_fraction
        retry = ms_to_us(self.cfg.cluster.handover_retry_ms)
        while True:
            loads = [
                (self.active_load(d), self._decode_outstanding[d], d)
                for d in range(len(self.decode))
            ]
            best = min(loads)
            if best[0] < cap:
                d = best[2]
                self.decode_routed[d] += 1
                self._decode_outstanding[d] += 1
                return d
            self.handover_wait_us += retry
            yield self.env.timeout(retry)

    def metrics(self) -> dict[str, Any]:
        """The handover's realized costs and the decode side's spread."""
        net = self.network
        return {
            "pd_prefill_replicas": len(self.prefill),
            "pd_decode_replicas": len(self.decode),
            "handovers": net.num_transfers,
            "handover_gb": self.handover_bytes / 1e9,
            "handover_s": self.handover_busy_us / 1e6,
            "handover_wait_s": self.handover_wait_us / 1e6,
            "handover_gb_by_fabric": {k.value: v / 1e9 for k, v in net.bytes_moved.items()},
            "decode_replica_requests": self.decode_routed,
        }
