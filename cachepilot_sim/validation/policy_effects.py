"""Predicted vs measured policy differences: does a difference the simulator predicts hold in a
real engine? (`validate --compare-policies`, docs/validation.md "Policy effects").

A root folder holds captures of one request list under several cached-block reuse orders
(`capture.py --phase policy_ab`: each run's engine.json names its `policy` and `workload`). Each
policy's run 1 is replayed with that same policy; per workload and pair of policies (a = a baseline,
`mru` or `lru`; b = another) the measured and the simulated relative difference (b - a) / a of TTFT
mean and p99, E2E mean, prefix-hit tokens and recompute tokens are reported, with the engine's own
run-to-run spread and whether the signs and the rankings agree. Measured values average a
policy's runs; the spread is the larger run-to-run relative change of the metric within a or b
(unknown with one run).

Recompute tokens are counted by one rule on both sides: a request's leading prompt blocks that
requests finished before it was sent had held (replay hash ids), less what it hit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from cachepilot_sim.validation.block_hashes import replay_hash_ids
from cachepilot_sim.validation.ground_truth import (
    ENGINE_FILE,
    HASH_COLUMN,
    GroundTruth,
    GroundTruthError,
    find_runs,
    load_ground_truth,
)
from cachepilot_sim.validation.gt_stats import summarize
from cachepilot_sim.validation.replay import replay_order

BASELINES = ("mru", "lru")  # the engine's own order (as hooked), then the common default
METRICS = ("ttft_mean", "ttft_p99", "e2e_mean", "prefix_hit_tokens", "recompute_tokens")
TOLERANCE = 0.03  # a predicted difference within 3 percentage points of the measured one


class PolicyEffectsError(ValueError):
    """Captures that cannot be compared (one line: the file or workload and why)."""


@dataclass
class PolicyCapture:
    """One policy's runs of one workload, run 1 first."""

    policy: str
    runs: list[GroundTruth]
    paths: list[Path]
    sim: GroundTruth | None = None
    label: str = ""  # the engine and hardware profile of the replay (trust.engine_label)
    errors: dict[str, Any] = field(default_factory=dict)


def collect(root: Path, only: Sequence[str] | None = None) -> dict[str, dict[str, PolicyCapture]]:
    """workload -> policy -> its capture, from every run under `root` (engine.json's `policy`
    and `workload` keys)."""
    runs = find_runs(root)
    if not runs:
        raise GroundTruthError(f"{root}: no requests.parquet under this folder")
    out: dict[str, dict[str, PolicyCapture]] = {}
    for path in runs:
        gt = load_ground_truth(path)
        policy, workload = gt.engine.get("policy"), gt.engine.get("workload")
        for key, value in (("policy", policy), ("workload", workload)):
            if not isinstance(value, str) or not value:
                raise PolicyEffectsError(
                    f"{path / ENGINE_FILE}: key {key!r} missing or not a name: not a policy "
                    "capture (experiments/validation/capture.py --policy NAME)"
                )
        assert isinstance(policy, str) and isinstance(workload, str)
        if only and workload not in only:
            continue
        cap = out.setdefault(workload, {}).setdefault(policy, PolicyCapture(policy, [], []))
        cap.runs.append(gt)
        cap.paths.append(path)
    for workload, caps in out.items():
        for cap in caps.values():
            order = sorted(range(len(cap.paths)), key=lambda i: _run_number(cap.paths[i]))
            cap.runs = [cap.runs[i] for i in order]
            cap.paths = [cap.paths[i] for i in order]
        _check_same_requests(workload, caps)
    return out


def _run_number(path: Path) -> tuple[int, str]:
    """Folders `run<k>` in k's order (engine.json's `run` may number a re-capture otherwise)."""
    tail = path.name.removeprefix("run")
    return (int(tail), "") if tail.isdigit() else (0, path.name)


def _check_same_requests(workload: str, caps: dict[str, PolicyCapture]) -> None:
    """Every policy of a workload served the same request list (ids and root prompt lengths)."""
    ref: tuple[str, set[tuple[str, int]]] | None = None
    for policy, cap in sorted(caps.items()):
        for path, gt in zip(cap.paths, cap.runs, strict=True):
            df = gt.requests
            roots = df.filter(pl.col("parent_id").is_null()) if "parent_id" in df.columns else df
            ids, prompts = roots["request_id"].to_list(), roots["prompt_tokens"].to_list()
            key = set(zip(ids, prompts, strict=True))
            key |= {(r, -1) for r in df["request_id"].to_list()}
            if ref is None:
                ref = (f"{policy} {path}", key)
            elif key != ref[1]:
                raise PolicyEffectsError(
                    f"workload {workload!r}: {path} serves other requests than {ref[0]} "
                    "(different request ids or prompts): captures of different workloads"
                )


