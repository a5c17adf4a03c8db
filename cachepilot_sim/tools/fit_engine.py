"""Fit a real engine's step cost (cost/engine_step.py) from its micro-runs, never from validation
workloads: device time per step (`gpu_us`) over the step's shape, steps that captured a CUDA graph
left out. Writes the fit, the data file it came from and the residuals as JSON, and prints the
`engine.*` keys to paste into the profile (conf/engine/<name>.yaml in the package; a test checks).

    python -m cachepilot_sim.tools.fit_engine \\
        experiments/validation/hf_cb/2026-12-01/microbench/steps.parquet \\
        experiments/validation/hf_cb/2026-12-01/microbench_mixed/steps.parquet \\
        experiments/validation/hf_cb/2026-12-02-small/microbench_small/steps.parquet \\
        --q-shapes 8 --json experiments/validation/hf_cb/2026-12-02-small/step_fit.json

`--q-shapes N` fits one time per padded query shape (N = the engine's token budget over its
query padding: 2048 / 256) instead of a line in the padded query count; the JSON reports the
cross-validation of both forms.

`--form physical --gpu-profile PATH --max-tokens 2048` fits the physical form instead
(cost/step_physical.py: the engine's kernels on a measured GPU profile, a few fitted constants)
on the steps of up to 2048 queries and reports the larger steps' errors apart
(tools/fit_physical.py).

`--form vllm --gpu-profile PATH` fits vLLM 0.26's physical step cost (tools/fit_vllm.py: decode
graphs at the capture sizes, eager steps with their host-launch floor) on the steps of at most
`--max-tokens` queries and `--max-requests` requests and reports the rest apart.

Several micro-run files are stacked (their configurations keep their own names, so the
cross-validation still leaves one configuration out at a time).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.cost.engine_step import FEATURES, EngineStepFit, fit_engine_step, step_features
from cachepilot_sim.entry import entry_point
from cachepilot_sim.inputs import InputError, one_line
from cachepilot_sim.outputs import check_file, write_text
from cachepilot_sim.tools.micro_steps import load_micro_steps


def features_of(steps: pl.DataFrame, q_pad_tokens: int, shapes: int = 0) -> np.ndarray:
    """The step features (cost.engine_step.step_features) of a steps table."""
    return step_features(
        steps["q_tokens"].to_numpy(),
        steps["kv_read_tokens"].to_numpy(),
        steps["max_seqlen_k"].to_numpy(),
        steps["prefill_tokens"].to_numpy(),
        steps["num_requests"].to_numpy(),
        q_pad_tokens,
        shapes,
    )


def fit_steps(
    steps: pl.DataFrame, q_pad_tokens: int, shapes: int = 0
) -> tuple[EngineStepFit, np.ndarray]:
    """The fit over `steps` and each step's relative residual (model - measured) / measured."""
    x = features_of(steps, q_pad_tokens, shapes)
    return fit_engine_step(x, steps["gpu_us"].to_numpy(), q_pad_tokens, shapes)


def cross_validate(steps: pl.DataFrame, q_pad_tokens: int, shapes: int = 0) -> np.ndarray:
    """Leave-one-configuration-out: each micro-run configuration's steps predicted by a fit of
    all the others; returns every step's relative error. How the feature set was chosen."""
    keys = [
        c
        for c in ("bench", "batch_size", "cfg_prompt_tokens", "context_tokens")
        if c in steps.columns
    ]
    if not keys:
        return np.zeros(0)
    group = steps.select(pl.concat_str(keys, separator="/")).to_series()
    errors = []
    for g in group.unique(maintain_order=True).to_list():
        held = group == g
        fit, _ = fit_steps(steps.filter(~held), q_pad_tokens, shapes)
        test = steps.filter(held)
        x = features_of(test, q_pad_tokens, shapes)
        y = test["gpu_us"].to_numpy().astype(np.float64)
        errors.append((x @ fit.coefficients() - y) / y)
    return np.concatenate(errors)


