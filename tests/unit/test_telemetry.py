"""Prometheus exposition, the 127.0.0.1 server, the Grafana dashboard, and progress reporting."""

from __future__ import annotations

import io
import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from cachepilot_sim.config import ConfigError, RunConfig, TelemetryConfig
from cachepilot_sim.experiment import telemetry as telemetry_mod
from cachepilot_sim.experiment.grafana import grafana_dashboard, panel_metric_names
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.experiment.telemetry import RunMonitor, Telemetry, metric_name, plain_line
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "cachepilot_dashboard.json"


def tiny_config(**telemetry: object) -> RunConfig:
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=40))
    values = {k: getattr(sim, k) for k in ("seed", "vram_gb", "model", "workload", "kv")}
    # jobs=1: the cells run in this process, so the progress gauges are recorded too.
    return RunConfig(
        **values, compare_policies=["perc", "lru"], jobs=1, telemetry=TelemetryConfig(**telemetry)
    )  # type: ignore[arg-type]


def exposed(path: Path) -> dict[str, dict[tuple[str, str], float]]:
    out: dict[str, dict[tuple[str, str], float]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, {})[(s.labels["policy"], s.labels["seed"])] = s.value
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("run")
    return out, run_experiment(tiny_config(progress_every_events=200), out)


def test_exposition_holds_every_numeric_metric_of_every_cell(run_dir) -> None:  # noqa: ANN001
    out, report = run_dir
    metrics = exposed(out / "metrics.prom")
    for cell in report["cells"]:
        key = (cell["policy"], str(cell["seed"]))
        assert metrics[metric_name("ttft_p95_s")][key] == pytest.approx(cell["ttft_p95_s"])
        assert metrics[metric_name("evictions")][key] == cell["evictions"]
        assert metrics["cachepilot_progress_requests_done"][key] == 40
        assert metrics["cachepilot_progress_events"][key] >= 200


def test_every_grafana_panel_queries_a_metric_the_run_exports(run_dir) -> None:  # noqa: ANN001
    out, _ = run_dir
    dashboard = grafana_dashboard()
    wanted = panel_metric_names(dashboard)
    assert len(wanted) >= 15 and len(dashboard["panels"]) >= 15
    missing = wanted - set(exposed(out / "metrics.prom"))
    assert not missing
    # The committed dashboard is the generated one (regenerate: python -m
    # cachepilot_sim.experiment.telemetry grafana --out docs/grafana/cachepilot_dashboard.json).
    assert json.loads(DASHBOARD.read_text()) == dashboard


def test_server_binds_localhost_and_serves_progress() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    telemetry = Telemetry(port)
    try:
        assert telemetry.server.server_address[0] == "127.0.0.1"
        telemetry.progress("perc", 3, 5_000_000, 7, 10, 1234)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
        assert 'cachepilot_progress_requests_done{policy="perc",seed="3"} 7.0' in text
        assert 'cachepilot_progress_sim_seconds{policy="perc",seed="3"} 5.0' in text
    finally:
        telemetry.close()


def test_a_busy_port_leaves_the_run_unserved_with_a_warning(capsys) -> None:  # noqa: ANN001
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        telemetry = Telemetry(port)
        assert telemetry.server is None
    assert f"not serving metrics on 127.0.0.1:{port}" in capsys.readouterr().err
    telemetry.progress("lru", 0, 1, 1, 1, 1)  # still records


def test_progress_reporting_does_not_change_the_run() -> None:
    cfg = make_sim_config(workload=make_workload(num_requests=60))
    calls: list[int] = []
    reported = build(cfg).run(calls.append, every_events=100)
    plain = build(cfg).run()
    assert len(calls) >= 3 and calls == sorted(calls)
    assert reported.trace.equals(plain.trace) and reported.metrics == plain.metrics


def test_progress_bar_draws_on_a_terminal_only() -> None:
    sim = build(make_sim_config(workload=make_workload(num_requests=30)))
    buf = io.StringIO()
    monitor = RunMonitor(TelemetryConfig(), Console(file=buf, force_terminal=True, width=120))
    hook = monitor.hook(sim)
    sim.run(hook, every_events=100)
    hook.finish()
    monitor.close([], None)
    assert "perc seed 0" in buf.getvalue() and "30/30" in buf.getvalue()
    quiet = RunMonitor(TelemetryConfig(), Console(file=io.StringIO(), force_terminal=False))
    assert quiet.bar is None
    off = RunMonitor(
        TelemetryConfig(progress=False), Console(file=io.StringIO(), force_terminal=True)
    )
    assert off.bar is None


def test_prometheus_port_must_be_a_port() -> None:
    with pytest.raises(ConfigError, match="telemetry.prometheus_port"):
        TelemetryConfig(prometheus_port=70000)


def test_progress_moves_for_every_cell_on_worker_processes(tmp_path: Path) -> None:
    """jobs=2: the workers report through the relay; the overall bar passes through intermediate
    counts and ends at every request of every cell, and each cell's gauges end complete."""
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=200))
    values = {k: getattr(sim, k) for k in ("seed", "vram_gb", "model", "workload", "kv")}
    cfg = RunConfig(
        **values, compare_policies=["perc", "lru"], jobs=2, seeds=1, write_report=False,
        telemetry=TelemetryConfig(progress_every_events=100),
    )  # type: ignore[arg-type]  # fmt: skip
    buf = io.StringIO()
    run_experiment(cfg, tmp_path, Console(file=buf, force_terminal=True, width=120))
    counts = {int(n) for n in re.findall(r"(\d+)/400", buf.getvalue())}
    assert 400 in counts and len(counts - {0, 400}) >= 2, sorted(counts)
    done = exposed(tmp_path / "metrics.prom")["cachepilot_progress_requests_done"]
    assert done == {("perc", "0"): 200, ("lru", "0"): 200}


def test_the_plain_progress_line_has_requests_sim_time_rate_and_eta() -> None:
    line = plain_line((12_000, 60_000), 5, {0: 1000.0, 1: 234.0}, 30.0)
    assert line == (
        "progress: 12,000/60,000 requests (20%) in 5 cells, sim 1,234 s, 400 req/s, "
        "elapsed 0:00:30, ETA 0:02:00"
    )
    assert plain_line((0, 100), 1, {}, 3.0).endswith("ETA unknown")


def test_off_a_terminal_progress_is_plain_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telemetry_mod, "PLAIN_EVERY_S", 0.0)  # every report a line
    buf = io.StringIO()
    run_experiment(tiny_config(progress_every_events=200), tmp_path, Console(file=buf, width=120))
    lines = [x for x in buf.getvalue().splitlines() if x.startswith("progress: ")]
    assert len(lines) >= 2 and "\x1b" not in buf.getvalue()  # plain text, no bar escapes
    shape = r"/400 requests .* in 10 cells, sim [0-9,]+ s, [0-9,]+ req/s, elapsed \d:\d\d:\d\d, ETA"
    assert all(re.search(shape, x) for x in lines)
