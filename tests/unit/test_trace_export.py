"""`cachepilot-sim trace-export`: a run's event trace as a Chrome trace-event document."""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from rich.console import Console

from cachepilot_sim.config import RunConfig, TelemetryConfig
from cachepilot_sim.experiment.runner import run_experiment
from cachepilot_sim.tools.trace_export import TRACKS, main
from tests.conftest import make_sim_config, make_workload


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    out = tmp_path_factory.mktemp("run")
    sim = make_sim_config(vram_gb=10.0, workload=make_workload(num_requests=120))
    values = {k: getattr(sim, k) for k in ("seed", "vram_gb", "model", "workload", "kv")}
    cfg = RunConfig(
        **values, compare_policies=["perc", "lru"], seeds=1, jobs=1, write_report=False,
        telemetry=TelemetryConfig(progress=False),
    )  # type: ignore[arg-type]  # fmt: skip
    report = run_experiment(cfg, out, Console(file=io.StringIO()))
    assert main([str(out), "--out", str(out / "trace.json")]) == 0
    return json.loads((out / "trace.json").read_text()), report, out


def test_export_is_chrome_trace_format_with_a_track_per_component(exported) -> None:  # noqa: ANN001
    doc, report, _ = exported
    events = doc["traceEvents"]
    assert isinstance(events, list) and len(events) > 1000
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= e.keys(), e
        assert isinstance(e["ts"], int) and e["ts"] >= 0
        assert e["ph"] in {"M", "b", "e", "X", "i", "C"}
        if e["ph"] == "X":
            assert e["dur"] >= 0
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(1, "lru seed 0"), (2, "perc seed 0")}  # trace folders in name order
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert tracks == set(TRACKS)


def test_one_request_span_per_request_each_closed_after_it_opened(exported) -> None:  # noqa: ANN001
    doc, report, _ = exported
    cells = {1: report["cells"][1], 2: report["cells"][0]}  # pid order: lru, perc
    assert [cells[1]["policy"], cells[2]["policy"]] == ["lru", "perc"]
    opened: dict[tuple, int] = {}
    spans: Counter[int] = Counter()
    depth: defaultdict[tuple, int] = defaultdict(int)
    for e in doc["traceEvents"]:
        if e["ph"] == "b":
            key = (e["pid"], e["id"], e["name"])
            assert key not in opened, f"span opened twice: {key}"
            opened[key] = e["ts"]
            depth[e["pid"], e["id"]] += 1
            spans[e["pid"]] += e["name"] == "request"
        elif e["ph"] == "e":
            key = (e["pid"], e["id"], e["name"])
            assert e["ts"] >= opened.pop(key), f"span ends before it starts: {key}"
            depth[e["pid"], e["id"]] -= 1
    assert not opened, "every span is closed"
    for pid, cell in cells.items():
        assert spans[pid] == cell["requests"] > 0


LANES = (("pcie h2d", "reload", "reloads"), ("pcie d2h", "offload", "evictions_offload"))


def test_pcie_slices_are_the_copies_and_a_lane_copies_one_at_a_time(exported) -> None:  # noqa: ANN001
    doc, report, _ = exported
    cells = {1: report["cells"][1], 2: report["cells"][0]}
    for pid, cell in cells.items():
        for lane, name, key in LANES:
            on_lane = [
                e for e in doc["traceEvents"] if e["pid"] == pid and e["tid"] == TRACKS[lane]
            ]
            slices = sorted((e["ts"], e["dur"]) for e in on_lane if e["ph"] == "X")
            assert {e["name"] for e in on_lane if e["ph"] == "X"} == {name}
            assert len(slices) == cell[key]
            for (t0, d0), (t1, _) in zip(slices, slices[1:], strict=False):
                assert t0 + d0 <= t1, f"{lane} copies overlap at {t0}"
    assert any(e["ph"] == "i" and e["name"] == "evict_offload" for e in doc["traceEvents"])


def test_bad_input_is_one_line_and_writes_nothing(exported, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    _, _, run = exported
    out = tmp_path / "t.json"
    assert main([str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a trace folder nor a run folder" in err
    assert not out.exists()
    (run / "trace" / "lru_seed0" / "meta.json").rename(run / "meta.json.bak")
    try:
        assert main([str(run / "trace" / "lru_seed0"), "--out", str(out)]) == 2
        assert "neither a trace folder" in capsys.readouterr().err and not out.exists()
    finally:
        (run / "meta.json.bak").rename(run / "trace" / "lru_seed0" / "meta.json")
    assert main([str(run), "--out", str(tmp_path / "no" / "such" / "dir.json")]) == 2
    assert "cannot write" in capsys.readouterr().err
