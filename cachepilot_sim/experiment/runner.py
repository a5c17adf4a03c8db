"""Runs a RunConfig's matrix (policies x seeds), writes results, and prints the comparison table.

Files under the output folder: `metrics.json` (every cell and the per-policy summary), `summary.md`
(the table), `requests/<policy>_seed<k>.parquet` (per-request results) and, when tracing is on,
`trace/<policy>_seed<k>/part-*.parquet`. Each file is written to a temporary name and renamed, so an
interrupted run never leaves a half-written file over an earlier one. A run owns its folder
(`outdir.py`): it first removes an earlier run's outputs there, then writes `run.json` (id, cells);
trace readers refuse parts and trace folders that are not this run's. metrics.json is strict JSON
(null where a metric has no value).
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from cachepilot_sim.config import RunConfig, SimConfig, TraceFormat
from cachepilot_sim.experiment import outdir
from cachepilot_sim.experiment.lifecycle import exit_with_parent, stop_workers
from cachepilot_sim.experiment.telemetry import RunMonitor
from cachepilot_sim.sim import build

# (metric key, column title, format): the headline table.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("realized_restore_s", "realized restore s", "{:.2f}"),
    ("restore_vs_lru", "vs LRU", "{:.3f}"),
    ("expected_evict_cost_s", "expected evict cost s (seed metric)", "{:.2f}"),
    ("evictions", "evictions", "{:.0f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p95_s", "TTFT p95 s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.2f}"),
    ("tpot_p95_ms", "TPOT p95 ms", "{:.2f}"),
    ("goodput_req_s", "goodput req/s", "{:.3f}"),
    ("session_wait_p95_s", "session wait p95 s", "{:.1f}"),
)
# Policy-lab columns, shown only when some cell has them (shadow oracle, offline bound).
LAB_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("oracle_gap_mean", "vs oracle: gap mean", "{:.3f}"),
    ("oracle_gap_worst", "vs oracle: gap worst", "{:.2f}"),
    ("offline_lp_restore_s", "offline LP bound s", "{:.2f}"),
    ("restore_vs_offline_lp", "realized / LP bound", "{:.2f}"),
)


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def run_cell(
    sim_cfg: SimConfig,
    out_dir: Path | None,
    write_requests: bool,
    offline_bound: bool = False,
    monitor: RunMonitor | None = None,
    progress_every_events: int = 0,
) -> dict[str, Any]:
    """One simulation; its trace and per-request results go under out_dir when given; with
    offline_bound, the offline LP lower bound over its access sequence joins its metrics; a
    `monitor` (telemetry.RunMonitor, in-process runs only) is told its progress."""
    name = f"{sim_cfg.policy.name}_seed{sim_cfg.seed}"
    trace_dir = out_dir / "trace" / name if out_dir is not None and sim_cfg.trace.enabled else None
    sim = build(sim_cfg, trace_dir)
    if monitor is None:
        result = sim.run()
    else:
        hook = monitor.hook(sim)
        result = sim.run(hook, progress_every_events)
        hook.finish()
    if out_dir is not None and write_requests:
        _write_atomic(out_dir / "requests" / f"{name}.parquet", result.requests.write_parquet)
    if offline_bound:
        _add_offline_bound(result.metrics, sim_cfg, result.requests)
    return result.metrics


def run_cells(
    cfg: RunConfig, out_dir: Path | None, monitor: RunMonitor | None = None
) -> list[dict[str, Any]]:
    """Every (policy, seed) cell, in a fixed order, on `cfg.jobs` worker processes.

    Cells are independent simulations, so running them in parallel changes nothing but wall time.
    Progress (`monitor`) needs the cells in this process: they run here when `jobs=1` or when
    someone watches live (a terminal bar or a served Prometheus port); otherwise on workers, and
    the progress gauges are left out of metrics.prom (the run metrics are all there).
    """
    policies = cfg.policy_names()
    sims = [
        cfg.sim_for(p, seed) for p in policies for seed in range(cfg.seed, cfg.seed + cfg.seeds)
    ]
    jobs = min(cfg.jobs or os.cpu_count() or 1, len(sims))
    if monitor is not None and monitor.live:
        jobs = 1
    every = cfg.telemetry.progress_every_events
    if jobs <= 1:
        cells = [
            run_cell(s, out_dir, cfg.write_requests, cfg.offline_bound, monitor, every)
            for s in sims
        ]
    else:
        # spawn, not fork: polars keeps a thread pool, and a forked child can deadlock on it.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, context, initializer=exit_with_parent) as pool:
            futures = [
                pool.submit(run_cell, s, out_dir, cfg.write_requests, cfg.offline_bound)
                for s in sims
            ]
            try:
                cells = [f.result() for f in futures]
            except BaseException:  # SIGINT/SIGTERM/SIGHUP or a failed cell: stop the others now
                stop_workers(pool)
                raise
    _add_vs_lru(cells)
    return cells


def _add_offline_bound(cell: dict[str, Any], sim_cfg: SimConfig, requests: Any) -> None:
    from cachepilot_sim.experiment.offline import offline_metrics

    cell |= offline_metrics(sim_cfg, requests)
    bound = cell["offline_lp_restore_s"]
    cell["restore_vs_offline_lp"] = cell["realized_restore_s"] / bound if bound else float("nan")


def _add_vs_lru(cells: list[dict[str, Any]]) -> None:
    """Paired ratio of realized restore seconds to LRU's on the same seed (NaN without LRU)."""
    lru = {c["seed"]: c["realized_restore_s"] for c in cells if c["policy"] == "lru"}
    for c in cells:
        base = lru.get(c["seed"])
        c["restore_vs_lru"] = c["realized_restore_s"] / base if base else float("nan")