def report(
    path: Path | list[Path], steps: pl.DataFrame, fit: EngineStepFit, resid: np.ndarray
) -> dict[str, Any]:
    """The fit, its data and its residuals: overall and per micro-run configuration."""
    abs_r = np.abs(resid)
    shapes = len(fit.q_shape_us)
    cv = cross_validate(steps, fit.q_pad_tokens, shapes)
    cv_linear = cross_validate(steps, fit.q_pad_tokens) if shapes else cv
    frame = steps.with_columns(resid=pl.Series(resid))
    keys = [
        c
        for c in ("bench", "batch_size", "cfg_prompt_tokens", "context_tokens")
        if c in frame.columns
    ]
    per_config = []
    if keys:
        per = (
            frame.group_by(keys)
            .agg(
                steps=pl.len(),
                gpu_us_median=pl.col("gpu_us").median(),
                resid_median=pl.col("resid").median(),
                resid_abs_max=pl.col("resid").abs().max(),
            )
            .sort(keys)
        )
        per_config = per.to_dicts()
    return {
        "data": [str(p) for p in path] if isinstance(path, list) else str(path),
        "target": "gpu_us (device time of the step's forward)",
        "steps_used": int(steps.height),
        "fit": {name: getattr(fit, name) for name in (*FEATURES, "q_pad_tokens")}
        | ({"q_shape_us": list(fit.q_shape_us)} if shapes else {}),
        "residual_abs_median": float(np.median(abs_r)),
        "residual_abs_mean": float(abs_r.mean()),
        "residual_abs_p90": float(np.percentile(abs_r, 90)),
        "residual_abs_max": float(abs_r.max()),
        "residual_signed_mean": float(resid.mean()),
        "loco_cv_abs_mean": float(np.abs(cv).mean()) if cv.size else None,
        "loco_cv_abs_p90": float(np.percentile(np.abs(cv), 90)) if cv.size else None,
        "loco_cv_linear_form_abs_mean": float(np.abs(cv_linear).mean()) if cv.size else None,
        "loco_cv_linear_form_abs_p90": (
            float(np.percentile(np.abs(cv_linear), 90)) if cv.size else None
        ),
        "per_config": per_config,
    }


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse's message names the type
    return parse


@entry_point("cachepilot-sim fit-engine")
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=Path, nargs="+", help="the micro-runs' steps.parquet file(s)")
    ap.add_argument("--q-pad-tokens", type=_count(1), default=256)
    ap.add_argument(
        "--q-shapes",
        type=_count(0),
        default=0,
        help="fit a time per padded query shape (0: a line)",
    )
    ap.add_argument("--json", type=Path, help="write the fit and its residuals here")
    ap.add_argument("--form", choices=("engine_step", "physical", "vllm"), default="engine_step")
    ap.add_argument(
        "--gpu-profile", help="physical: gpu_profile.json, or 'datasheet[:GPU]' (a conf/gpu preset)"
    )
    ap.add_argument(
        "--max-tokens",
        type=_count(1),
        default=2048,
        help="physical: fit steps of <= this many queries",
    )
    ap.add_argument(
        "--max-requests",
        type=_count(1),
        default=64,
        help="vllm: fit steps of <= this many requests",
    )
    ap.add_argument("--predict", type=Path, nargs="*", help="physical: steps files only predicted")
    ap.add_argument(
        "--fix",
        action="append",
        metavar="TERM=VALUE",
        help="physical: hold a coefficient instead of fitting it (e.g. elementwise_scale=1)",
    )
    args = ap.parse_args(argv)
    if args.json:
        check_file(args.json)
    if args.form in ("physical", "vllm"):
        if not args.gpu_profile:
            ap.error(f"--form {args.form} needs --gpu-profile (a gpu_profile.json or 'datasheet')")
        if args.form == "vllm":
            from cachepilot_sim.tools.fit_vllm import run
        else:
            from cachepilot_sim.tools.fit_physical import run

        try:
            run(args)
        except (ValueError, KeyError) as err:  # the profile's one line
            raise InputError(one_line(err)) from None
        return
    steps = load_micro_steps(*args.steps)
    try:
        fit, resid = fit_steps(steps, args.q_pad_tokens, args.q_shapes)
    except (ValueError, np.linalg.LinAlgError) as err:  # too few or degenerate steps for a fit
        paths = ", ".join(map(str, args.steps))
        raise InputError(f"{paths}: cannot fit the step cost ({one_line(err)})") from None
    out = report(args.steps if len(args.steps) > 1 else args.steps[0], steps, fit, resid)
    if args.json:
        write_text(args.json, json.dumps(out, indent=1, default=float) + "\n")
    print(
        f"# {out['steps_used']} steps; |residual| median {out['residual_abs_median']:.2%}, "
        f"mean {out['residual_abs_mean']:.2%}, p90 {out['residual_abs_p90']:.2%}; "
        f"leave-one-configuration-out |error| mean {out['loco_cv_abs_mean']:.2%}, "
        f"p90 {out['loco_cv_abs_p90']:.2%}"
    )
    for name in out["fit"]:
        print(f"  {name}: {out['fit'][name]!r}")


if __name__ == "__main__":
    sys.exit(main())
