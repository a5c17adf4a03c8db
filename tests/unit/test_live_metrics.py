"""Live metrics: while a run goes on, the served endpoint has every metric the Grafana dashboard
queries (run metrics so far, not only progress), from cells in this process or on workers."""

from __future__ import annotations

import io
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from cachepilot_sim.config import RunConfig, TelemetryConfig
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.experiment.telemetry import grafana_dashboard, panel_metric_names
from tests.conftest import make_sim_config, make_workload

NUM_REQUESTS = 1200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, dict[str, float]]:
    """Metric name -> {policy: value}; empty when the server is not up (yet or any more)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return {}
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[s.labels.get("policy", "")] = s.value
    return out


@pytest.mark.parametrize("jobs", [1, 2])
def test_endpoint_serves_every_dashboard_metric_mid_run(jobs: int, tmp_path: Path) -> None:
    port = free_port()
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=NUM_REQUESTS))
    values = {k: getattr(sim, k) for k in ("seed", "vram_gb", "model", "workload", "kv")}
    telemetry = TelemetryConfig(
        prometheus_port=port, progress_every_events=500, live_metrics_every_s=0.0
    )
    cfg = RunConfig(
        **values, compare_policies=["perc", "lru"], seeds=1, jobs=jobs, write_report=False,
        write_requests=False, telemetry=telemetry,
    )  # type: ignore[arg-type]  # fmt: skip
    run = threading.Thread(target=run_experiment, args=(cfg, tmp_path, Console(file=io.StringIO())))
    run.start()
    wanted = panel_metric_names(grafana_dashboard())
    found: set[str] = set()
    mid_run = False
    while run.is_alive() and not mid_run:
        metrics = scrape(port)
        done = metrics.get("cachepilot_progress_requests_done", {})
        found = wanted & set(metrics)
        mid_run = found == wanted and any(0 < v < NUM_REQUESTS for v in done.values())
        time.sleep(0.05)
    run.join()
    assert mid_run, f"never all dashboard metrics mid-run; missing {sorted(wanted - found)}"


def test_mid_run_metric_snapshots_do_not_change_the_run() -> None:
    from cachepilot_sim.experiment.progress import progress_hook
    from cachepilot_sim.sim import build

    cfg = make_sim_config(workload=make_workload(num_requests=80))
    reports: list = []
    sim = build(cfg)
    hook = progress_hook(sim, 0, reports.append, metrics_every_s=0.0)
    watched = sim.run(hook, every_events=50)
    plain = build(cfg).run()
    assert sum(r.metrics is not None for r in reports) >= 3
    assert watched.trace.equals(plain.trace) and watched.metrics == plain.metrics
    snapshots = [r.metrics for r in reports if r.metrics is not None]
    assert snapshots[0]["completed"] <= snapshots[-1]["completed"] <= plain.metrics["completed"]
