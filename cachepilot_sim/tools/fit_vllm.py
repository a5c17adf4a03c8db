"""Fit vLLM 0.26's physical step cost (cost/step_physical.py, `kernels=vllm`) from its cost
micro-runs and test it out of range: the steps of at most `--max-tokens` queries and
`--max-requests` requests are fitted, the larger ones only predicted (and any `--predict` files,
a validation workload's steps say, whose measured over predicted time is reported).

    python -m cachepilot_sim.tools.fit_engine --form vllm \\
        --gpu-profile experiments/validation/hf_cb/2026-12-06-h100/gpu_profile.json \\
        experiments/validation/vllm/2026-12-07-h100/microbench/steps.parquet \\
        experiments/validation/vllm/2026-12-07-h100/microbench_mixed/steps.parquet

vLLM's steps carry no CUDA events: `gpu_us` is the interval between two steps' outputs on the
engine core's clock (experiments/validation/vllm/vllm_gt.py). Under async scheduling the engine
launches step n before it takes step n-1's output, so an eager step's host launch (tens of ms)
lands in the interval of the step before it, and its own interval shrinks by as much: a run of
eager steps and the step before it are one row of the evaluation (the sum of their intervals
against the sum of their predictions). The GPU terms are fitted on the graph steps; the eager
floor is measured, not fitted: the median interval of the eager steps the GPU model calls
host-bound (`host_bound_candidates`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.config.engine_profile import PhysicalKernels
from cachepilot_sim.cost.gpu_profile import GpuProfile
from cachepilot_sim.cost.step_physical import (
    TERMS,
    PaddingRules,
    PhysicalFit,
    fit_physical,
    pad_shapes,
    physical_terms,
)
from cachepilot_sim.inputs import InputError, read_json
from cachepilot_sim.tools.micro_steps import load_micro_steps

NUM_LAYERS = 32  # Llama-3-8B, the captures' model
GROUP_KEYS = ("source", "config_id", "rep")  # one micro-run configuration's steps, in order
SETTINGS_FILES = ("microbench.json", "engine.json")


def vllm_rules(steps_path: Path) -> PaddingRules:
    """The padding of the vLLM engine whose settings sit beside `steps_path`."""
    for name in SETTINGS_FILES:
        path = steps_path.parent / name
        if path.is_file():
            settings = read_json(path, "vLLM engine settings")
            sizes = settings.get("cudagraph_capture_sizes") if isinstance(settings, dict) else None
            if not isinstance(sizes, list) or not all(isinstance(v, int) for v in sizes):
                raise InputError(
                    f"{path}: key 'cudagraph_capture_sizes' = {sizes!r}: expected a list of ints"
                )
            if settings.get("cudagraph_mode") != "FULL_DECODE_ONLY":
                raise InputError(
                    f"{path}: key 'cudagraph_mode' = {settings.get('cudagraph_mode')!r}: the vLLM "
                    "step cost models FULL_DECODE_ONLY only"
                )
            return PaddingRules(1, kernels=PhysicalKernels.VLLM, graph_sizes=tuple(sizes))
    raise InputError(f"{steps_path}: no {' or '.join(SETTINGS_FILES)} beside it")


def load_vllm_steps(paths: list[Path]) -> tuple[pl.DataFrame, PaddingRules]:
    """The usable steps of every file, in step order within each group, tagged by file."""
    frames, rules = [], None
    for path in paths:
        r = vllm_rules(path)
        if rules is not None and r != rules:
            raise InputError(f"{path}: other CUDA-graph capture sizes than {paths[0]}")
        rules = r
        steps = load_micro_steps(path).with_columns(source=pl.lit(str(path)))
        for key in ("config_id", "rep"):
            if key not in steps.columns:
                steps = steps.with_columns(pl.lit(0).alias(key))
        frames.append(steps)
    assert rules is not None
    common = [c for c in frames[0].columns if all(c in f.columns for f in frames[1:])]
    steps = pl.concat([f.select(common) for f in frames], how="vertical_relaxed")
    return steps.sort([*GROUP_KEYS, "start_us"], maintain_order=True), rules


def step_terms(profile: GpuProfile, rules: PaddingRules, steps: pl.DataFrame) -> Any:
    """(terms, eager) of each step: vLLM's steps table counts a step's own tokens in its KV read
    (`kv_read_tokens`); the shapes take the KV held before the step."""

    def col(name: str) -> np.ndarray:
        return steps[name].to_numpy().astype(np.float64)

    s = pad_shapes(
        rules,
        col("q_tokens"),
        col("kv_read_tokens") - col("q_tokens"),
        col("max_seqlen_k"),
        (col("prefill_tokens"), col("num_prefill_requests")),
        col("num_requests"),
    )
    assert s.eager is not None
    return physical_terms(profile, NUM_LAYERS, s, PhysicalKernels.VLLM), s.eager


def pair_index(steps: pl.DataFrame, eager: np.ndarray) -> np.ndarray:
    """The fitted row of each step: a step whose output waited for the next, eager, step's
    launch (back to back: that step started when this one's output came) shares its row, so a
    run of eager steps and the step before it are one row."""
    group = steps.select(pl.concat_str(list(GROUP_KEYS), separator="/")).to_series().to_numpy()
    start, end = steps["start_us"].to_numpy(), steps["end_us"].to_numpy()
    row = np.arange(steps.height)
    for i in range(1, steps.height):
        if eager[i] and group[i] == group[i - 1] and start[i] == end[i - 1]:
            row[i] = row[i - 1]
    _, dense = np.unique(row, return_inverse=True)
    return dense


def predict_rows(
    coef: np.ndarray, floor: float, terms: np.ndarray, eager: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Each row's predicted time: the sum of its steps' times, max(floor, GPU) where eager."""
    gpu = terms @ coef
    step = np.where(eager, np.maximum(gpu, floor), gpu)
    return np.bincount(rows, weights=step)


def host_bound_candidates(steps: pl.DataFrame, eager: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(launch, interval) of each eager step that had the engine to itself: it found the engine
    idle, its successor (same group) was scheduled before its output, is a graph step (whose
    launch is short) and admitted no new request (taking one in costs the engine core ~1 ms of
    host work). Its launch = the successor's schedule start - its own schedule end (vLLM's batch
    queue had room, so nothing else sat between them); its interval = schedule end to output.
    NaN elsewhere."""
    group = steps.select(pl.concat_str(list(GROUP_KEYS), separator="/")).to_series().to_numpy()
    nxt = steps["schedule_start_us"].shift(-1).to_numpy().astype(np.float64)
    same = np.append(group[1:] == group[:-1], False)
    prepared = steps["prepare_end_us"].to_numpy().astype(np.float64)
    idle = steps["start_us"].to_numpy() == steps["prepare_end_us"].to_numpy()
    early = nxt < steps["update_start_us"].to_numpy()
    quiet = steps["num_new_requests"].shift(-1, fill_value=1).to_numpy() == 0
    graph_next = ~np.append(eager[1:], True)
    ok = eager & idle & same & early & quiet & graph_next
    interval = steps["gpu_us"].to_numpy().astype(np.float64)
    return np.where(ok, nxt - prepared, np.nan), np.where(ok, interval, np.nan)


def fit_vllm(
    terms: np.ndarray,
    eager: np.ndarray,
    y: np.ndarray,
    candidates: tuple[np.ndarray, np.ndarray],
    fixed: dict[str, float] | None = None,
) -> PhysicalFit:
    """The GPU terms by NNLS over the graph steps (`fixed` coefficients held: the profile's
    measured rates at 1), then the eager floor: the median interval of the eager steps that had
    the engine to themselves (`host_bound_candidates`) and that this GPU model calls host-bound
    (GPU time under half their host launch): the launch plus the work behind its last kernel."""
    launches, intervals = candidates
    fixed = {"grid_block_ns": 0.0} | dict(fixed or {})  # no padded sequence slots in vLLM
    gpu_fit, _ = fit_physical(terms[~eager], y[~eager], fixed)
    gpu = terms @ gpu_fit.coefficients()
    bound = np.isfinite(launches) & (gpu < 0.5 * np.nan_to_num(launches))
    if not bound.any():
        raise ValueError("no host-bound eager step with a measured launch: no eager floor")
    floor = float(np.median(intervals[bound]))
    return replace(gpu_fit, eager_floor_us=floor)


def arrivals_after(steps: pl.DataFrame) -> np.ndarray:
    """True where the next step of the group admitted a new request: the engine core took that
    request in (~1 ms of host work each, not a step cost) inside this step's interval."""
    group = steps.select(pl.concat_str(list(GROUP_KEYS), separator="/")).to_series().to_numpy()
    same = np.append(group[1:] == group[:-1], False)
    new = steps["num_new_requests"].shift(-1, fill_value=0).to_numpy() > 0
    return same & new


def row_table(steps: pl.DataFrame, rows: np.ndarray, eager: np.ndarray) -> pl.DataFrame:
    """One line per fitted row: its measured time (summed), its largest step, its kind and
    whether an arriving request was taken in during it."""
    return (
        steps.select("gpu_us", "q_tokens", "num_requests", "source")
        .with_columns(
            row=pl.Series(rows), eager=pl.Series(eager), arrivals=pl.Series(arrivals_after(steps))
        )
        .group_by("row", maintain_order=True)
        .agg(
            pl.col("gpu_us").sum(),
            pl.col("q_tokens").max(),
            pl.col("num_requests").max(),
            pl.col("eager").any(),
            pl.col("arrivals").any(),
            pl.col("source").first(),
        )
    )


def evaluate(
    fit: PhysicalFit, profile: GpuProfile, rules: PaddingRules, steps: pl.DataFrame
) -> tuple[pl.DataFrame, np.ndarray]:
    """Each fitted row of `steps` (pair_index) with its prediction, and its relative error."""
    terms, eager = step_terms(profile, rules, steps)
    rows = pair_index(steps, eager)
    y = np.bincount(rows, weights=steps["gpu_us"].to_numpy().astype(np.float64))
    pred = predict_rows(fit.coefficients(), fit.eager_floor_us, terms, eager, rows)
    table = row_table(steps, rows, eager).with_columns(pred_us=pl.Series(pred))
    return table, pred / y - 1.0


def summary(table: pl.DataFrame, resid: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """Error statistics of the masked rows: all; graph rows and rows holding an eager step,
    those during which no arriving request was taken in; and those during which one was."""
    from cachepilot_sim.tools.fit_physical import error_summary

    eager = table["eager"].to_numpy()
    quiet = ~table["arrivals"].to_numpy()
    return {
        "all": error_summary(resid[mask]),
        "graph": error_summary(resid[mask & ~eager & quiet]),
        "eager": error_summary(resid[mask & eager & quiet]),
        "with_arrivals": error_summary(resid[mask & ~quiet]),
    }


def fit_in_range(
    profile: GpuProfile,
    paths: list[Path],
    limits: tuple[int, int],
    fixed: dict[str, float],
) -> tuple[PhysicalFit, dict[str, Any]]:
    """Fit on the steps of at most limits = (queries, requests), report in and out of range."""
    steps, rules = load_vllm_steps(paths)
    terms, eager = step_terms(profile, rules, steps)
    y = steps["gpu_us"].to_numpy().astype(np.float64)
    inside = ((steps["q_tokens"] <= limits[0]) & (steps["num_requests"] <= limits[1])).to_numpy()
    launches, intervals = host_bound_candidates(steps, eager)
    fit = fit_vllm(
        terms[inside], eager[inside], y[inside], (launches[inside], intervals[inside]), fixed
    )
    table, resid = evaluate(fit, profile, rules, steps)
    rows = pair_index(steps, eager)
    row_inside = np.bincount(rows, weights=(~inside).astype(np.float64)) == 0
    gpu = terms @ fit.coefficients()
    bound = inside & np.isfinite(launches) & (gpu < 0.5 * np.nan_to_num(launches))
    report = {
        "in_range": summary(table, resid, row_inside),
        "out_of_range": summary(table, resid, ~row_inside),
        "host_bound_eager_steps": {
            "launch_us": [float(v) for v in launches[bound]],
            "interval_us": [float(v) for v in intervals[bound]],
        },
    }
    return fit, report


def predicted_files(
    fit: PhysicalFit, profile: GpuProfile, paths: list[Path]
) -> dict[str, dict[str, Any]]:
    """Each steps file only predicted (a validation workload's steps: never fitted): the row
    errors and the measured over the predicted time summed, graph rows and eager rows apart."""
    out = {}
    for path in paths:
        steps, rules = load_vllm_steps([path])
        table, resid = evaluate(fit, profile, rules, steps)
        eager = table["eager"].to_numpy()
        measured, pred = table["gpu_us"].to_numpy(), table["pred_us"].to_numpy()
        report = summary(table, resid, np.ones(table.height, dtype=bool))
        for kind, mask in (("graph", ~eager), ("eager", eager), ("all", eager | ~eager)):
            report[kind]["measured_over_predicted"] = float(measured[mask].sum() / pred[mask].sum())
        out[str(path)] = report
    return out


def run(args: Any) -> dict[str, Any]:
    """`fit_engine --form vllm`: fit, report in and out of range (and write `--json`)."""
    import json

    from cachepilot_sim.outputs import write_text
    from cachepilot_sim.tools.fit_physical import parse_fixed, profile_for

    profile = profile_for(args.gpu_profile)
    fixed = parse_fixed(getattr(args, "fix", None) or [])
    limits = (args.max_tokens, args.max_requests)
    fit, report = fit_in_range(profile, list(args.steps), limits, fixed)
    out = {
        "form": "vllm",
        "gpu_profile": profile.path,
        "gpu": profile.gpu,
        "data": [str(p) for p in args.steps],
        "target": "gpu_us (the interval between two steps' outputs on the engine core's clock)",
        "max_tokens": args.max_tokens,
        "max_requests": args.max_requests,
        "fixed": fixed,
        "fit": {name: getattr(fit, name) for name in (*TERMS, "eager_floor_us")},
        **report,
    }
    if args.predict:
        out["predicted_files"] = predicted_files(fit, profile, list(args.predict))
    if args.json:
        write_text(args.json, json.dumps(out, indent=1, default=float) + "\n")
    for part in ("in_range", "out_of_range"):
        for kind, e in out[part].items():
            if e["steps"]:
                print(
                    f"# {part} {kind}: {e['steps']} rows, |error| mean {e['abs_mean']:.2%}, "
                    f"median {e['abs_median']:.2%}, p90 {e['abs_p90']:.2%}, "
                    f"signed mean {e['signed_mean']:+.2%}"
                )
    for path, rep in out.get("predicted_files", {}).items():
        ratio = {k: rep[k]["measured_over_predicted"] for k in ("graph", "eager", "all")}
        print(
            f"# predicted {path}: measured / predicted time, graph rows {ratio['graph']:.3f}, "
            f"eager rows {ratio['eager']:.3f}, all {ratio['all']:.3f}"
        )
    for name in (*TERMS, "eager_floor_us"):
        print(f"  physical_{name}: {out['fit'][name]!r}")
    return out
