"""Telemetry out: Prometheus text exposition of run metrics, live progress, a Grafana dashboard.

Every numeric run metric of every (policy, seed) cell becomes a gauge `cachepilot_<metric>` with
labels `policy` and `seed`, written to `metrics.prom` in the run folder (Prometheus text format,
for node_exporter's textfile collector or a Pushgateway). While a run progresses, the
`cachepilot_progress_*` gauges (simulated seconds, requests done, events, events per wall second)
and the live simulated-time metrics `cachepilot_sim_*` (experiment/live.py; from worker processes
through prometheus_client's multiprocess folder) are updated and, when `telemetry.prometheus_port`
is set, served on 127.0.0.1 only. The Grafana dashboard (experiment/grafana.py) queries these.
Wall-clock time is read here, for rates shown to people, never inside the simulated model.

    python -m cachepilot_sim.experiment.telemetry grafana [--out dashboard.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile
from prometheus_client.multiprocess import MultiProcessCollector

from cachepilot_sim.experiment.grafana import grafana_dashboard
from cachepilot_sim.experiment.live import LiveMetrics, LivePublisher, tick_us
from cachepilot_sim.experiment.progress import CellProgress, progress_hook

PREFIX = "cachepilot_"
LABELS = ("policy", "seed")
PROM_FILE = "metrics.prom"
# Off a terminal (a log, CI, `| tee`), a plain progress line at most this often (wall seconds).
PLAIN_EVERY_S = 10.0
# Live progress of the cell being simulated: (name, help).
PROGRESS = (
    ("progress_sim_seconds", "simulated time reached, seconds"),
    ("progress_requests_done", "requests completed or rejected so far"),
    ("progress_requests_total", "requests the run will issue"),
    ("progress_events", "SimPy events processed so far"),
    ("progress_events_per_wall_second", "SimPy events per wall-clock second"),
)


def metric_name(key: str) -> str:
    """Prometheus name of a run metric key (`ttft_p95_s` -> `cachepilot_ttft_p95_s`)."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class Telemetry:
    """One registry per run: progress gauges, run-metric gauges, optional 127.0.0.1 server."""

    def __init__(self, port: int = 0) -> None:
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        for name, doc in PROGRESS:
            self._gauge(PREFIX + name, doc)
        self.server: Any = None
        if port:
            from prometheus_client import start_http_server

            try:
                self.server, _ = start_http_server(port, addr="127.0.0.1", registry=self.registry)
            except OSError as err:  # busy port (another run, another sweep job): run unserved
                print(
                    f"cachepilot_sim: not serving metrics on 127.0.0.1:{port}: {err}",
                    file=sys.stderr,
                )
        self._t0 = time.perf_counter()

    def _gauge(self, name: str, doc: str) -> Gauge:
        if name not in self._gauges:
            self._gauges[name] = Gauge(name, doc, LABELS, registry=self.registry)
        return self._gauges[name]

    def progress(
        self,
        policy: str,
        seed: int,
        sim_us: int,
        done: int,
        total: int,
        events: int,
        started: float | None = None,
    ) -> float:
        """Update the live progress gauges of one cell whose wall clock started at `started`
        (perf_counter; default: this object's creation); returns events per wall second."""
        labels = {"policy": policy, "seed": str(seed)}
        wall = max(time.perf_counter() - (self._t0 if started is None else started), 1e-9)
        values = (sim_us / 1e6, done, total, events, events / wall)
        for (name, _), value in zip(PROGRESS, values, strict=True):
            self._gauges[PREFIX + name].labels(**labels).set(value)
        return events / wall

    def record_cells(self, cells: Sequence[dict[str, Any]]) -> None:
        """One gauge per numeric metric; NaN (undefined, e.g. no LRU baseline) is left out."""
        for cell in cells:
            labels = {"policy": str(cell["policy"]), "seed": str(cell["seed"])}
            for key, value in cell.items():
                if key in LABELS or isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                if math.isnan(value):
                    continue
                self._gauge(metric_name(key), f"run metric {key}").labels(**labels).set(value)

    def write(self, out_dir: Path) -> Path:
        """Write the exposition to `out_dir/metrics.prom` (atomically: temp file + rename)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / PROM_FILE
        write_to_textfile(str(path), self.registry)
        return path

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None


class RunMonitor:
    """Progress of a run's cells: a rich bar (only when the console is a terminal and progress is
    on) and the Prometheus progress gauges; at the end, the run metrics and `metrics.prom`."""

    def __init__(self, cfg: Any, console: Any = None) -> None:
        from rich.console import Console

        self.cfg = cfg  # a TelemetryConfig
        self.console = console or Console()
        self.telemetry = Telemetry(cfg.prometheus_port)
        self.bar: Any = None
        if cfg.progress and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            # Requests done of all, simulated seconds reached, requests per wall second, ETA.
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("requests, sim {task.fields[sim_s]:,.0f} s"),
                TextColumn("{task.fields[rate]:,.0f} req/s"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.bar.start()
        # Not a terminal: a plain line now and then instead of a bar (`plain_line`).
        self.plain = bool(cfg.progress) and self.bar is None
        self._t0 = time.perf_counter()
        self._last_plain = self._t0
        self._sim_s: dict[int, float] = {}
        self._overall: Any = None
        self._cells: list[tuple[str, int, int]] = []
        self._tasks: dict[int, Any] = {}
        self._started: dict[int, float] = {}
        self._done: dict[int, int] = {}
        self._totals: dict[int, int] = {}
        self._live: LiveMetrics | None = None
        self._multiprocess_dir: str | None = None

    @property
    def live(self) -> bool:
        """Whether anyone watches progress while cells run (a terminal bar or a served port)."""
        return self.bar is not None or self.telemetry.server is not None

    def add_cells(self, cells: Sequence[tuple[str, int, int]]) -> None:
        """Announce every (policy, seed, requests) cell of the run, in cell order: the overall bar
        counts all of them; a cell's own bar shows while it runs."""
        self._cells = list(cells)
        if self.bar is not None and self._overall is None:
            total = sum(n for _, _, n in cells)
            self._overall = self.bar.add_task(
                f"all {len(cells)} cells", total=total, sim_s=0.0, rate=0.0
            )

    def report(self, p: CellProgress) -> None:
        """One cell's progress (from this process or a worker): gauges, its bar, the overall bar."""
        start = self._started.setdefault(p.index, time.perf_counter())
        self.telemetry.progress(
            p.policy, p.seed, p.sim_us, p.done, p.total, p.events, started=start
        )
        self._done[p.index] = p.done
        self._totals[p.index] = p.total
        self._sim_s[p.index] = p.sim_us / 1e6
        if self.bar is None:
            if self.plain:
                self._plain_report()
            return
        task = self._tasks.get(p.index)
        if task is None:
            task = self.bar.add_task(
                f"{p.policy} seed {p.seed}", total=p.total, sim_s=0.0, rate=0.0
            )
            self._tasks[p.index] = task
        # With the overall bar, a finished cell's own bar goes away: only running cells show.
        visible = p.done < p.total or self._overall is None
        rate = p.done / max(time.perf_counter() - start, 1e-9)
        self.bar.update(task, completed=p.done, sim_s=p.sim_us / 1e6, rate=rate, visible=visible)
        if self._overall is not None:
            # A replay's cell knows its request count once built: the bar's total follows.
            done, total = self._progress_totals()
            rate = done / max(time.perf_counter() - self._t0, 1e-9)
            sim_s = sum(self._sim_s.values())
            self.bar.update(self._overall, completed=done, total=total, sim_s=sim_s, rate=rate)

    def _progress_totals(self) -> tuple[int, int]:
        """Requests done and requests in all announced cells (a cell's own count once known)."""
        total = sum(self._totals.get(i, n) for i, (_, _, n) in enumerate(self._cells))
        return sum(self._done.values()), max(total, sum(self._totals.values()))

    def _plain_report(self) -> None:
        """At most every PLAIN_EVERY_S: one line with cells, requests, simulated time, rate, ETA."""
        now = time.perf_counter()
        if now - self._last_plain < PLAIN_EVERY_S:
            return
        self._last_plain = now
        self.console.print(
            plain_line(self._progress_totals(), len(self._cells), self._sim_s, now - self._t0),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    @property
    def publishes(self) -> bool:
        """Whether cells publish live metrics (experiment/live.py): with a tick interval, when
        they are served or go to metrics.prom."""
        wanted = self.telemetry.server is not None or self.cfg.prometheus_file
        return self.live_interval_us > 0 and wanted

    @property
    def live_interval_us(self) -> int:
        """Simulated microseconds between live metric ticks (0: none)."""
        return tick_us(self.cfg.live_metrics_every_s)

    def hook(self, sim: Any, index: int = 0) -> Any:
        """The `on_progress` callback for a Simulation run in this process (cell `index`)."""
        return progress_hook(sim, index, self.report)

    def publisher(self, sim: Any, index: int = 0) -> LivePublisher | None:
        """The live publisher (`on_tick`) of a Simulation run in this process, or None."""
        if not self.publishes:
            return None
        if self._live is None:
            self._live = LiveMetrics(self.telemetry.registry)
        return LivePublisher(sim, self._live, index)

    def worker_metrics_dir(self) -> str | None:
        """The multiprocess folder that worker processes write live metrics to (made on first
        call, collected by this registry, removed by `close`); None when nothing publishes."""
        if not self.publishes:
            return None
        if self._multiprocess_dir is None:
            self._multiprocess_dir = tempfile.mkdtemp(prefix="cachepilot-prom-")
            MultiProcessCollector(self.telemetry.registry, path=self._multiprocess_dir)
        return self._multiprocess_dir

    def close(self, cells: Sequence[dict[str, Any]], out_dir: Path | None) -> Path | None:
        """Stop the bar and the server; write metrics.prom when asked for."""
        if self.bar is not None:
            self.bar.stop()
        self.telemetry.record_cells(cells)
        path = None
        if out_dir is not None and self.cfg.prometheus_file:
            path = self.telemetry.write(out_dir)
        self.telemetry.close()
        if self._multiprocess_dir is not None:
            shutil.rmtree(self._multiprocess_dir, ignore_errors=True)
            self._multiprocess_dir = None
        return path


def plain_line(
    requests: tuple[int, int], num_cells: int, sim_s: dict[int, float], wall_s: float
) -> str:
    """`progress: 12,000/60,000 requests (20 %) in 5 cells, sim 1,234 s, 410 req/s, elapsed
    0:00:29, ETA 0:01:57`: the plain-text progress line (no ETA before a request is done)."""
    done, total = requests
    rate = done / max(wall_s, 1e-9)
    eta = _clock((total - done) / rate) if done and rate > 0 else "unknown"
    share = f" ({done / total:.0%})" if total else ""
    return (
        f"progress: {done:,}/{total:,} requests{share} in {num_cells} cells, sim "
        f"{sum(sim_s.values()):,.0f} s, {rate:,.0f} req/s, elapsed {_clock(wall_s)}, ETA {eta}"
    )


def _clock(seconds: float) -> str:
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cachepilot_sim.experiment.telemetry", description=__doc__
    )
    ap.add_argument("what", choices=["grafana"])
    ap.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    args = ap.parse_args(argv)
    text = json.dumps(grafana_dashboard(), indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            write_text_atomic(args.out, text)
        except OSError as err:  # an unwritable --out: named, no traceback, nothing half-written
            print(f"{ap.prog}: {args.out}: cannot write ({err.strerror})", file=sys.stderr)
            return 2
    return 0


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