def recompute_tokens(real: GroundTruth, frame: pl.DataFrame, block_tokens: int) -> int:
    """Prefix tokens requests computed again: per request (in send order of `frame`), the
    leading blocks of its replay hash ids (from `real`) that requests finished before it was sent
    had held, capped at its prompt less one token, less its prefix-hit tokens."""
    order = replay_order(real)
    column = order[HASH_COLUMN].to_list() if HASH_COLUMN in order.columns else None
    output = order["output_tokens"].fill_null(1).to_list()
    ids = replay_hash_ids(
        order["prompt_tokens"].to_list(),
        output,
        order["parent_row"].to_list(),
        block_tokens,
        column,
    )
    by_id = dict(zip(order["request_id"].to_list(), ids, strict=True))
    f = frame.filter(pl.col("send_us").is_not_null()).sort("send_us", "request_id")
    ends = f.filter(pl.col("end_us").is_not_null()).sort("end_us")
    end_ids, end_us = ends["request_id"].to_list(), ends["end_us"].to_list()
    held: set[int] = set()
    total, j = 0, 0
    hits = f["prefix_hit_tokens"].fill_null(0).to_list()
    rows = (f["request_id"].to_list(), f["send_us"].to_list(), f["prompt_tokens"].to_list(), hits)
    for rid, send, prompt, hit in zip(*rows, strict=True):
        while j < len(end_us) and end_us[j] <= send:
            held.update(by_id.get(end_ids[j], ()))
            j += 1
        lead = 0
        for h in by_id.get(rid, ()):
            if h not in held:
                break
            lead += 1
        total += max(0, min(lead * block_tokens, prompt - 1) - int(hit))
    return total


def metrics(real: GroundTruth, gt: GroundTruth, block_tokens: int) -> dict[str, float | None]:
    """The compared metrics of `gt` (a capture or its replay); `real` gives the hash ids."""
    s = summarize(gt)
    df = gt.requests
    hits = df["prefix_hit_tokens"] if "prefix_hit_tokens" in df.columns else None
    return {
        "ttft_mean": s["ttft_ms_mean"],
        "ttft_p99": s["ttft_ms_p99"],
        "e2e_mean": s["e2e_ms_mean"],
        "prefix_hit_tokens": None if hits is None else float(hits.fill_null(0).sum()),
        "recompute_tokens": None
        if hits is None
        else float(recompute_tokens(real, df, block_tokens)),
    }


def rel(b: float | None, a: float | None) -> float | None:
    """(b - a) / a, or None when either is unknown or a is 0."""
    if a is None or b is None or a == 0 or math.isnan(a) or math.isnan(b):
        return None
    return (b - a) / a


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if len(vals) == len(xs) and vals else None


def _spread(xs: list[float | None]) -> float | None:
    """Run-to-run relative change (run 2 vs run 1); None with one run."""
    if len(xs) < 2:
        return None
    d = rel(xs[1], xs[0])
    return None if d is None else abs(d)


