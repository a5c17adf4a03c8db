"""Fit the physical step cost (cost/step_physical.py) from an engine's micro-runs and test it out
of its range: steps of up to `--max-tokens` queries are fitted, the larger ones (and any
`--predict` files, e.g. micro-runs at another query padding) only predicted.

    python -m cachepilot_sim.tools.fit_engine --form physical \\
        --gpu-profile experiments/validation/hf_cb/2026-12-06-h200/gpu_profile.json \\
        --max-tokens 2048 STEPS.parquet... [--predict OTHER.parquet...] [--json OUT.json]

Each steps file needs its engine's settings beside it (`microbench.json` or `engine.json`:
`max_requests_per_batch`, the sequence slots a padded step launches); the padded shapes are the
ones the engine recorded (`q_tokens_padded`, `kv_read_padded`). `--gpu-profile datasheet[:GPU]`
prices the kernels from a conf/gpu preset's datasheet (default the H200; nothing measured) instead,
to show what that costs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.config import PCIE_GBPS_PER_LANE, GpuSpecConfig
from cachepilot_sim.cost.gpu_profile import GpuProfile, datasheet_profile, load_gpu_profile
from cachepilot_sim.cost.step_physical import (
    TERMS,
    PhysicalFit,
    StepShapes,
    fit_physical,
    physical_terms,
)
from cachepilot_sim.inputs import InputError, read_json
from cachepilot_sim.kernels.profile_gpu import DEFAULT_MODEL
from cachepilot_sim.outputs import write_text
from cachepilot_sim.tools.micro_steps import load_micro_steps

ENGINE_FILES = ("microbench.json", "engine.json")
NUM_LAYERS = 32  # Llama-3-8B, the captures' model


def engine_settings(steps_path: Path) -> dict[str, Any]:
    """The engine settings recorded beside a steps file (ValueError naming it when absent)."""
    for name in ENGINE_FILES:
        path = steps_path.parent / name
        if path.is_file():
            settings = read_json(path, "engine settings")
            if not isinstance(settings, dict):
                raise InputError(f"{path}: expected a JSON object of engine settings")
            seqs = settings.get("max_requests_per_batch")
            if not isinstance(seqs, int) or isinstance(seqs, bool) or not 1 <= seqs < 2**31:
                raise InputError(
                    f"{path}: key 'max_requests_per_batch' = {seqs!r}: must be a positive integer"
                )
            return settings
    raise ValueError(f"{steps_path}: no {' or '.join(ENGINE_FILES)} beside it (engine settings)")


def load_physical_steps(paths: list[Path]) -> pl.DataFrame:
    """Usable micro-run steps of every file (tools.micro_steps.load_micro_steps' rules), each
    tagged with its engine's `max_seqs` and its file."""
    frames = []
    for path in paths:
        max_seqs = int(engine_settings(path)["max_requests_per_batch"])
        steps = load_micro_steps(path)
        frames.append(steps.with_columns(max_seqs=pl.lit(max_seqs), source=pl.lit(str(path))))
    common = [c for c in frames[0].columns if all(c in f.columns for f in frames[1:])]
    return pl.concat([f.select(common) for f in frames], how="vertical_relaxed")


def recorded_shapes(steps: pl.DataFrame) -> StepShapes:
    """The launch shapes the engine recorded for each step."""

    def col(name: str) -> np.ndarray:
        return steps[name].to_numpy().astype(np.float64)

    q_pad = col("q_tokens_padded")
    return StepShapes(
        q_tokens=col("q_tokens"),
        q_padded=q_pad,
        kv_read=col("kv_read_tokens"),
        kv_read_padded=col("kv_read_padded"),
        longest=col("max_seqlen_k"),
        prefill_tokens=col("prefill_tokens"),
        num_prefill_requests=col("num_prefill_requests"),
        num_requests=col("num_requests"),
        seq_slots=np.minimum(q_pad, col("max_seqs")),
    )


def profile_for(spec: str) -> GpuProfile:
    """A measured profile (a path), or `datasheet[:GPU]`: the datasheet figures of a conf/gpu
    preset (default the H200) with Llama-3-8B GEMMs, nothing measured."""
    if spec == "datasheet" or spec.startswith("datasheet:"):
        from cachepilot_sim.conf import CONF_DIR
        from cachepilot_sim.config.store import load_profile

        name = spec.partition(":")[2]
        gpu = GpuSpecConfig()
        if name:
            path = CONF_DIR / "gpu" / f"{name}.yaml"
            if not path.is_file():
                raise ValueError(f"--gpu-profile {spec}: no conf/gpu/{name}.yaml")
            gpu = load_profile("gpu", path)
        pcie_gbps = PCIE_GBPS_PER_LANE[gpu.pcie_gen] * gpu.pcie_lanes  # unused by the step cost
        model = dict(DEFAULT_MODEL)
        return datasheet_profile(gpu.name, gpu.hbm_gbps, gpu.bf16_dense_tflops, pcie_gbps, model)
    return load_gpu_profile(spec)


def error_summary(resid: np.ndarray) -> dict[str, Any]:
    """|relative error| statistics of `resid` (empty: only the count)."""
    if resid.size == 0:
        return {"steps": 0}
    a = np.abs(resid)
    return {
        "steps": int(resid.size),
        "abs_mean": float(a.mean()),
        "abs_median": float(np.median(a)),
        "abs_p90": float(np.percentile(a, 90)),
        "abs_max": float(a.max()),
        "signed_mean": float(resid.mean()),
    }


def by_size(steps: pl.DataFrame, resid: np.ndarray) -> list[dict[str, Any]]:
    """Errors per padded query count (the step size the extrapolation is about)."""
    frame = steps.select("q_tokens_padded", "gpu_us").with_columns(resid=pl.Series(resid))
    per = frame.group_by("q_tokens_padded").agg(
        steps=pl.len(),
        gpu_us_median=pl.col("gpu_us").median(),
        resid_median=pl.col("resid").median(),
        resid_abs_max=pl.col("resid").abs().max(),
    )
    return per.sort("q_tokens_padded").to_dicts()


def fit_and_predict(
    profile: GpuProfile,
    fit_steps: pl.DataFrame,
    predict: dict[str, pl.DataFrame],
    fixed: dict[str, float] | None = None,
) -> tuple[PhysicalFit, dict[str, Any]]:
    """Fit on `fit_steps` (`fixed`: coefficients held, not fitted), predict each frame of
    `predict`; the report of both."""
    x = physical_terms(profile, NUM_LAYERS, recorded_shapes(fit_steps))
    fit, resid = fit_physical(x, fit_steps["gpu_us"].to_numpy(), fixed)
    out: dict[str, Any] = {
        "in_range": error_summary(resid) | {"by_size": by_size(fit_steps, resid)}
    }
    for name, steps in predict.items():
        if steps.height == 0:
            out[name] = {"steps": 0}
            continue
        y = steps["gpu_us"].to_numpy().astype(np.float64)
        xp = physical_terms(profile, NUM_LAYERS, recorded_shapes(steps))
        r = (xp @ fit.coefficients() - y) / y
        out[name] = error_summary(r) | {"by_size": by_size(steps, r)}
    return fit, out


def parse_fixed(items: list[str]) -> dict[str, float]:
    """`--fix NAME=VALUE` items as coefficients held in the fit (ValueError naming the item)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not np.isfinite(number) or number < 0:
            raise ValueError(f"--fix {item!r}: expected TERM=VALUE with a finite value >= 0")
        out[name] = number
    return out


def run(args: Any) -> dict[str, Any]:
    """`fit_engine --form physical`: fit, predict, report (and write `--json`)."""
    profile = profile_for(args.gpu_profile)
    steps = load_physical_steps(list(args.steps))
    inside = steps.filter(pl.col("q_tokens") <= args.max_tokens)
    predict = {"out_of_range": steps.filter(pl.col("q_tokens") > args.max_tokens)}
    if args.predict:
        predict["predict_files"] = load_physical_steps(list(args.predict))
    fixed = parse_fixed(getattr(args, "fix", None) or [])
    fit, errors = fit_and_predict(profile, inside, predict, fixed)
    out = {
        "form": "physical",
        "gpu_profile": profile.path,
        "gpu": profile.gpu,
        "data": [str(p) for p in args.steps],
        "predict_data": [str(p) for p in args.predict or []],
        "target": "gpu_us (device time of the step's forward)",
        "max_tokens": args.max_tokens,
        "fixed": fixed,
        "fit": {name: getattr(fit, name) for name in TERMS},
        **errors,
    }
    if args.json:
        write_text(args.json, json.dumps(out, indent=1, default=float) + "\n")
    for part in ("in_range", *predict):
        e = out[part]
        if e["steps"]:
            print(
                f"# {part}: {e['steps']} steps, |error| mean {e['abs_mean']:.2%}, "
                f"p90 {e['abs_p90']:.2%}, max {e['abs_max']:.2%}, "
                f"signed mean {e['signed_mean']:+.2%}"
            )
    for name in TERMS:
        print(f"  physical_{name}: {out['fit'][name]!r}")
    return out
