"""Runs a RunConfig's matrix (policies x seeds), writes results, and prints the comparison table.

Files under the output folder: `metrics.json` (every cell and the per-policy summary), `summary.md`
(the answer's tables, experiment/answer.py), `requests/<policy>_seed<k>.parquet` (per-request
results) and, when tracing is on, `trace/<policy>_seed<k>/part-*.parquet`. Each file is written to
a temporary name and renamed, so an interrupted run never leaves a half-written file over an
earlier one. A run owns its folder (`outdir.py`): it writes into the folder's `.staging/` (with
`run.json`: id, cells) and replaces an earlier run's outputs only once it has completed; a failed
or stopped run leaves them as they were. Trace readers refuse parts and trace folders that are not
this run's. metrics.json is strict JSON (null where a metric has no value).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from cachepilot_sim.config import RunConfig, SimConfig, TraceFormat
from cachepilot_sim.config.question import (
    kv_memory,
    markdown_lines,
    question_lines,
    serving_setup,
)
from cachepilot_sim.cost.gpu_scaling import hardware_derivation, hardware_note
from cachepilot_sim.entry import start_mp_tracker, workers_starting
from cachepilot_sim.experiment import outdir
from cachepilot_sim.experiment.answer import (
    answer_tables,
    bench_block,
    markdown_answer,
    markdown_ranking,
    ranking_table,
)
from cachepilot_sim.experiment.copies import COPY_OF, copy_cell_files
from cachepilot_sim.experiment.lifecycle import check_inputs, stop_workers
from cachepilot_sim.experiment.live import LivePublisher, init_worker, process_metrics
from cachepilot_sim.experiment.progress import ProgressRelay, progress_hook
from cachepilot_sim.experiment.ranking import cannot_differ, rank, ranking_cells, ranking_lines
from cachepilot_sim.experiment.report import results_frame, run_meta, write_report
from cachepilot_sim.experiment.serving import baseline_policy, policy_rows, serving_stats
from cachepilot_sim.experiment.telemetry import RunMonitor
from cachepilot_sim.sim import Simulation, make_simulation
from cachepilot_sim.trust import trust_for

SERVING = "_serving"  # the key under which a worker returns its cell's serving statistics


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
    progress_queue: Any = None,
    index: int = 0,
    live_interval_us: int = 0,
) -> dict[str, Any]:
    """One simulation (cell `index` of the run); its trace and per-request results go under
    out_dir when given; with offline_bound, the offline LP lower bound over its access sequence
    joins its metrics. Its progress and live metrics go to `monitor` (telemetry.RunMonitor, in
    this process) or, on a worker, onto `progress_queue` (experiment/progress.py) and, with
    `live_interval_us`, into this worker's multiprocess metric files (experiment/live.py)."""
    name = f"{sim_cfg.policy.name}_seed{sim_cfg.seed}"
    trace_dir = out_dir / "trace" / name if out_dir is not None and sim_cfg.trace.enabled else None
    # Written as requests end (request_log.py), never held whole in memory.
    requests_path = None
    if out_dir is not None and write_requests:
        requests_path = out_dir / "requests" / f"{name}.parquet"
    sim = make_simulation(sim_cfg, trace_dir, requests_path=requests_path)
    hook, publisher = None, None
    # Live per-tick metrics read one engine's state: a cluster reports progress only.
    one_engine = isinstance(sim, Simulation)
    if monitor is not None:
        hook = monitor.hook(sim, index)
        publisher = monitor.publisher(sim, index) if one_engine else None
        live_interval_us = monitor.live_interval_us
    elif progress_queue is not None:
        hook = progress_hook(sim, index, progress_queue.put)
    if monitor is None and live_interval_us and one_engine:
        publisher = LivePublisher(sim, process_metrics(), index)
    result = sim.run(hook, progress_every_events, publisher, live_interval_us)
    if hook is not None:
        hook.finish()
    if publisher is not None:
        publisher.finish()
    if offline_bound:
        _add_offline_bound(result.metrics, sim_cfg, result.requests)
    # Popped by run_cells: metrics.json keeps its cells as they were.
    gaps = sim.batcher.stats.itl_gaps if isinstance(sim, Simulation) else sim.itl_gaps()
    duration_s = result.metrics["duration_s"]
    result.metrics[SERVING] = serving_stats(result.outcomes, duration_s, gaps)
    return result.metrics


