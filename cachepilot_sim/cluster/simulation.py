"""A cluster of engine replicas on one SimPy clock: one client population, one router, N engines.
The single-GPU `Simulation` (sim.py) is what `build` returns for one replica; this is the rest."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.cluster.disagg import Disaggregation
from cachepilot_sim.cluster.metrics import cluster_metrics
from cachepilot_sim.cluster.network import Network
from cachepilot_sim.cluster.replica import Replica
from cachepilot_sim.cluster.router import ReplicaPort, RequestRouter
from cachepilot_sim.cluster.routers import make_router
from cachepilot_sim.cluster.shared_tier import SharedKvTier
from cachepilot_sim.components.clients import Clients
from cachepilot_sim.components.replay_clients import ReplayClients
from cachepilot_sim.config import SimConfig, TraceFormat
from cachepilot_sim.request_log import ExtraColumn
from cachepilot_sim.result import SimResult, SimulationError
from cachepilot_sim.rng import make_streams
from cachepilot_sim.run_loop import check_ended, finish_log, request_log, run_events, trace_meta
from cachepilot_sim.trace.events import TraceEvents
from cachepilot_sim.trace.recorder import make_recorder
from cachepilot_sim.workloads.replay import ReplayWorkload, load_replay
from cachepilot_sim.workloads.synthetic import SessionFactory


class ClusterSimulation:
    """`cluster.replicas` engines behind `router`; one policy, one seed. `run()` once.

    Every replica gets the whole `SimConfig` (each is one GPU of `vram_gb`). The trace is one
    recorder shared by all replicas: its request rows are exact, its pool rows mix replicas
    (the schema has no replica column), so trace-derived pool figures are cluster sums at best.
    """

    def __init__(
        self,
        cfg: SimConfig,
        trace_dir: Path | None = None,
        replay: ReplayWorkload | None = None,
        requests_path: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.env = SimEnvironment()
        env = self.env
        streams = make_streams(cfg.seed)
        t = cfg.trace
        self.recorder = make_recorder(trace_dir, t.enabled, t.chunk_rows, t.session_every)
        self.events = TraceEvents(self.recorder)
        c = cfg.cluster
        network = Network(env, c, c.num_gpus) if c.disaggregated or c.shared_tier.enabled else None
        self.shared: SharedKvTier | None = None  # one network carries handovers and the tier's
        if network is not None and c.shared_tier.enabled:
            self.shared = SharedKvTier(env, cfg, network)
        tier = self.shared
        self.replicas = [
            Replica(env, cfg, self.events, None if tier is None else tier.port(i))
            for i in range(c.num_gpus)
        ]
        # Co-located: the router places on every replica. P/D: on the prefill replicas, whose
        # ports start each request's journey through the network to a decode replica.
        self.pd: Disaggregation | None = None
        ports: list[ReplicaPort] = list(self.replicas)
        if cfg.cluster.disaggregated and network is not None:
            self.pd = Disaggregation(env, cfg, self.replicas, network)
            ports = list(self.pd.ports)
        self.router = RequestRouter(env, make_router(cfg.router, len(ports)), ports)
        self.replay: ReplayWorkload | None = None
        self.clients: Clients | ReplayClients
        if cfg.replay.format == TraceFormat.NONE:
            factory = SessionFactory(cfg, streams)
            # Kept: the cluster's tests read every request after the run.
            self.clients = Clients(
                env, cfg, streams, factory, self.router, self.events, keep_requests=True
            )
        else:
            self.replay = replay if replay is not None else load_replay(cfg, streams.arrivals)
            self.clients = ReplayClients(env, cfg, self.replay, self.router)
        where = self.router.placement  # the per-request table's `replica`: where it was placed
        placed: ExtraColumn = (pl.Int32(), lambda r: where.get(r.req_id, -1))
        self.log = request_log(self.clients, self.replay, requests_path, {"replica": placed})
        env.process(self.clients.arrivals())
        for replica in self.replicas:
            for process in replica.processes():
                env.process(process)

    def run(
        self,
        on_progress: Callable[[int], None] | None = None,
        every_events: int = 50_000,
        on_tick: Callable[[int], None] | None = None,
        tick_us: int = 1_000_000,
    ) -> SimResult:
        """Run to the end (as `Simulation.run`); every request completed or rejected, every
        replica's pool conserved, or SimulationError. `on_tick` (live per-tick metrics, which
        read one engine's state) is refused: a cluster reports progress only."""
        if on_tick is not None:
            raise ValueError(f"live per-tick metrics ({tick_us} us) read one engine's state")
        run_events(self.env, on_progress, every_events)
        check_ended(self.clients, int(self.env.now), "cluster")
        broken = [i for i, r in enumerate(self.replicas) if not r.pool.conserved()]
        if broken:
            raise SimulationError(f"VRAM pool accounting broken on replicas {broken}")
        if self.shared is not None and not self.shared.conserved():
            raise SimulationError("shared KV tier accounting broken")
        self.events.run_end(int(self.env.now))
        self.recorder.close(self.trace_meta())
        finish_log(self.log, self.clients)
        outcomes = self.log.metric_frame()
        return SimResult(
            self.metrics(outcomes), outcomes, self.log.frame, self.recorder.frame, self.log.out_path
        )

    def itl_gaps(self) -> dict[int, int]:
        """Inter-token gaps (us -> tokens) of every replica's engine, merged."""
        out: dict[int, int] = {}
        for r in self.replicas:
            for gap, n in r.batcher.stats.itl_gaps.items():
                out[gap] = out.get(gap, 0) + n
        return dict(sorted(out.items()))

    def trace_meta(self) -> dict[str, Any]:
        """As `Simulation.trace_meta`, with the cluster's pool (the sum) and size."""
        pool_bytes = sum(r.pool.capacity_bytes for r in self.replicas)
        return trace_meta(self.cfg, self.clients, pool_bytes) | {
            "replicas": len(self.replicas),
            "router": self.cfg.router.name,
        }

    def metrics(self, frame: pl.DataFrame | None = None) -> dict[str, Any]:
        """The single-GPU run metrics summed (counts, bytes) or averaged (utilizations) over the
        replicas, plus the cluster's own keys (cluster/metrics.py), over the per-request table
        `frame` (by default the run's own, after `run`)."""
        frame = self.log.metric_frame() if frame is None else frame
        out = cluster_metrics(
            self.cfg, frame, self.replicas, self.router, self.clients, self.recorder.num_rows
        )
        if self.pd is not None:
            out |= self.pd.metrics()
        if self.shared is not None:
            out |= self.shared.metrics(int(out.get("prefix_lookup_blocks", 0)))
        if self.replay is not None:
            out |= {
                "trace_rows_skipped": self.replay.table.num_skipped,
                "trace_rows_skipped_by_reason": dict(self.replay.table.skipped),
            }
        return out