def summarize(cells: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per policy and numeric metric: mean, std (sample, ddof=1), min, max, n over seeds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for policy in dict.fromkeys(c["policy"] for c in cells):
        rows = [c for c in cells if c["policy"] == policy]
        stats: dict[str, dict[str, float]] = {}
        for key, value in rows[0].items():
            if key in ("policy", "seed") or not isinstance(value, int | float):
                continue
            v = np.array([r[key] for r in rows], dtype=np.float64)
            stats[key] = {
                "mean": float(np.mean(v)),
                "std": float(np.std(v, ddof=1)) if v.size > 1 else 0.0,
                "min": float(np.min(v)),
                "max": float(np.max(v)),
                "n": int(v.size),
            }
        out[policy] = stats
    return out


# Added when the cells have them (trace replay with prefix blocks).
PREFIX_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("prefix_hit_ratio", "prefix-hit ratio", "{:.3f}"),
)


def _columns(summary: dict[str, dict[str, dict[str, float]]]) -> tuple[tuple[str, str, str], ...]:
    present = {k for stats in summary.values() for k in stats}
    return COLUMNS + tuple(c for c in LAB_COLUMNS + PREFIX_COLUMNS if c[0] in present)


def _cell(stat: dict[str, float] | None, fmt: str) -> str:
    if stat is None or math.isnan(stat["mean"]):
        return "-"
    f = fmt.format
    return f"{f(stat['mean'])} ± {f(stat['std'])}\n[{f(stat['min'])}, {f(stat['max'])}]"


def table(summary: dict[str, dict[str, dict[str, float]]], title: str) -> Table:
    t = Table(title=title, show_lines=True)
    t.add_column("policy")
    columns = _columns(summary)
    for _, name, _ in columns:
        t.add_column(name, justify="right")
    for policy, stats in summary.items():
        t.add_row(policy, *(_cell(stats.get(k), fmt) for k, _, fmt in columns))
    return t


def markdown(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    """The same table as GitHub markdown (mean ± σ, then [min, max])."""
    columns = _columns(summary)
    head = "| policy | " + " | ".join(name for _, name, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    lines = [head, rule]
    for policy, stats in summary.items():
        cells = [_cell(stats.get(k), fmt).replace("\n", " ") for k, _, fmt in columns]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def claim_output(cfg: RunConfig, out_dir: Path) -> str:
    """Take `out_dir` for this run (an earlier run's outputs there are removed); its run id."""
    rid = outdir.run_id(cfg)
    names = [
        f"{p}_seed{s}" for p in cfg.policy_names() for s in range(cfg.seed, cfg.seed + cfg.seeds)
    ]
    outdir.claim(out_dir, rid, names)
    return rid


def _skipped_by_reason(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Trace rows skipped per reason (the same trace for every cell): moved to the report's top."""
    reasons = [c.pop("trace_rows_skipped_by_reason", None) for c in cells]
    return (
        {"trace_rows_skipped_by_reason": reasons[0]} if reasons and reasons[0] is not None else {}
    )


def run_experiment(cfg: RunConfig, out_dir: Path, console: Console | None = None) -> dict[str, Any]:
    """Run the matrix, write metrics.json, summary.md and metrics.prom, print the table."""
    console = console or Console(width=250)
    rid = claim_output(cfg, out_dir)
    monitor = RunMonitor(cfg.telemetry, console)
    try:
        cells = run_cells(cfg, out_dir, monitor)
    except BaseException:
        monitor.close([], None)  # stop the bar and the server; no exposition of a failed run
        raise
    monitor.close(cells, out_dir)
    summary = summarize(cells)
    seeds = f"seeds {cfg.seed}..{cfg.seed + cfg.seeds - 1}"
    workload = f"{cfg.workload.name}: {cfg.workload.num_requests} requests"
    if cfg.replay.format != TraceFormat.NONE:
        rc, first = cfg.replay, cells[0]
        skipped = first.get("trace_rows_skipped", 0)
        note = f" ({skipped} bad rows skipped)" if skipped else ""
        workload = (
            f"{rc.format!s} trace {Path(rc.path).name}: {first['requests']} requests"
            f"{note}, time x{rc.time_scale:g}"
        )
    title = f"{workload}, {cfg.vram_gb:g} GB VRAM, {cfg.model.name}, {seeds}; mean ± σ [min, max]"
    report = {"title": title, "run_id": rid, "cells": cells, "summary": summary}
    report |= _skipped_by_reason(cells)
    outdir.write_json(out_dir / "metrics.json", report)
    _write_atomic(out_dir / "summary.md", lambda p: p.write_text(f"{title}\n\n{markdown(summary)}"))
    console.print(table(summary, title))
    return report
