"""The progress bar moves for a trace replay too (issue 16): its total is the trace's request count
(not the synthetic workload's `num_requests`, which a replay does not read), and requests done
rise while the trace is still being sent (the replay clients' list was empty until the last
arrival, so the bar sat at 0 and jumped to the end). Any `jobs`; the run's results unchanged."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from rich.console import Console

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import RunConfig, register_configs, to_config
from cachepilot_sim.experiment.progress import progress_hook
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.experiment.telemetry import RunMonitor
from cachepilot_sim.sim import build
from tests.unit.test_telemetry import exposed

register_configs()
LIMIT = 120  # trace rows: the first sessions of the shipped Mooncake sample


def replay_config(*overrides: str) -> RunConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "+experiment=mooncake_synthetic",
                "replay.path=samples:mooncake_synthetic/synthetic_trace.jsonl",
                f"replay.limit={LIMIT}",
                "write_report=false",
                *overrides,
            ],
        )
    return to_config(cfg)


def test_a_replay_reports_requests_done_rising_out_of_the_trace_count() -> None:
    run = replay_config("compare_policies=[lru]", "trace.enabled=false")
    sim = build(run.sim_for("lru", 0))
    reports: list[Any] = []
    hook = progress_hook(sim, 0, reports.append)
    result = sim.run(hook, 200)
    assert run.workload.num_requests != LIMIT  # the synthetic figure is not the total
    assert {p.total for p in reports} == {LIMIT}
    done = [p.done for p in reports]
    assert done == sorted(done) and len(set(done) - {0, LIMIT}) >= 5, done
    # Requests finish while later ones are still to be sent: progress moves before the end.
    assert any(0 < p.done < LIMIT for p in reports[: len(reports) // 2])
    plain = build(run.sim_for("lru", 0)).run()
    assert result.metrics == plain.metrics and result.requests.equals(plain.requests)


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_overall_bar_moves_to_every_trace_request(
    jobs: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bar redraws itself 10 times a second: a quiet machine ran both cells in fewer frames
    # than this test needs, so here every report is drawn (what the bar shows, not when).
    report = RunMonitor.report

    def report_and_draw(self: RunMonitor, p: Any) -> None:
        report(self, p)
        if self.bar is not None:
            self.bar.refresh()

    monkeypatch.setattr(RunMonitor, "report", report_and_draw)
    run = replay_config("compare_policies=[perc,lru]", f"jobs={jobs}")
    buf = io.StringIO()
    run_experiment(run, tmp_path, Console(file=buf, force_terminal=True, width=150))
    overall = 2 * LIMIT
    counts = {int(n) for n in re.findall(rf"(\d+)/{overall}\b", buf.getvalue())}
    assert overall in counts and len(counts - {0, overall}) >= 2, sorted(counts)
    done = exposed(tmp_path / "metrics.prom")["cachepilot_progress_requests_done"]
    assert done == {("perc", "0"): LIMIT, ("lru", "0"): LIMIT}
