"""Live metrics in simulated time: once per `telemetry.live_metrics_every_s` simulated seconds, a
cell's publisher reads the model's state (never changes it) and sets Prometheus gauges, counters
and histograms labelled by policy, seed and cell: TTFT / TPOT / E2E of the requests finished since
the last tick, queue depth, KV bytes per tier, cache outcomes, eviction bytes, restore seconds,
PCIe bytes and busy time. The Grafana dashboard (experiment/grafana.py) queries these names.

A tick costs a few dozen metric updates plus one look at each request still in flight, so a run
pays little for it (docs/observability.md has the measurement). Cells on worker processes use
prometheus_client's multiprocess mode: each worker writes its values to files in one per-run
folder (`RunMonitor.worker_metrics_dir`) and the endpoint of the main process collects them.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values

from cachepilot_sim.clock import s_to_us
from cachepilot_sim.components.request import Outcome, Request
from cachepilot_sim.entry import worker_setup
from cachepilot_sim.experiment.lifecycle import exit_with_parent

PREFIX = "cachepilot_sim_"
LABELS = ("policy", "seed", "cell")
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS_S = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
E2E_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# (event label, KvStats field) counted by cachepilot_sim_kv_events_total.
KV_EVENTS = (
    ("hit", "hits"),
    ("reload", "reloads"),
    ("recompute", "recomputes"),
    ("preempt", "preemptions"),
    ("evict_offload", "evictions_offload"),
    ("evict_drop", "evictions_drop"),
    ("cpu_drop", "cpu_drops"),
)
DIRECTIONS = ("h2d", "d2h")


class LiveMetrics:
    """The live metric families of one process: registered in `registry` when the cells run in
    the process that serves them, unregistered on a worker in multiprocess mode (the values go
    to the multiprocess folder). Gauges keep the largest value across processes, which is the
    cell's own: a (policy, seed, cell) label set is written by one process only."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        def gauge(name: str, doc: str, *extra: str) -> Gauge:
            labels = LABELS + extra
            return Gauge(PREFIX + name, doc, labels, registry=registry, multiprocess_mode="max")

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(PREFIX + name, doc, LABELS + extra, registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, LABELS, registry=registry, buckets=buckets)

        self.time_s = gauge("time_seconds", "simulated time of the last tick, seconds")
        self.queue_depth = gauge("queue_depth", "requests waiting for admission")
        self.running = gauge("running_requests", "sequences in the running batch")
        self.kv_used = gauge("kv_used_bytes", "KV bytes held (gpu: incl. copies in flight)", "tier")
        self.kv_util = gauge("kv_utilization", "KV bytes held / the tier's capacity", "tier")
        self.requests = counter("requests", "requests that ended, by outcome", "outcome")
        self.slo_met = counter("slo_met", "completed requests within their TTFT and TPOT SLOs")
        self.kv_events = counter("kv_events", "cache outcomes and evictions", "event")
        self.evicted_bytes = counter("evicted_bytes", "KV bytes evicted from the GPU", "action")
        self.restore_s = counter("restore_seconds", "realized restore time paid, s", "kind")
        self.expected_cost_s = counter(
            "expected_evict_cost_seconds", "sum of P(resume) x restore cost at eviction, s"
        )
        self.pcie_bytes = counter("pcie_bytes", "bytes moved over PCIe", "direction")
        self.pcie_busy_s = counter("pcie_busy_seconds", "PCIe lane busy time, s", "direction")
        self.ttft = histogram("ttft_seconds", "time to first token, completed", TTFT_BUCKETS_S)
        self.tpot = histogram("tpot_seconds", "mean s per token after the first", TPOT_BUCKETS_S)
        self.e2e = histogram("e2e_seconds", "arrival to last token, completed", E2E_BUCKETS_S)


