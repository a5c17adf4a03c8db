"""The network between replicas that carries a KV handover (prefill -> decode) and the traffic to
a shared KV store (`shared_tier.py`).

Each GPU has an NVLink port (to GPUs of its node) and a NIC (to other nodes), one direction each
way, each a `simpy.Resource` of capacity 1: a handover holds the sender's egress and the
receiver's ingress lane of the fabric it crosses for `latency + bytes / bandwidth`, so handovers
from one prefill GPU, or into one decode GPU, queue behind each other (contention per link).
Egress is always taken before ingress, so two handovers can never wait on each other.

Bandwidth and latency per fabric are config fields (`cluster.*_gb_per_s`, `cluster.*_latency_us`)
with datasheet defaults cited in config/cluster.py.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass

import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.config.cluster import ClusterConfig, LinkKind


@dataclass(frozen=True, slots=True)
class LinkFit:
    """One fabric: transfer time = latency + bytes / bandwidth."""

    latency_us: float
    bytes_per_us: float


def link_fits(cfg: ClusterConfig) -> dict[LinkKind, LinkFit]:
    """The three fabrics' fits from the cluster config (GB/s = 1e3 bytes per µs)."""
    return {
        LinkKind.NVLINK: LinkFit(cfg.nvlink_latency_us, cfg.nvlink_gb_per_s * 1e3),
        LinkKind.RDMA: LinkFit(cfg.rdma_latency_us, cfg.rdma_gb_per_s * 1e3),
        LinkKind.TCP: LinkFit(cfg.tcp_latency_us, cfg.tcp_gb_per_s * 1e3),
    }


def handover_us(fit: LinkFit, num_bytes: int) -> int:
    """Service time of one transfer (µs, rounded up; 0 for no bytes)."""
    return 0 if num_bytes <= 0 else math.ceil(fit.latency_us + num_bytes / fit.bytes_per_us)


class Network:
    """Per-GPU lanes (egress and ingress, per fabric) and the bytes and busy time they carried."""

    def __init__(self, env: SimEnvironment, cfg: ClusterConfig, num_gpus: int) -> None:
        self.env, self.cfg = env, cfg
        self.fits = link_fits(cfg)
        self.cross = cfg.cross_node_link
        self.egress = {k: [simpy.Resource(env, 1) for _ in range(num_gpus)] for k in LinkKind}
        self.ingress = {k: [simpy.Resource(env, 1) for _ in range(num_gpus)] for k in LinkKind}
        self.bytes_moved = {k: 0 for k in LinkKind}
        self.busy_us = {k: 0 for k in LinkKind}
        self.num_transfers = 0

    def fabric(self, src: int, dst: int) -> LinkKind:
        """NVLink between GPUs of one node, the cross-node fabric otherwise."""
        per_node = self.cfg.gpus_per_node
        return LinkKind.NVLINK if src // per_node == dst // per_node else self.cross

    def transfer(self, src: int, dst: int, num_bytes: int) -> Generator[simpy.Event, object, int]:
        """Process: hold src's egress, then dst's ingress lane, for the transfer time.

        Yields two lane requests and one timeout; returns the service time (µs).
        """
        kind = self.fabric(src, dst)
        duration = yield from self.move(
            kind, self.egress[kind][src], self.ingress[kind][dst], num_bytes
        )
        self.bytes_moved[kind] += num_bytes
        self.busy_us[kind] += duration
        self.num_transfers += 1
        return duration

    def move(
        self, kind: LinkKind, out: simpy.Resource, into: simpy.Resource, num_bytes: int
    ) -> Generator[simpy.Event, object, int]:
        """Process body: hold lane `out` (an egress), then `into` (an ingress), for the transfer
        time over fabric `kind`; returns it (µs). The caller keeps its own byte counts (a shared
        KV store's lanes are its own Resources, the GPU's are these)."""
        duration = handover_us(self.fits[kind], num_bytes)
        with out.request() as lane_out:
            yield lane_out
            with into.request() as lane_in:
                yield lane_in
                yield self.env.timeout(duration)
        return duration
