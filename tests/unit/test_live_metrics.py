"""Live metrics (experiment/live.py): while a run goes on, the served endpoint has every metric the
Grafana dashboard queries, from cells in this process or on workers (prometheus_client's
multiprocess folder); publishing never changes a run, and its end state equals the run metrics."""

from __future__ import annotations

import io
import socket
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from cachepilot_sim.config import RunConfig, TelemetryConfig
from cachepilot_sim.experiment.grafana import grafana_dashboard, panel_metric_names
from cachepilot_sim.experiment.live import LiveMetrics, LivePublisher
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.sim import build
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
        prometheus_port=port, progress_every_events=500, live_metrics_every_s=0.5
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


def test_publishing_changes_nothing_and_ends_at_the_run_metrics() -> None:
    cfg = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=150))
    registry = CollectorRegistry()
    sim = build(cfg)
    publisher = LivePublisher(sim, LiveMetrics(registry), cell=3)
    ticks: list[int] = []

    def on_tick(t_us: int) -> None:
        ticks.append(t_us)
        publisher(t_us)

    published = sim.run(on_tick=on_tick, tick_us=500_000)
    publisher.finish()
    plain = build(cfg).run()
    assert published.trace.equals(plain.trace) and published.metrics == plain.metrics
    # One tick per half simulated second that had an event after it, in order, on the grid.
    assert len(ticks) >= 20 and ticks == sorted(set(ticks))
    assert all(t % 500_000 == 0 for t in ticks)
    m = plain.metrics
    labels = {"policy": cfg.policy.name, "seed": str(cfg.seed), "cell": "3"}

    def value(name: str, **extra: str) -> float | None:
        return registry.get_sample_value(name, labels | extra)

    assert value("cachepilot_sim_requests_total", outcome="completed") == m["completed"]
    assert value("cachepilot_sim_requests_total", outcome="rejected") == m["rejected"]
    assert value("cachepilot_sim_ttft_seconds_count") == m["completed"]
    assert value("cachepilot_sim_slo_met_total") == pytest.approx(
        m["sla_attainment"] * m["requests"]
    )
    for event, key in (
        ("hit", "hits"),
        ("reload", "reloads"),
        ("evict_offload", "evictions_offload"),
    ):
        assert value("cachepilot_sim_kv_events_total", event=event) == m[key]
    restore = sum(
        value("cachepilot_sim_restore_seconds_total", kind=k) or 0.0
        for k in ("reload", "recompute")
    )
    assert restore == pytest.approx(m["realized_restore_s"])
    assert value("cachepilot_sim_pcie_bytes_total", direction="d2h") == pytest.approx(
        m["pcie_d2h_gb"] * 1e9
    )
    done = plain.requests.filter(pl.col("outcome") == "completed")
    assert value("cachepilot_sim_ttft_seconds_sum") == pytest.approx(done["ttft_us"].sum() / 1e6)


def test_live_metrics_on_or_off_write_the_same_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers in multiprocess mode (jobs=2): trace parts, request tables and metrics.json are
    byte-identical (but for the run id, a digest of the whole config, telemetry included); the
    multiprocess folder is gone afterwards."""
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=120))
    values = {k: getattr(sim, k) for k in ("seed", "vram_gb", "model", "workload", "kv")}
    # A temp folder of this test's own: another xdist worker's run may hold one in /tmp meanwhile.
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    runs = {}
    for every_s in (0.0, 0.25):
        cfg = RunConfig(
            **values, compare_policies=["perc", "lru"], seeds=1, jobs=2, write_report=False,
            telemetry=TelemetryConfig(progress=False, live_metrics_every_s=every_s),
        )  # type: ignore[arg-type]  # fmt: skip
        out = tmp_path / f"every{every_s}"
        report = run_experiment(cfg, out, Console(file=io.StringIO()))
        runs[every_s] = (out, report["run_id"])
    (off, off_id), (on, on_id) = runs[0.0], runs[0.25]
    files = sorted(p.relative_to(off) for p in off.rglob("*.parquet"))
    assert len(files) >= 4  # two trace parts and two request tables at least
    for rel in files:
        assert (off / rel).read_bytes() == (on / rel).read_bytes(), rel
    on_json = (on / "metrics.json").read_text().replace(on_id, off_id)
    assert on_json == (off / "metrics.json").read_text()
    assert "cachepilot_sim_ttft_seconds_bucket" in (on / "metrics.prom").read_text()
    assert "cachepilot_sim_" not in (off / "metrics.prom").read_text()
    assert not list(own_tmp.glob("cachepilot-prom-*"))
