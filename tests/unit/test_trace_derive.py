"""Per-request results and run metrics derived from the trace equal the collector's (one truth)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.config import ConfigError, EngineConfig, KVConfig, SchedulerConfig, TraceConfig
from cachepilot_sim.sim import build
from cachepilot_sim.trace.derive import TraceError, load_trace, request_results, run_metrics
from tests.conftest import make_sim_config, make_workload

# Memory pressure on purpose: offloads, CPU-store drops, reloads, recomputes, preemptions and
# queue time-outs all happen, so every derived quantity is exercised.
PRESSURE = {
    "offload": dict(
        vram_gb=9.6,
        kv=KVConfig(cpu_store_bytes=10**9),
        scheduler=SchedulerConfig(queue_timeout_s=5.0),
    ),
    "int8_cpu_tier": dict(
        vram_gb=9.6,
        kv=KVConfig(cpu_store_bytes=10**9, offload_dtype_bytes=1),
        scheduler=SchedulerConfig(queue_timeout_s=5.0),
    ),
    # preempted requests go to the engine's CPU swap space instead (and some give up there)
    "cpu_swap": dict(
        vram_gb=9.6,
        kv=KVConfig(cpu_store_bytes=10**9),
        scheduler=SchedulerConfig(queue_timeout_s=5.0),
        engine=EngineConfig(cpu_swap_blocks=400),
    ),
    "drop_only": dict(
        vram_gb=10.0,
        kv=KVConfig(offload_enabled=False),
        scheduler=SchedulerConfig(queue_timeout_s=3.0),
    ),
}


def traced_run(tmp_path: Path, trace: TraceConfig, **overrides: object):  # noqa: ANN201
    cfg = make_sim_config(trace=trace, workload=make_workload(num_requests=150), **overrides)
    sim = build(cfg, tmp_path / "trace")
    return sim, sim.run()


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        fa, fb = float(a), float(b)  # type: ignore[arg-type]
        return (math.isnan(fa) and math.isnan(fb)) or math.isclose(
            fa, fb, rel_tol=1e-9, abs_tol=1e-12
        )
    return a == b


@pytest.mark.parametrize("case", sorted(PRESSURE))
def test_metrics_derived_from_the_trace_equal_the_collectors(tmp_path: Path, case: str) -> None:
    trace_cfg = TraceConfig(iteration_every=1, chunk_rows=300)  # several part files
    sim, result = traced_run(tmp_path, trace_cfg, **PRESSURE[case])
    assert len(list((tmp_path / "trace").glob("part-*.parquet"))) > 2
    lf, meta = load_trace(tmp_path / "trace")
    derived = run_metrics(lf, meta)
    collected = result.metrics | {"cpu_drops": sim.kv.stats.cpu_drops}
    # The scenario must exercise what is compared, or equality proves little.
    assert collected["evictions"] > 20 and collected["recomputes"] > 10
    assert collected["rejected"] > 0 and collected["preemptions"] > 0
    if case != "drop_only":
        assert collected["reloads"] > 5 and collected["cpu_drops"] > 0
    assert (collected["cpu_swaps"] > 0) == (case == "cpu_swap")
    wrong = {k: (v, collected[k]) for k, v in derived.items() if not _same(v, collected[k])}
    assert not wrong
    # Everything the collector reports is derived, except engine counters the trace never sees
    # (a quantized CPU tier's conversion time is inside the offload/reload durations, not apart;
    # lazy graph captures are inside the iteration durations).
    assert set(result.metrics) - set(derived) == {
        "iterations",
        "promoted",
        "kv_pool_gb",
        "kv_convert_s",
        "graph_captures",
        "graph_capture_s",
    }


def test_request_results_equal_the_collectors_request_table(tmp_path: Path) -> None:
    _, result = traced_run(tmp_path, TraceConfig(), **PRESSURE["offload"])
    lf, meta = load_trace(tmp_path / "trace")
    derived = request_results(lf, meta)
    expected = result.requests.select(derived.columns)
    assert derived.height == expected.height == 150
    done = expected["outcome"] == "completed"
    for name in derived.columns:
        got, want = derived[name], expected[name]
        if name == "generated":  # the trace knows the token count of completed requests only
            got, want = got.filter(done), want.filter(done)
        assert (got.cast(want.dtype) == want).all(), name
    assert set(expected["kv_source"]) >= {"new", "hit", "reload", "recompute"}


def test_sampled_trace_holds_every_row_of_one_session_in_k(tmp_path: Path) -> None:
    sim, result = traced_run(tmp_path, TraceConfig(session_every=3), **PRESSURE["offload"])
    trace = result.trace
    sessions = trace.filter(pl.col("session") >= 0)["session"].unique()
    assert sessions.len() > 5 and (sessions % 3 == 0).all()
    full = make_sim_config(workload=make_workload(num_requests=150), **PRESSURE["offload"])
    assert trace.height < build(full).run().trace.height / 2
    lf, meta = load_trace(tmp_path / "trace")
    assert meta["session_every"] == 3
    derived = request_results(lf, meta)
    expected = result.requests.filter(pl.col("session") % 3 == 0).select(derived.columns)
    assert derived.drop("generated").equals(expected.drop("generated"))


def test_trace_session_sampling_must_be_a_positive_integer() -> None:
    with pytest.raises(ConfigError, match="trace.session_every"):
        TraceConfig(session_every=0)


def test_load_trace_names_the_file_that_is_missing_or_wrong(tmp_path: Path) -> None:
    traced_run(tmp_path, TraceConfig())
    trace_dir = tmp_path / "trace"
    meta = trace_dir / "meta.json"
    saved = meta.read_text()
    meta.unlink()
    with pytest.raises(TraceError, match="meta.json: missing"):
        load_trace(trace_dir)
    meta.write_text("{not json")
    with pytest.raises(TraceError, match="meta.json: not valid JSON"):
        load_trace(trace_dir)
    meta.write_text(json.dumps({k: v for k, v in json.loads(saved).items() if k != "tpot_slo_us"}))
    with pytest.raises(TraceError, match="'tpot_slo_us' missing"):
        load_trace(trace_dir)
    meta.write_text(saved)
    pl.DataFrame({"t_us": [1]}).write_parquet(trace_dir / "part-99999.parquet")
    with pytest.raises(TraceError, match=r"part-99999.parquet is not among this run's parts"):
        load_trace(trace_dir)
    (trace_dir / "part-99999.parquet").replace(trace_dir / "part-00000.parquet")
    with pytest.raises(TraceError, match=r"part-00000.parquet: schema differs"):
        load_trace(trace_dir)
    (trace_dir / "part-00000.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(TraceError, match=r"part-00000.parquet: not a readable Parquet file"):
        load_trace(trace_dir)


def test_a_run_writing_its_trace_to_disk_reads_it_back_only_on_request(tmp_path: Path) -> None:
    _, result = traced_run(tmp_path, TraceConfig(chunk_rows=100))
    assert "trace" not in vars(result)  # cached_property not evaluated: nothing read back
    parts = sorted((tmp_path / "trace").glob("part-*.parquet"))
    assert len(parts) > 5 and all(pl.read_parquet(p).height <= 100 for p in parts)
    assert result.trace.height == sum(pl.read_parquet(p).height for p in parts)
    assert "trace" in vars(result)
