"""Prefill/decode disaggregation (cluster/disagg.py) over the network model (cluster/network.py):
every request's KV crosses the network exactly once, decode never starts before the handover
lands, links contend, and decode-side memory pressure holds handovers back."""

from __future__ import annotations

from functools import cache

import pytest

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.cluster.network import Network, handover_us, link_fits
from cachepilot_sim.cluster.simulation import ClusterSimulation
from cachepilot_sim.components.request import Outcome
from cachepilot_sim.config import ClusterConfig, LinkKind, TraceConfig, router_config
from cachepilot_sim.result import SimResult
from cachepilot_sim.sim import make_simulation
from tests.conftest import make_sim_config
from tests.unit.test_cluster import replay_cfg


@cache
def pd_run(
    workload: str, decode_max_kv_fraction: float = 0.9
) -> tuple[ClusterSimulation, SimResult]:
    cluster = ClusterConfig(
        prefill_replicas=2,
        decode_replicas=2,
        gpus_per_node=2,  # prefill 0-1 on one node, decode 2-3 on another: RDMA between them
        decode_max_kv_fraction=decode_max_kv_fraction,
    )
    if workload == "replay":
        cfg = replay_cfg(limit=150, cluster=cluster, router=router_config("prefix_aware"))
    else:
        cfg = make_sim_config(trace=TraceConfig(enabled=False), cluster=cluster)
    sim = make_simulation(cfg)
    assert isinstance(sim, ClusterSimulation) and sim.pd is not None
    return sim, sim.run()


@pytest.mark.parametrize("workload", ["sessions", "replay"])
def test_every_request_kv_crosses_the_network_exactly_once(workload: str) -> None:
    sim, result = pd_run(workload)
    assert sim.pd is not None
    reqs = sim.clients.requests
    handed = [r for r in reqs if r.first_token_us >= 0 and r.output_tokens > 1]
    assert sorted(sim.pd.landed_us) == sorted(r.req_id for r in handed)
    assert sim.pd.network.num_transfers == len(handed) == result.metrics["handovers"]
    assert all(r.outcome != Outcome.PENDING for r in reqs)
    done = [r for r in reqs if r.outcome == Outcome.COMPLETED]
    assert all(r.generated == r.output_tokens for r in done)
    # All four GPUs sit on two nodes, prefill on one, decode on the other: RDMA only.
    moved = result.metrics["handover_gb_by_fabric"]
    assert moved["rdma"] > 0 and moved["nvlink"] == 0


@pytest.mark.parametrize("workload", ["sessions", "replay"])
def test_decode_never_starts_before_the_handover_lands(workload: str) -> None:
    sim, _ = pd_run(workload)
    assert sim.pd is not None
    for req in sim.clients.requests:
        landed = sim.pd.landed_us.get(req.req_id)
        if landed is None:
            continue
        half = sim.pd.decode_half[req.req_id]
        assert req.first_token_us <= landed <= half.admitted_us <= req.finish_us
        # the decode half prefills one token (the first output), the rest arrived
        assert half.prefill_tokens == 1 or half.num_preemptions > 0


def test_decode_halves_run_only_on_decode_replicas_and_prefill_halves_on_prefill() -> None:
    sim, result = pd_run("replay")
    frame = result.requests
    assert set(frame["replica"].to_list()) <= {0, 1}
    assert sum(result.metrics["decode_replica_requests"]) == len(sim.pd.landed_us)  # type: ignore[union-attr]


def test_decode_memory_pressure_holds_handovers_back_and_every_request_still_ends() -> None:
    sim, result = pd_run("replay", decode_max_kv_fraction=0.05)
    assert result.metrics["handover_wait_s"] > 0
    assert result.metrics["completed"] + result.metrics["rejected"] == result.metrics["requests"]


def test_transfer_time_is_latency_plus_bytes_over_bandwidth() -> None:
    fits = link_fits(ClusterConfig())
    assert handover_us(fits[LinkKind.RDMA], 0) == 0
    # 50 GB/s, 10 us: 1 GB in 20,000 us + 10 us
    assert handover_us(fits[LinkKind.RDMA], 10**9) == 20_010
    assert handover_us(fits[LinkKind.NVLINK], 10**9) < handover_us(fits[LinkKind.TCP], 10**9)


def test_handovers_from_one_gpu_queue_and_from_two_gpus_overlap() -> None:
    env = SimEnvironment()
    net = Network(env, ClusterConfig(gpus_per_node=1), num_gpus=4)
    ends: dict[str, int] = {}

    def send(name: str, src: int, dst: int):  # type: ignore[no-untyped-def]
        yield from net.transfer(src, dst, 10**9)
        ends[name] = int(env.now)

    for name, src, dst in (("a", 0, 2), ("b", 0, 3), ("c", 1, 3)):
        env.process(send(name, src, dst))
    env.run()
    one = 20_010
    # a and b share GPU 0's egress: b waits for a; c shares GPU 3's ingress with b, so it goes
    # first (it asked while b was still queued for GPU 0's egress) and b then waits for it too.
    assert ends["a"] == one and ends["c"] == one
    assert ends["b"] == 2 * one
    assert net.num_transfers == 3
    assert net.fabric(0, 1) == LinkKind.RDMA


def test_a_pd_split_without_decode_replicas_is_refused_naming_the_key() -> None:
    from cachepilot_sim.config import ConfigError

    with pytest.raises(ConfigError, match="cluster.decode_replicas"):
        ClusterConfig(prefill_replicas=2)
    with pytest.raises(ConfigError, match="cluster.replicas"):
        ClusterConfig(replicas=2, prefill_replicas=1, decode_replicas=1)