class LivePublisher:
    """Publishes one Simulation's state as `on_tick(t_us)` of `Simulation.run`; `finish()` after
    the run publishes the end state, where every counter equals its run metric."""

    def __init__(self, sim: Any, metrics: LiveMetrics, cell: int) -> None:
        self.sim = sim
        self._ttft_slo_us: list[int] = list(sim.clients.ttft_slo_us)
        labels = (sim.cfg.policy.name, str(sim.cfg.seed), str(cell))
        m = metrics
        # The gauges in the order __call__ computes their values.
        self._gauges = [g.labels(*labels) for g in (m.time_s, m.queue_depth, m.running)]
        self._gauges += [m.kv_used.labels(*labels, "gpu"), m.kv_util.labels(*labels, "gpu")]
        self._gauges += [m.kv_used.labels(*labels, "cpu"), m.kv_util.labels(*labels, "cpu")]
        self._gauge_values = [-1.0] * len(self._gauges)
        self._completed = m.requests.labels(*labels, "completed")
        self._rejected = m.requests.labels(*labels, "rejected")
        self._slo_met = m.slo_met.labels(*labels)
        self._ttft, self._tpot, self._e2e = (h.labels(*labels) for h in (m.ttft, m.tpot, m.e2e))
        # Counters mirrored from cumulative model counters: (child, read the cumulative value).
        kv, link = sim.kv.stats, sim.link
        self._mirrors: list[tuple[Any, Any]] = [
            (m.kv_events.labels(*labels, name), lambda f=field: getattr(kv, f))
            for name, field in KV_EVENTS
        ]
        self._mirrors += [
            (m.evicted_bytes.labels(*labels, "offload"), lambda: kv.evicted_bytes_offload),
            (m.evicted_bytes.labels(*labels, "drop"), lambda: kv.evicted_bytes_drop),
            (m.restore_s.labels(*labels, "reload"), lambda: kv.realized_reload_us / 1e6),
            (m.restore_s.labels(*labels, "recompute"), lambda: kv.realized_recompute_us / 1e6),
            (m.expected_cost_s.labels(*labels), lambda: kv.expected_evict_cost_us / 1e6),
        ]
        for d in DIRECTIONS:
            self._mirrors += [
                (m.pcie_bytes.labels(*labels, d), lambda d=d: link.bytes_moved[d]),
                (m.pcie_busy_s.labels(*labels, d), lambda d=d: link.busy_us[d] / 1e6),
            ]
        self._mirrored = [0.0] * len(self._mirrors)
        self._ended: list[Request] = []  # ended since the last tick (the clients hand them over)
        sim.clients.on_end.append(self._ended.append)

    def __call__(self, t_us: int) -> None:
        """Publish the state at simulated time `t_us` (every event before it has run); a metric
        is written only when its value changed (a tick of an idle stretch writes one gauge)."""
        sim, pool, cpu = self.sim, self.sim.pool, self.sim.kv.cpu
        gpu_bytes = pool.used_bytes + pool.in_flight_bytes
        gauges = (
            t_us / 1e6,
            len(sim.queue),
            sim.batcher.n,
            gpu_bytes,
            gpu_bytes / max(pool.capacity_bytes, 1),
            cpu.used_bytes,
            cpu.used_bytes / max(cpu.capacity_bytes, 1),
        )
        for i, (child, value) in enumerate(zip(self._gauges, gauges, strict=True)):
            if value != self._gauge_values[i]:
                child.set(value)
                self._gauge_values[i] = value
        for i, (child, read) in enumerate(self._mirrors):
            value = read()
            if value > self._mirrored[i]:
                child.inc(value - self._mirrored[i])
                self._mirrored[i] = value
        self._observe_ended()

    def _observe_ended(self) -> None:
        """Observe the latencies of requests that ended since the last tick, in the order they
        were sent."""
        ended, self._ended[:] = sorted(self._ended, key=lambda r: r.req_id), []
        for r in ended:
            if r.outcome == Outcome.REJECTED:
                self._rejected.inc()
            else:
                self._observe_completed(r)

    def _observe_completed(self, r: Request) -> None:
        # The same definitions as metrics.request_frame (TTFT, TPOT, SLO met).
        ttft_us = r.first_token_us - r.arrival_us
        tpot_us = (r.finish_us - r.first_token_us) / (r.generated - 1) if r.generated > 1 else 0.0
        self._completed.inc()
        self._ttft.observe(ttft_us / 1e6)
        if r.generated > 1:
            self._tpot.observe(tpot_us / 1e6)
        self._e2e.observe((r.finish_us - r.arrival_us) / 1e6)
        if ttft_us <= self._ttft_slo_us[r.class_index] and tpot_us <= r.tpot_slo_us:
            self._slo_met.inc()

    def finish(self) -> None:
        """Publish the end state (after `Simulation.run`): every request has ended."""
        self(int(self.sim.env.now))


def tick_us(every_s: float) -> int:
    """Simulated microseconds between ticks for `telemetry.live_metrics_every_s` (0: none)."""
    return 0 if every_s <= 0 else max(1, s_to_us(every_s))


_process_metrics: LiveMetrics | None = None


def process_metrics() -> LiveMetrics:
    """This worker process's one set of live metric families (made on first use: two sets in
    one process would write the same multiprocess file keys from two caches)."""
    global _process_metrics
    if _process_metrics is None:
        _process_metrics = LiveMetrics(None)
    return _process_metrics


def init_worker(multiprocess_dir: str | None, parent: int | None = None) -> None:
    """Initializer of a run's worker processes: exit with the parent, and with a folder, put
    every metric value made from now on in it (prometheus_client's multiprocess mode; the
    value class is chosen again because the module picked it when it was imported)."""
    # Exit with the pool's pid (a worker reparented while starting exits too), and leave a
    # Ctrl-C or a closed terminal to the run, which stops its workers (entry.worker_setup).
    if parent is None:
        exit_with_parent()
    else:
        worker_setup(parent)
    if multiprocess_dir is not None:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiprocess_dir
        values.ValueClass = values.get_value_class()
