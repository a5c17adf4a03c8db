"""build(config) -> Simulation: wires the component processes onto one SimPy clock and runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import polars as pl
import simpy

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.cluster.replica import Replica
from cachepilot_sim.cluster.simulation import ClusterSimulation
from cachepilot_sim.components.clients import Clients
from cachepilot_sim.components.kv import SessionKvManager
from cachepilot_sim.components.replay_clients import ReplayClients
from cachepilot_sim.config import SimConfig, TraceFormat
from cachepilot_sim.cost.gpu_scaling import hardware_note
from cachepilot_sim.metrics import latency_metrics, outcome_metrics, restore_metrics
from cachepilot_sim.result import SimResult, SimulationError
from cachepilot_sim.rng import make_streams
from cachepilot_sim.run_loop import check_ended, finish_log, request_log, run_events, trace_meta
from cachepilot_sim.trace.events import TraceEvents
from cachepilot_sim.trace.recorder import make_recorder
from cachepilot_sim.workloads.replay import ReplayWorkload, load_replay
from cachepilot_sim.workloads.synthetic import SessionFactory


class Simulation:
    """One policy, one seed. Construct with `build`; `run()` once."""

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
        events = TraceEvents(self.recorder)
        # The engine (cluster/replica.py) is built first, the clients then, and the processes are
        # started in the diagram's order: clients, batcher (the scheduler queues each arrival
        # as it is put, without a process).
        engine = Replica(env, cfg, events)
        self.engine = engine
        self.pool, self.link, self.estimator = engine.pool, engine.link, engine.estimator
        self.policy, self.queue, self.kv = engine.policy, engine.queue, engine.kv
        self.scheduler, self.batcher = engine.scheduler, engine.batcher
        self.replay: ReplayWorkload | None = None
        self.clients: Clients | ReplayClients
        if cfg.replay.format == TraceFormat.NONE:
            factory = SessionFactory(cfg, streams)
            self.clients = Clients(env, cfg, streams, factory, self.scheduler, events)
            # A session that will not come back: its KV record may go (memory, not results).
            if isinstance(self.kv, SessionKvManager):
                self.clients.on_session_end.append(self.kv.close_session)
        else:  # trace replay: requests at trace times, KV shared by prefix hash
            self.replay = replay if replay is not None else load_replay(cfg, streams.arrivals)
            self.clients = ReplayClients(env, cfg, self.replay, self.scheduler)
        self.events = events
        # The per-request table, written to `requests_path` as requests end (request_log.py).
        self.log = request_log(self.clients, self.replay, requests_path)
        for process in (self.clients.arrivals(), *engine.processes()):
            env.process(process)

    def run(
        self,
        on_progress: Callable[[int], None] | None = None,
        every_events: int = 50_000,
        on_tick: Callable[[int], None] | None = None,
        tick_us: int = 1_000_000,
    ) -> SimResult:
        """Run to the end; `on_progress(num_events)` is called every `every_events` events and
        `on_tick(t_us)` once per simulated `tick_us` (the plain `env.run()` loop when both are
        None: reporting costs nothing unless asked for). Both only read the model's state."""
        if on_tick is not None:
            self._run_ticking(on_progress, every_events, on_tick, tick_us)
        else:
            run_events(self.env, on_progress, every_events)
        check_ended(self.clients, int(self.env.now), "model")
        if not self.pool.conserved():
            raise SimulationError("VRAM pool accounting broken at the end of the run")
        swap = self.engine.swap
        if swap is not None and (not swap.conserved() or swap.free_blocks != swap.capacity_blocks):
            raise SimulationError("CPU swap space not conserved, or held after the run")
        # The closing row carries the simulated duration (stale timers can outlive the last event).
        self.events.run_end(int(self.env.now))
        self.recorder.close(self.trace_meta())
        finish_log(self.log, self.clients)
        outcomes = self.log.metric_frame()
        return SimResult(
            self.metrics(outcomes), outcomes, self.log.frame, self.recorder.frame, self.log.out_path
        )

    def _run_ticking(
        self,
        on_progress: Callable[[int], None] | None,
        every_events: int,
        on_tick: Callable[[int], None],
        tick_us: int,
    ) -> None:
        """`env.run()`'s loop, calling `on_tick(t)` before the first event at or after each
        multiple t of `tick_us` (the state then is every event before t done; an idle stretch
        gives one call) and `on_progress` every `every_events` events."""
        step, peek = self.env.step, self.env.peek
        num_events, report_at = 0, every_events if on_progress is not None else -1
        tick_at = tick_us
        while True:
            t = peek()
            if t >= tick_at:
                if t == simpy.core.Infinity:
                    return
                on_tick(tick_at)
                tick_at = (int(t) // tick_us + 1) * tick_us
                continue
            step()
            num_events += 1
            if num_events == report_at:
                on_progress(num_events)  # type: ignore[misc]
                report_at += every_events

    def trace_meta(self) -> dict[str, Any]:
        """What a trace reader needs besides the rows (run_loop.trace_meta)."""
        return trace_meta(self.cfg, self.clients, self.pool.capacity_bytes)

    def metrics(self, frame: pl.DataFrame | None = None) -> dict[str, Any]:
        """Run metrics over the per-request table `frame` (its `METRIC_COLUMNS` suffice; by
        default the run's own, after `run`)."""
        frame = self.log.metric_frame() if frame is None else frame
        # The served span ends with the last answer; clients that were still thinking when the
        # request budget ran out keep the clock going afterwards without load.
        duration = max(int(frame["finish_us"].to_numpy().max(initial=0)), 1)
        kv = self.kv.stats
        eng = self.batcher.stats
        out: dict[str, Any] = {"policy": self.cfg.policy.name, "seed": self.cfg.seed}
        out |= outcome_metrics(frame, duration)
        out |= latency_metrics(frame)
        out |= restore_metrics(asdict(kv))
        out |= {
            # GPU time converting KV for a quantized CPU tier (kv.offload_dtype_bytes); 0 otherwise.
            "kv_convert_s": kv.convert_us / 1e6,
            # KV the CPU store dropped to make room: restored by recompute when needed again.
            "cpu_drops": kv.cpu_drops,
        }
        out |= {k: v for k, v in asdict(kv).items() if k.startswith(("evictions_", "evicted_"))}
        out |= {
            "hits": kv.hits,
            "reloads": kv.reloads,
            "recomputes": kv.recomputes,
            "preemptions": kv.preemptions,
            # Of those: KV copied to the engine's CPU swap space, and dropped to be recomputed.
            "cpu_swaps": eng.cpu_swaps,
            "soft_resets": kv.preemptions - eng.cpu_swaps,
            # Lazy CUDA-graph captures (engine.graph_mode LAZY) and the time they stalled steps.
            "graph_captures": eng.graph_captures,
            "graph_capture_s": eng.graph_capture_us / 1e6,
            "promoted": self.queue.num_promoted,
            "sessions": self.clients.num_sessions,
            "vram_kv_util_mean": eng.kv_byte_us / duration / self.pool.capacity_bytes,
            "vram_kv_util_peak": eng.kv_peak_bytes / self.pool.capacity_bytes,
            "kv_pool_gb": self.pool.capacity_bytes / 1e9,
            "gpu_busy_frac": eng.busy_us / duration,
            "iterations": eng.iterations,
            "pcie_d2h_gb": self.link.bytes_moved["d2h"] / 1e9,
            "pcie_h2d_gb": self.link.bytes_moved["h2d"] / 1e9,
            "events": self.recorder.num_rows,
        }
        out |= self.policy.metrics()
        gate = self.batcher.gate
        if gate is not None:
            out |= {
                "admission_deferred": gate.num_deferred,
                "admission_rejected": gate.num_rejected,
            }
        out |= self.kv.metrics()
        out |= hardware_note(self.cfg)  # nothing for one H200: its metrics stay as they were
        if self.replay is not None:
            out |= {
                "trace_rows_skipped": self.replay.table.num_skipped,
                "trace_rows_skipped_by_reason": dict(self.replay.table.skipped),
            }
        return out


def build(
    cfg: SimConfig,
    trace_dir: Path | None = None,
    replay: ReplayWorkload | None = None,
    requests_path: Path | None = None,
) -> Simulation:
    """The single-GPU simulation of `cfg`; `replay` replaces the configured trace with a prepared
    request list (ground-truth validation builds one from a real engine's requests); the
    per-request table goes to `requests_path` (Parquet) when given, else stays in memory. A
    cluster config is refused: `make_simulation` builds either."""
    if not cfg.cluster.single:
        raise ValueError("build() runs one engine; make_simulation() also builds a cluster")
    return Simulation(cfg, trace_dir, replay, requests_path)


def make_simulation(
    cfg: SimConfig,
    trace_dir: Path | None = None,
    replay: ReplayWorkload | None = None,
    requests_path: Path | None = None,
) -> Simulation | ClusterSimulation:
    """One engine (`build`) or the cluster `cfg.cluster` describes (cluster/simulation.py)."""
    if cfg.cluster.single:
        return Simulation(cfg, trace_dir, replay, requests_path)
    return ClusterSimulation(cfg, trace_dir, replay, requests_path)
