"""Checks behind sentences of the README's "How close to a real engine" section.

`step-bias`: the fitted hf_cb step cost against the engine's measured device time and wall time,
on the validation workloads' own steps (mixed prefill+decode steps and decode-only steps apart).
Nothing is fitted here: it reads the committed `steps.parquet` and the `engine=hf_cb` config.

    PYTHONPATH=. python experiments/validation/diagnose.py step-bias \
        experiments/validation/hf_cb/2026-12-01 poisson_r3 multiturn pressure_queue poisson_r9

`shape-bias`: the same ratio on a micro-run's prefill steps, per padded query shape, for a given
fit (how the linear fit missed the 512-query shape):

    PYTHONPATH=. python experiments/validation/diagnose.py shape-bias \
        experiments/validation/hf_cb/2026-12-02-small/microbench_small/steps.parquet \
        --fit experiments/validation/hf_cb/2026-12-01/step_fit.json

`step-bias --fit FILE` scores an older fit (the linear one: 2026-12-01/step_fit.json).

`prefix-hits`: replays one workload and prints, per request, the prompt blocks the simulator's
prefix cache hit against the blocks the engine reported as hits (`prefix_hit_tokens`), and the sums.

    PYTHONPATH=. python experiments/validation/diagnose.py prefix-hits \
        experiments/validation/hf_cb/2026-12-01/multiturn

`preempt-log`: the engine's preemptions from a `capture.py --phase preemptdiag` log, by what the
victim was doing when it found no free block (decoding; prefilling after a prefix hit made it
active; prefilling the rest of a prompt admitted on a partial chunk), beside the simulator's
(a running sequence, or a queued one a prefix hit made active):

    PYTHONPATH=. python experiments/validation/diagnose.py preempt-log \
        experiments/validation/hf_cb/2026-12-02-preemptdiag

`cost-sensitivity`: replays workloads with every fitted step-cost coefficient scaled by each
factor and prints the errors (sim - real) / real: how far a small cost error moves a workload's
figures (under memory pressure, which request runs out of blocks first decides who is preempted).

    PYTHONPATH=. python experiments/validation/diagnose.py cost-sensitivity \
        experiments/validation/hf_cb/2026-12-01 pressure_preempt pressure_soft_reset
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from cachepilot_sim.cost.engine_step import FEATURES, EngineStepFit, step_features
from cachepilot_sim.sim import build
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.ground_truth import GroundTruthError, load_ground_truth
from cachepilot_sim.validation.replay import engine_overrides, workload_from_ground_truth

BLOCK_TOKENS = 256  # the engine's block size (engine.json of every capture)


def load_fit(path: Path | None) -> EngineStepFit:
    """A committed fit (`step_fit.json` of fit_engine), or the `engine=hf_cb` profile's."""
    if path is None:
        e = sim_config("hf_cb", []).engine
        values = {name: getattr(e, name) for name in FEATURES}
        return EngineStepFit(**values, q_pad_tokens=e.q_pad_tokens, q_shape_us=tuple(e.q_shape_us))
    fit = json.loads(path.read_text())["fit"]
    shapes = tuple(fit.get("q_shape_us", ()))
    values = {name: fit[name] for name in FEATURES}
    return EngineStepFit(**values, q_pad_tokens=fit["q_pad_tokens"], q_shape_us=shapes)


def predicted_us(fit: EngineStepFit, s: pl.DataFrame) -> np.ndarray:
    """The fit's device time for every step of a steps table."""
    x = step_features(
        s["q_tokens"].to_numpy(),
        s["kv_read_tokens"].to_numpy(),
        s["max_seqlen_k"].to_numpy(),
        s["prefill_tokens"].to_numpy(),
        s["num_requests"].to_numpy(),
        fit.q_pad_tokens,
        len(fit.q_shape_us),
    )
    return x @ fit.coefficients()


