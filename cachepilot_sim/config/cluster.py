"""Beyond one GPU: how many engine replicas, how they split into prefill and decode, the link that
carries KV between them, and the router that places each request (the `cluster` and `router`
config groups).

One replica with no prefill/decode split is today's single-GPU simulation, byte for byte; the
contract that other tools build on is `cluster.replicas=N router=<name>` and, for a
disaggregated cluster, `cluster.prefill_replicas=P cluster.decode_replicas=D`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from cachepilot_sim.config.base import Sealed, bounded, require
from cachepilot_sim.config.policy import POLICIES
from cachepilot_sim.config.registry import Registry


class LinkKind(StrEnum):
    """The fabric a KV handover crosses between nodes (within a node it is always NVLink)."""

    NVLINK = "nvlink"
    RDMA = "rdma"
    TCP = "tcp"


class TierWrite(StrEnum):
    """When a replica writes a prefix block to the shared store."""

    ON_COMPLETION = "on_completion"  # the blocks a request computed, when it finishes
    ON_EVICTION = "on_eviction"  # a block its GPU evicts and the store lacks, before it is freed


class TierLoad(StrEnum):
    """Whether a replica loads the store's run of blocks after its GPU prefix."""

    ALWAYS = "always"  # load whenever the store holds a continuation
    CHEAPER = "cheaper"  # load only when the modelled transfer beats recomputing those tokens


MAX_REPLICAS = 16_384  # engines in one cluster (a plan reaches 1,024 x its P:D ratio)


@dataclass
class SharedTierConfig(Sealed):
    """A KV store shared by every replica (Mooncake Store, LMCache's remote backend): prefix blocks
    a replica computed are written to it when the request that computed them finishes, and a
    replica's prefix miss that the store holds is loaded over the network instead of recomputed.

    `capacity_gb` 0 (the default) is no shared tier: the cluster runs exactly as without one.
    """

    section: ClassVar[str | None] = "cluster.shared_tier"
    capacity_gb: float = bounded(0.0, ge=0)
    # The store's own eviction policy, any registered name (policy=...'s registry), with that
    # policy's default knobs; the run's reuse estimator fields (policy.delta_s, ...) apply to it.
    policy: str = bounded("lru", nonempty=True)
    # The fabric between a GPU and the store: the GPU's lane of it (the NIC for rdma/tcp) is the
    # same one P/D handovers use, so they contend. The store side serves `store_ports` transfers
    # each way at once (Mooncake Store spreads objects over many nodes' DRAM and NICs).
    link: LinkKind = LinkKind.RDMA
    store_ports: int = bounded(8, ge=1, integer=True)
    # When to write (`cluster/shared_tier.py` cites LMCache and Mooncake on each): ON_COMPLETION
    # (write-through when the request finishes) or ON_EVICTION (write-back: a block the GPU evicts
    # and the store lacks is written first, its GPU bytes in flight until the write lands).
    write: TierWrite = TierWrite.ON_COMPLETION
    # Load or recompute: ALWAYS load the store's run, or only when CHEAPER than recomputing it
    # (latency + bytes / bandwidth + the lane's queued loads against the step-cost model's
    # recompute of those tokens at their depth).
    load: TierLoad = TierLoad.ALWAYS

    @property
    def enabled(self) -> bool:
        return self.capacity_gb > 0

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        require(
            self.policy in POLICIES,
            f"{prefix}.policy",
            self.policy,
            f"unknown eviction policy; known: {POLICIES.names()}",
        )
        for key, kind in (("write", TierWrite), ("load", TierLoad), ("link", LinkKind)):
            value = getattr(self, key)
            require(
                isinstance(value, kind),
                f"{prefix}.{key}",
                value,
                f"must be one of {[m.name for m in kind]}",
            )