def _traffic(gt: GroundTruth, key: str) -> float | None:
    traffic = gt.engine.get("kv_traffic")
    value = traffic.get(key) if isinstance(traffic, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def pair_rows(
    workload: str,
    measured: dict[str, list[dict[str, float | None]]],
    predicted: dict[str, dict[str, float | None]],
    labels: dict[str, str],
    gpu: str | None,
) -> list[dict[str, Any]]:
    """One row per (baseline a, policy b, metric): measured, predicted, spread and verdicts."""
    policies = sorted(measured)
    rows = []
    for a in [p for p in BASELINES if p in measured]:
        for b in policies:
            if b == a or (b in BASELINES and BASELINES.index(b) < BASELINES.index(a)):
                continue  # each pair once: mru-lru, not lru-mru as well
            for m in METRICS:
                ma = _mean([r[m] for r in measured[a]])
                mb = _mean([r[m] for r in measured[b]])
                meas = rel(mb, ma)
                pred = rel(predicted[b][m], predicted[a][m])
                sa, sb = _spread([r[m] for r in measured[a]]), _spread([r[m] for r in measured[b]])
                spread = None if sa is None or sb is None else max(sa, sb)
                gap = sign = None
                if meas is not None and pred is not None:
                    gap = abs(pred - meas)
                    sign = _sign(meas) == _sign(pred)
                rows.append(
                    {
                        "workload": workload,
                        "a": a,
                        "b": b,
                        "metric": m,
                        "measured": meas,
                        "predicted": pred,
                        "spread": spread,
                        "within_3pp": None if gap is None else gap <= TOLERANCE,
                        "within_spread": None if gap is None or spread is None else gap <= spread,
                        "sign_agrees": sign,
                        "measured_on": gpu,
                        "predicted_by": labels[b],
                    }
                )
    return rows


def rankings(
    workload: str,
    measured: dict[str, list[dict[str, float | None]]],
    predicted: dict[str, dict[str, float | None]],
) -> list[dict[str, Any]]:
    """Per metric, the policies ordered by measured mean and by predicted value (ties by name)."""
    out = []
    for m in METRICS:
        meas = {p: _mean([r[m] for r in runs]) for p, runs in measured.items()}
        pred = {p: predicted[p][m] for p in measured}
        if any(v is None for v in [*meas.values(), *pred.values()]):
            continue
        by_meas = sorted(meas, key=lambda p: (meas[p], p))
        by_pred = sorted(pred, key=lambda p: (pred[p], p))
        pairs = [(x, y) for i, x in enumerate(by_meas) for y in by_meas[i + 1 :]]
        same = sum(by_pred.index(x) < by_pred.index(y) for x, y in pairs)
        out.append(
            {
                "workload": workload,
                "metric": m,
                "measured": by_meas,
                "predicted": by_pred,
                "agrees": by_meas == by_pred,
                "concordant_pairs": f"{same}/{len(pairs)}",
            }
        )
    return out


ConfigOf = Any  # (engine profile name, overrides) -> RunConfig: tools/validate.sim_config


def compare_policies(
    root: Path, engine: str, config_of: ConfigOf, only: Sequence[str] | None = None
) -> dict[str, Any]:
    """The comparison of every workload under `root` with two policies or more, a baseline
    among them: `{"engine", "pairs", "rankings", "policies"}` (module docstring)."""
    from cachepilot_sim.trust import engine_label, trust_for
    from cachepilot_sim.validation.engine_settings import resolve
    from cachepilot_sim.validation.replay import simulate

    found = collect(root, only)
    pairs: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    own: list[dict[str, Any]] = []
    for workload, caps in sorted(found.items()):
        if len(caps) < 2:
            raise PolicyEffectsError(
                f"workload {workload!r}: captured under one policy only ({', '.join(caps)})"
            )
        if not any(p in caps for p in BASELINES):
            raise PolicyEffectsError(
                f"workload {workload!r}: no baseline policy ({' or '.join(BASELINES)}) among "
                f"{', '.join(sorted(caps))}"
            )
        measured: dict[str, list[dict[str, float | None]]] = {}
        predicted: dict[str, dict[str, float | None]] = {}
        labels: dict[str, str] = {}
        gpu: str | None = None
        for policy, cap in sorted(caps.items()):
            real = cap.runs[0]
            settings = resolve(cap.paths[0], real.engine, config_of(engine, []))
            run_cfg = config_of(engine, settings.overrides)
            cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
            sim, _ = simulate(cfg, real)
            block = cfg.replay.hash_block_tokens
            measured[policy] = [metrics(real, gt, block) for gt in cap.runs]
            predicted[policy] = metrics(real, sim, block)
            labels[policy] = f"{engine_label(trust_for(cfg))}; replayed as policy={cfg.policy.name}"
            gpu = gpu or settings.gpu
            own.append(
                {
                    "workload": workload,
                    "policy": policy,
                    "replayed_as": cfg.policy.name,
                    "runs": len(cap.runs),
                    "errors": {
                        m: rel(predicted[policy][m], measured[policy][0][m]) for m in METRICS
                    },
                    "notes": settings.notes,
                    # the engine's own count (capture.py kv_traffic), beside the offline rule's
                    "engine_recompute_tokens": _mean(
                        [_traffic(gt, "recomputed_prefix_tokens") for gt in cap.runs]
                    ),
                    "predicted_by": labels[policy],
                }
            )
        pairs += pair_rows(workload, measured, predicted, labels, gpu)
        ranks += rankings(workload, measured, predicted)
    if not pairs:
        raise PolicyEffectsError(f"{root}: no workload with a baseline and another policy")
    return {"engine": engine, "pairs": pairs, "rankings": ranks, "policies": own}


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{x:+.1%}"


def markdown(result: dict[str, Any]) -> str:
    """The pairs as a table: measured and predicted (b - a) / a, the spread, the verdicts."""
    head = "| workload | a -> b | metric | measured | predicted | spread | within 3 pp | sign |"
    lines = [head, "|---|---|---|---:|---:|---:|---|---|"]
    for r in result["pairs"]:
        spread = "unknown" if r["spread"] is None else f"±{r['spread']:.1%}"
        ok = {True: "yes", False: "no", None: "n/a"}
        lines.append(
            f"| `{r['workload']}` | {r['a']} -> {r['b']} | {r['metric']} | {_pct(r['measured'])}"
            f" | {_pct(r['predicted'])} | {spread} | {ok[r['within_3pp']]} |"
            f" {ok[r['sign_agrees']]} |"
        )
    lines.append("")
    for r in result["rankings"]:
        verdict = "agrees" if r["agrees"] else "differs"
        lines.append(
            f"ranking `{r['workload']}` {r['metric']}: measured {' < '.join(r['measured'])}; "
            f"predicted {' < '.join(r['predicted'])} ({verdict}, {r['concordant_pairs']} pairs "
            "in the same order)"
        )
    return "\n".join(lines)