def step_bias(root: Path, workloads: list[str], fit_path: Path | None) -> None:
    """Median ratio of the fitted step cost to measured device and wall time, and the p90 of
    |fit / device - 1|, per step kind."""
    fit = load_fit(fit_path)
    print(
        "| workload | steps | n | fit / device | p90 abs err | fit / wall | device ms | wall ms |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for wl in workloads:
        s = pl.read_parquet(root / wl / "run1" / "steps.parquet").filter(pl.col("gpu_us") > 0)
        pred = predicted_us(fit, s)
        wall = (s["end_us"] - s["start_us"]).to_numpy()
        gpu = s["gpu_us"].to_numpy()
        mixed = s["prefill_tokens"].to_numpy() > 0
        for kind, m in (("mixed", mixed), ("decode", ~mixed)):
            if m.sum():
                r = pred[m] / gpu[m]
                p90 = np.percentile(np.abs(r - 1), 90)
                print(
                    f"| {wl} | {kind} | {int(m.sum())} | {np.median(r):.3f} | {p90:.3f} | "
                    f"{np.median(pred[m] / wall[m]):.3f} | "
                    f"{gpu[m].mean() / 1e3:.1f} | {wall[m].mean() / 1e3:.1f} |"
                )


def shape_bias(steps_path: Path, fit_path: Path | None) -> None:
    """Median fit / device time of a micro-run's prefill steps, per padded query shape."""
    fit = load_fit(fit_path)
    s = pl.read_parquet(steps_path).filter(
        pl.col("gpu_us") > 0, pl.col("graph_captures") == 0, pl.col("prefill_tokens") > 0
    )
    s = s.with_columns(
        ratio=pl.Series(predicted_us(fit, s)) / pl.col("gpu_us"),
        shape=(pl.col("q_tokens") + fit.q_pad_tokens - 1) // fit.q_pad_tokens * fit.q_pad_tokens,
    )
    table = s.group_by("shape").agg(pl.len().alias("steps"), pl.col("ratio").median()).sort("shape")
    ratio = float(np.median(s["ratio"].to_numpy()))
    print(f"all prefill steps: {s.height}, median fit / device {ratio:.3f}")
    for r in table.iter_rows(named=True):
        print(
            f"padded shape {r['shape']}: {r['steps']} steps, median fit / device {r['ratio']:.3f}"
        )


def prefix_hits(folder: Path) -> None:
    """Per request: blocks hit in the simulator's replay vs the engine's reported hits."""
    real = load_ground_truth(folder)
    run_cfg = sim_config(
        "hf_cb", [*engine_overrides(real, sim_config("hf_cb", [])), "trace.enabled=true"]
    )
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    wl, order = workload_from_ground_truth(real, BLOCK_TOKENS)
    with tempfile.TemporaryDirectory() as tmp:
        res = build(cfg, Path(tmp), wl).run()
        parts = sorted(Path(tmp).rglob("*.parquet"))
        trace = pl.concat([pl.read_parquet(p) for p in parts], how="diagonal_relaxed")
    admit = (
        trace.filter(pl.col("kind") == "admit")
        .group_by("request")
        .agg(pl.col("value").first().alias("prefill"))
    )
    sim = (
        res.requests.sort("request")
        .with_columns(request_id=order["request_id"])
        .join(admit, on="request", how="left")
        .with_columns(hit_sim=(pl.col("prompt_tokens") - pl.col("prefill")) // BLOCK_TOKENS)
    )
    hits_real = real.requests.select(
        "request_id", (pl.col("prefix_hit_tokens") // BLOCK_TOKENS).alias("hit_real")
    )
    joined = sim.join(hits_real, on="request_id").sort("arrival_us")
    with pl.Config(tbl_rows=-1):
        print(joined.select("request_id", "prompt_tokens", "hit_sim", "hit_real", "preemptions"))
    print(f"blocks hit: simulator {joined['hit_sim'].sum()}, engine {joined['hit_real'].sum()}")


def itl_tail(folder: Path, above: list[float], at: int | None) -> None:
    """Token-gap tail and step grouping, engine against simulator (see the module doc)."""
    from cachepilot_sim.components.batcher import Batcher
    from cachepilot_sim.validation.replay import simulate

    real = load_ground_truth(folder)
    steps: list[tuple[int, float, int, list[tuple[int, int]]]] = []
    raw = Batcher._raw_duration_us

    # The batcher passes plain lists (columns and chunk sizes) since its small-batch fast path.
    def record(self: Batcher, decode: list[int], chunk_idx: list[int], chunks: list[int]) -> float:
        us = raw(self, decode, chunk_idx, chunks)
        if len(chunks):
            n_dec = len(decode) + self.ghost.shape[1]
            parts = [(int(self.order[i]), int(c)) for i, c in zip(chunk_idx, chunks, strict=True)]
            steps.append((self.env.now, us, n_dec, parts))
        return us

    run_cfg = sim_config("hf_cb", engine_overrides(real, sim_config("hf_cb", [])))
    Batcher._raw_duration_us = record  # type: ignore[method-assign]
    try:
        sim, _ = simulate(run_cfg.sim_for(run_cfg.policy.name, 0), real)
    finally:
        Batcher._raw_duration_us = raw  # type: ignore[method-assign]
    tokens = real.requests["token_us"].to_list()
    gaps = np.concatenate([np.diff(np.asarray(t)) for t in tokens if t is not None and len(t) > 1])
    sim_gaps = np.asarray(sim.itl_us)
    for ms in above:
        n_real, n_sim = int((gaps > ms * 1e3).sum()), int((sim_gaps > ms * 1e3).sum())
        print(f"gaps > {ms:g} ms: engine {n_real}, simulator {n_sim}")
    print(f"p99 = the {int(np.ceil(0.01 * gaps.size))}th largest of {gaps.size} gaps")
    assert real.steps is not None, f"{folder}: no steps.parquet"
    mixed = real.steps.filter(pl.col("prefill_tokens") > 0)
    budget = int(real.engine.get("max_batch_tokens", 2048))
    q_sim = np.array([sum(c for _, c in parts) + n for _, _, n, parts in steps])
    ms_sim = np.array([us for _, us, _, _ in steps]) / 1e3
    full_real = mixed.filter(pl.col("q_tokens") > budget - 256)
    print(
        f"prefill steps: engine {mixed.height}, simulator {len(steps)}; within 256 of the "
        f"{budget}-token budget: engine {full_real.height} (median "
        f"{float(np.median(full_real['gpu_us'].to_numpy())) / 1e3:.1f} ms), simulator "
        f"{int((q_sim > budget - 256).sum())} (median "
        f"{float(np.median(ms_sim[q_sim > budget - 256])):.1f} ms)"
    )
    if at is None:
        return
    k = mixed["q_tokens"].to_list().index(at)
    for r in mixed[k : k + 4].iter_rows(named=True):
        print(f"engine step at {r['start_us'] / 1e3:.1f} ms: {r['q_tokens']} query tokens")
    j = int(np.flatnonzero(q_sim == at)[0])
    for t, _, n, parts in steps[j : j + 4]:
        print(f"simulator step at {t / 1e3:.1f} ms: {n} decodes, prefill chunks {parts}")
    t0 = mixed["start_us"][k]
    sent = real.requests.sort("send_us").with_row_index("arrival_order")
    window = sent.filter(pl.col("send_us").is_between(t0 - 50_000, t0 + 150_000))
    for r in window.iter_rows(named=True):
        print(f"request {r['arrival_order']} sent at {r['send_us'] / 1e3:.1f} ms")


def preempt_log(folder: Path) -> None:
    """Engine preemptions by kind (from the preemptdiag logs) against the simulator's replay."""
    import gzip
    from collections import Counter

    for log in sorted(folder.glob("preemptdiag_run*.jsonl.gz")):
        events = [json.loads(line) for line in gzip.open(log, "rt")]
        last: dict[str, dict] = {}
        kinds: Counter[str] = Counter()
        for e in events:
            if e["ev"] == "alloc":
                last[e["rid"]] = e
            elif e["ev"] == "offload":
                for rid, _, _ in e["starved"]:
                    if rid not in e["gone"]:
                        continue
                    a = last[rid]
                    hit = a["cur"] > 0 and a["cur"] % BLOCK_TOKENS == 0
                    kinds[
                        "decoding"
                        if a["status"] == "DECODING"
                        else ("prefill after a prefix hit" if hit else "prefill of a later chunk")
                    ] += 1
        print(f"{log.name}: engine preemptions {sum(kinds.values())}: {dict(kinds)}")
    real = load_ground_truth(folder / "pressure_preempt" / "run2")
    run_cfg = sim_config(
        "hf_cb", [*engine_overrides(real, sim_config("hf_cb", [])), "trace.enabled=true"]
    )
    cfg = run_cfg.sim_for(run_cfg.policy.name, 0)
    wl, _ = workload_from_ground_truth(real, BLOCK_TOKENS)
    with tempfile.TemporaryDirectory() as tmp:
        build(cfg, Path(tmp), wl).run()
        parts = sorted(Path(tmp).rglob("*.parquet"))
        trace = pl.concat([pl.read_parquet(p) for p in parts], how="diagonal_relaxed")
    pre = trace.filter(pl.col("kind") == "preempt")
    queued = pre.filter(pl.col("blocks") == 0).height
    print(
        f"simulator: {pre.height} preemptions: {pre.height - queued} running, "
        f"{queued} queued after a prefix hit"
    )


SCALED = FEATURES  # every coefficient of the fit (those replaced by q_shape_us are 0 there)
SENSITIVITY_KEYS = ("ttft_mean", "ttft_p99", "tpot_mean", "tpot_p99", "e2e_mean", "e2e_p99")


def cost_sensitivity(
    root: Path, workloads: list[str], scales: list[float], extra: list[str]
) -> None:
    """Errors of each workload with the whole fitted step cost scaled by each factor."""
    from cachepilot_sim.tools.validate import compare
    from cachepilot_sim.validation.replay import simulate

    e = sim_config("hf_cb", []).engine
    print("| workload | step cost x | " + " | ".join(SENSITIVITY_KEYS) + " | preempt. sim/real |")
    print("|---|---:|" + "---:|" * (len(SENSITIVITY_KEYS) + 1))
    for wl in workloads:
        real = load_ground_truth(root / wl / "run1")
        for f in scales:
            shapes = ",".join(repr(v * f) for v in e.q_shape_us)
            scaled = [f"engine.{k}={getattr(e, k) * f!r}" for k in SCALED]
            ov = [
                *engine_overrides(real, sim_config("hf_cb", [])),
                f"engine.q_shape_us=[{shapes}]",
                *scaled,
            ]
            run_cfg = sim_config("hf_cb", [*ov, *extra])
            sim, _ = simulate(run_cfg.sim_for(run_cfg.policy.name, 0), real)
            c = compare(sim, real)
            cells = " | ".join(f"{100 * c[k + '_err']:+.1f}%" for k in SENSITIVITY_KEYS)
            pre = f"{c['preemptions_sim']}/{c['preemptions_real']}"
            print(f"| `{wl}` | {f:g} | {cells} | {pre} |")


def main(argv: list[str] | None = None) -> int:
    """Command line: one of the subcommands in the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sb = sub.add_parser("step-bias")
    sb.add_argument("root", type=Path)
    sb.add_argument("workloads", nargs="+")
    sb.add_argument("--fit", type=Path, help="a step_fit.json (default: the hf_cb profile)")
    sh = sub.add_parser("shape-bias")
    sh.add_argument("steps", type=Path)
    sh.add_argument("--fit", type=Path, help="a step_fit.json (default: the hf_cb profile)")
    ph = sub.add_parser("prefix-hits")
    ph.add_argument("folder", type=Path)
    it = sub.add_parser("itl-tail")
    it.add_argument("folder", type=Path)
    it.add_argument("--above", type=float, nargs="+", default=[40.0, 60.0, 70.0, 80.0])
    it.add_argument("--at", type=int, default=None)
    pl_ = sub.add_parser("preempt-log")
    pl_.add_argument("folder", type=Path)
    cs = sub.add_parser("cost-sensitivity")
    cs.add_argument("root", type=Path)
    cs.add_argument("workloads", nargs="+")
    cs.add_argument("--scales", type=float, nargs="+", default=[0.99, 0.995, 1.0, 1.005, 1.01])
    cs.add_argument("--set", action="append", default=[], help="an extra config override")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "step-bias":
            step_bias(args.root, args.workloads, args.fit)
        elif args.cmd == "shape-bias":
            shape_bias(args.steps, args.fit)
        elif args.cmd == "preempt-log":
            preempt_log(args.folder)
        elif args.cmd == "cost-sensitivity":
            cost_sensitivity(args.root, args.workloads, args.scales, args.set)
        elif args.cmd == "itl-tail":
            itl_tail(args.folder, args.above, args.at)
        else:
            prefix_hits(args.folder)
    except (GroundTruthError, FileNotFoundError, pl.exceptions.ColumnNotFoundError) as exc:
        print(f"diagnose: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