@dataclass
class ClusterConfig(Sealed):
    """Replicas of the engine on one SimPy clock.

    Co-located: `replicas` engines, each prefilling and decoding its own requests. Disaggregated
    (`prefill_replicas` and `decode_replicas` both > 0): prefill engines compute a request's KV
    and first token, the KV crosses a link to a decode engine that generates the rest; `replicas`
    then stays at 1 (the split sizes the cluster).
    """

    section: ClassVar[str | None] = "cluster"
    # At most MAX_REPLICAS engines of each kind: 10^6 replicas hung the run while it built them.
    replicas: int = bounded(1, ge=1, le=MAX_REPLICAS, integer=True)
    prefill_replicas: int = bounded(0, ge=0, le=MAX_REPLICAS, integer=True)
    decode_replicas: int = bounded(0, ge=0, le=MAX_REPLICAS, integer=True)
    # GPUs of one node: replicas i and j share a node when i // gpus_per_node == j // gpus_per_node
    # (prefill replicas are numbered first, then decode replicas); a handover between them uses
    # NVLink, across nodes `cross_node_link`.
    gpus_per_node: int = bounded(8, ge=1, integer=True)
    cross_node_link: LinkKind = LinkKind.RDMA
    # Per GPU and direction. NVLink 4 on H100/H200 SXM: 900 GB/s total per GPU, 450 each way
    # (NVIDIA H200 datasheet); RDMA: one 400 Gb/s ConnectX-7 / NDR port per GPU = 50 GB/s (NVIDIA
    # DGX H100/H200: eight per node); TCP: one 100 GbE port = 12.5 GB/s. Latencies are our
    # assumptions of the order each fabric reports (µs for NVLink and RDMA, tens of µs for TCP).
    nvlink_gb_per_s: float = bounded(450.0, gt=0)
    nvlink_latency_us: float = bounded(3.0, ge=0)
    rdma_gb_per_s: float = bounded(50.0, gt=0)
    rdma_latency_us: float = bounded(10.0, ge=0)
    tcp_gb_per_s: float = bounded(12.5, gt=0)
    tcp_latency_us: float = bounded(50.0, ge=0)
    # Decode-side admission: a handover waits (its KV held on the prefill GPU) while every decode
    # replica's KV pool is at least this full, re-checking every handover_retry_ms.
    decode_max_kv_fraction: float = bounded(0.9, gt=0, le=1)
    handover_retry_ms: float = bounded(5.0, gt=0)
    # Out of repr (the run id) while off, so cluster runs keep the ids they had before it existed.
    shared_tier: SharedTierConfig = field(default_factory=SharedTierConfig, repr=False)

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0 or self.decode_replicas > 0

    @property
    def single(self) -> bool:
        """One co-located replica without a shared tier: the single-GPU simulation, unchanged."""
        return self.replicas == 1 and not self.disaggregated and not self.shared_tier.enabled

    @property
    def num_gpus(self) -> int:
        return self.prefill_replicas + self.decode_replicas if self.disaggregated else self.replicas

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        if not self.disaggregated:
            return
        require(
            self.prefill_replicas > 0,
            f"{prefix}.prefill_replicas",
            self.prefill_replicas,
            f"a P/D split with decode_replicas = {self.decode_replicas} needs prefill replicas",
        )
        require(
            self.decode_replicas > 0,
            f"{prefix}.decode_replicas",
            self.decode_replicas,
            f"a P/D split with prefill_replicas = {self.prefill_replicas} needs decode replicas",
        )
        require(
            self.replicas == 1,
            f"{prefix}.replicas",
            self.replicas,
            "a P/D cluster is sized by prefill_replicas and decode_replicas; leave replicas at 1",
        )


@dataclass
class RouterConfig(Sealed):
    """Which router places requests on replicas; a router with knobs of its own registers a
    subclass beside its code (cluster/routers.py)."""

    section: ClassVar[str | None] = "router"
    name: str = "session_affinity"

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        ROUTERS.check(f"{prefix}.name", self)


# Filled by cluster/routers.py; the factory is (RouterConfig, num_replicas) -> Router, and carries
# `keeps_sessions` (True: every turn of a session goes to one replica).
ROUTERS: Registry[RouterConfig, Any] = Registry(
    "router", "router", RouterConfig, provider="cachepilot_sim.cluster"
)


def known_routers() -> list[str]:
    return ROUTERS.names()


def router_config(name: str, **values: Any) -> RouterConfig:
    """The registered config class of router `name`, built with `values` (validated)."""
    return ROUTERS.entry(name).config(name=name, **values)


def cluster_id_suffix(cluster: ClusterConfig, router: RouterConfig) -> str:
    """What a run id adds for the cluster: nothing for one replica (whose runs keep the ids they
    had before clusters existed), else both sections."""
    if cluster.single:
        return ""
    shared = f"{cluster.shared_tier!r}" if cluster.shared_tier.enabled else ""
    return f"{cluster!r}{router!r}{shared}"