def run_cells(
    cfg: RunConfig,
    out_dir: Path | None,
    monitor: RunMonitor | None = None,
    serving: list[dict[str, float]] | None = None,
    policies: Sequence[str] | None = None,
    first_index: int = 0,
) -> list[dict[str, Any]]:
    """Every (policy, seed) cell, in a fixed order, on `cfg.jobs` worker processes.

    Cells are independent simulations, so running them in parallel changes nothing but wall time.
    Progress goes to `monitor` from every cell: directly with `jobs=1`, through a ProgressRelay
    when the cells run on workers and someone watches live (a terminal bar or a served Prometheus
    port); workers nobody watches do not report (their progress gauges stay out of metrics.prom).
    Each cell's serving statistics (experiment/serving.py) are appended to `serving` when given.
    `policies` (default: the run's) runs a part of the matrix, its cells numbered from
    `first_index` (the monitor hears of the whole matrix on the call with first_index 0).
    """
    seeds = range(cfg.seed, cfg.seed + cfg.seeds)
    if monitor is not None and first_index == 0:
        every_cell = [cfg.sim_for(p, seed) for p in cfg.policy_names() for seed in seeds]
        monitor.add_cells([(s.policy.name, s.seed, s.workload.num_requests) for s in every_cell])
    policies = cfg.policy_names() if policies is None else list(policies)
    sims = [cfg.sim_for(p, seed) for p in policies for seed in seeds]
    jobs = min(cfg.jobs or os.cpu_count() or 1, len(sims))
    every = cfg.telemetry.progress_every_events
    if jobs <= 1:
        cells = [
            run_cell(s, out_dir, cfg.write_requests, cfg.offline_bound, monitor, every,
                     index=first_index + i)
            for i, s in enumerate(sims)
        ]  # fmt: skip
    else:
        # spawn, not fork: polars keeps a thread pool, and a forked child can deadlock on it.
        context = multiprocessing.get_context("spawn")
        start_mp_tracker()  # before the pool and the relay's queue start it, deaf to SIGHUP
        relay = ProgressRelay(context, monitor.report) if monitor and monitor.live else None
        queue = None if relay is None else relay.queue
        live_dir = None if monitor is None else monitor.worker_metrics_dir()
        live_us = 0 if monitor is None or live_dir is None else monitor.live_interval_us
        try:
            with ProcessPoolExecutor(jobs, context, init_worker, (live_dir, os.getpid())) as pool:
                with workers_starting():  # submit starts the workers (spawn: on demand)
                    futures = [
                        pool.submit(run_cell, s, out_dir, cfg.write_requests, cfg.offline_bound,
                                    None, every, queue, first_index + i, live_us)
                        for i, s in enumerate(sims)
                    ]  # fmt: skip
                try:
                    cells = [f.result() for f in futures]
                except BaseException:  # SIGINT/SIGTERM/SIGHUP or a failed cell: stop the rest now
                    stop_workers(pool)
                    raise
        finally:
            if relay is not None:
                relay.close()
    stats = [c.pop(SERVING) for c in cells]
    if serving is not None:
        serving.extend(stats)
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
    # Not a polars group_by: these numpy reductions are what metrics.json has always held, and the
    # summary must stay byte-identical for committed results to keep reproducing.
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


def run_experiment(cfg: RunConfig, out_dir: Path, console: Console | None = None) -> dict[str, Any]:
    """Run the matrix, write metrics.json, summary.md and metrics.prom, print the answer."""
    console = console or Console()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()  # wall time of the run, for run_meta.json only
    check_inputs(cfg)  # a missing trace or weights file must not cost the folder's earlier results
    rid, stage = claim_output(cfg, out_dir)
    try:
        report, serving = _run_staged(cfg, stage, out_dir, console, rid, (started, t0))
    except BaseException:  # failed or stopped: the earlier results stay as they were
        outdir.discard(out_dir)
        raise
    with outdir.signals_deferred():  # a stop must not cut the swap short (outdir.py)
        outdir.commit(out_dir)
    return report | {"serving": serving}


def _run_staged(
    cfg: RunConfig,
    stage: Path,
    out_dir: Path,
    console: Console,
    rid: str,
    clock: tuple[str, float],
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The run, its outputs written under `stage` (its folder's staging folder, outdir.claim);
    `clock` is when it started (UTC, ISO) and its perf_counter then."""
    started, t0 = clock
    monitor = RunMonitor(cfg.telemetry, console)
    serving: list[dict[str, float]] = []
    trust = trust_for(cfg).as_dict()  # how far to trust every number below (trust.py)
    asked = question_lines(cfg, trust["label"])
    # First, as unwrapped lines: a wrapped label would not survive grep or a log reader.
    for line in asked:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    baseline = baseline_policy(cfg.policy_names())
    try:
        cells, identical, why = _run_matrix(cfg, stage, monitor, serving, baseline)
    except BaseException:
        monitor.close([], None)  # stop the bar and the server; no exposition of a failed run
        raise
    skipped = _skipped_by_reason(cells)
    monitor.close(cells, stage)
    summary = summarize(cells)
    title = run_title(cfg, cells)
    report = {"title": title, "run_id": rid, "cells": cells, "summary": summary} | skipped
    if derived := hardware_derivation(cfg):  # not one measured H200: say what was derived
        report["hardware"] = derived
    report["trust"] = trust
    # Cells copied from the baseline (identical by construction) count in metrics.json, not twice
    # on screen: the ranking lists them as such and the tables show the cells that ran.
    ran = [i for i, c in enumerate(cells) if COPY_OF not in c]
    ran_cells, ran_serving = [cells[i] for i in ran], [serving[i] for i in ran]
    gpus = cfg.tp * cfg.cluster.num_gpus
    ranking = rank(ran_cells, ran_serving, baseline, cfg.objective, gpus)
    ranking.identical, ranking.identical_reason = identical, why
    report["question"] = asked
    report["ranking"] = ranking.as_dict()
    outdir.write_json(stage / "metrics.json", report)
    rows = policy_rows(ran_cells, ran_serving, baseline)
    shown = title.replace("; mean ± σ [min, max]", "")
    answer = [markdown_ranking(ranking), markdown_answer(rows, baseline)]
    md = "\n".join([shown, "", *markdown_lines(asked), *answer])
    _write_atomic(stage / "summary.md", lambda p: p.write_text(md))
    console.print(ranking_table(ranking, console.width))
    for line in ranking_lines(ranking):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for t in answer_tables(rows, baseline, shown, console.width):
        console.print(t)
    if len(ran_cells) == 1:
        console.print(bench_block(rows[0]), markup=False, highlight=False)
    if cfg.write_report:
        meta = run_meta(_config_text(cfg, out_dir), shown, time.perf_counter() - t0, started)
        meta["trust"] = trust["label"]
        meta["question"] = asked
        headers, body = ranking_cells(ranking)  # the report's first table: the ranking
        meta["ranking"] = {"headers": headers, "rows": body, "lines": ranking_lines(ranking)}
        write_report(stage, rows, baseline, results_frame(cells, serving), meta)
    return report, serving


def _run_matrix(
    cfg: RunConfig,
    stage: Path,
    monitor: RunMonitor,
    serving: list[dict[str, float]],
    baseline: str,
) -> tuple[list[dict[str, Any]], list[str], str]:
    """The run's cells (in the run's policy order), the policies not run and why. With several
    policies the baseline runs first: when its cells show that no eviction order can matter
    (ranking.cannot_differ), the others are identical by construction: not run, their cells
    copies of the baseline's marked COPY_OF."""
    policies = cfg.policy_names()
    if len(policies) == 1:
        return run_cells(cfg, stage, monitor, serving), [], ""
    base_serving: list[dict[str, float]] = []
    first = run_cells(cfg, stage, monitor, base_serving, [baseline])
    others = [p for p in policies if p != baseline]
    if why := cannot_differ(first):
        # Every other policy's cells are the baseline's, marked as copies: metrics.json and the
        # sweep tables keep one row per (policy, seed) without simulating the same steps again.
        rest = [c | {"policy": p, COPY_OF: 1} for p in others for c in first]
        rest_serving = [dict(s) for _ in others for s in base_serving]
        for c in rest:
            copy_cell_files(stage, baseline, c["policy"], c["seed"])
    else:
        why, rest_serving = "", []
        rest = run_cells(cfg, stage, monitor, rest_serving, others, first_index=len(first))
    pairs = list(zip(first + rest, base_serving + rest_serving, strict=True))
    order = {p: i for i, p in enumerate(policies)}
    pairs.sort(key=lambda cs: (order[cs[0]["policy"]], cs[0]["seed"]))
    cells = [c for c, _ in pairs]
    serving.extend(s for _, s in pairs)
    _add_vs_lru(cells)
    return cells, (others if why else []), why


def claim_output(cfg: RunConfig, out_dir: Path) -> tuple[str, Path]:
    """Take `out_dir` for this run: its run id and the staging folder it writes into (the earlier
    run's outputs are replaced only when this run completes, outdir.commit)."""
    rid = outdir.run_id(cfg)
    seeds = range(cfg.seed, cfg.seed + cfg.seeds)
    cells = [f"{p}_seed{s}" for p in cfg.policy_names() for s in seeds]
    return rid, outdir.claim(out_dir, rid, cells)


def _skipped_by_reason(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Trace rows skipped per reason (the same trace for every cell): moved to the report's top."""
    reasons = [c.pop("trace_rows_skipped_by_reason", None) for c in cells]
    return {} if not reasons or reasons[0] is None else {"trace_rows_skipped_by_reason": reasons[0]}


def _config_text(cfg: RunConfig, out_dir: Path) -> str:
    """The composed config as Hydra saved it for this run, else the RunConfig's fields."""
    saved = out_dir / ".hydra" / "config.yaml"
    if saved.is_file():
        return saved.read_text()
    return json.dumps(asdict(cfg), indent=1, default=str)


def run_title(cfg: RunConfig, cells: Sequence[dict[str, Any]]) -> str:
    """The run's one-line description (metrics.json's `title`)."""
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
    gpu = hardware_note(cfg).get("hardware_profile")
    on = f" [{gpu}]" if gpu else ""
    if cfg.cluster.num_gpus > 1 or cfg.cluster.disaggregated:  # not one GPU: say which cluster
        return f"{workload}, {serving_setup(cfg)}{on}, {seeds}; mean ± σ [min, max]"
    return f"{workload}, {kv_memory(cfg)}{on}, {cfg.model.name}, {seeds}; mean ± σ [min, max]"
