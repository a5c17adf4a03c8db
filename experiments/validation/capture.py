#!/usr/bin/env python3
"""Ground-truth capture from the transformers continuous-batching engine (issue 12).

Runs on the lent H200 (torch 2.11, transformers 5.17, numpy, pyarrow; no simpy/polars/hydra there).
A random-weight Llama-3-8B-shaped model serves open-loop request lists through
`model.init_continuous_batching`; every engine step is instrumented by wrapping the engine's own
methods (no engine code is changed). Output: one ground-truth folder per workload and run
(`requests.parquet`, `steps.parquet`, `engine.json`, format in docs/validation.md), packed into
`$OUT/gt.tar.gz` after every run so a timeout still returns what was captured.

    python3 capture.py --out $OUT --phase explore      # fast path check, graphs vs eager spread
    python3 capture.py --out $OUT --phase main         # validation workloads, each run twice
    python3 capture.py --out $OUT --phase pressure     # small-cache workloads + cost micro-runs
    python3 capture.py --out /tmp/x --phase smoke --cpu-smoke   # tiny model on CPU, logic only
    python3 capture.py --out $OUT --phase mixed        # mixed-context decode cost micro-runs
    python3 capture.py --out $OUT --phase small        # small prefills beside decodes: micro-runs
    python3 capture.py --out $OUT --phase fresh        # multiturn run 2, pressure_soft_reset run 3
    python3 capture.py --out $OUT --phase hashdiag     # multiturn + pressure_preempt, hashes logged
    python3 capture.py --out $OUT --phase preemptdiag  # pressure_preempt x2, allocations logged
    python3 capture.py --out $OUT --phase policy_ab --policies mru,lru,lfu
        # the policy A/B (policy_hook.py): multi-turn sessions behind a shared system prompt,
        # in a pool where reuse competes with new prompts, without and with CPU swap; every
        # policy on the same two engines, runs interleaved (run 1 of each, then run 2)
    python3 capture.py --out $OUT --phase main --policy lru   # any phase, another reuse order
    python3 capture.py --out $OUT --phase portable --parts main,defaults,swap,micro8k
        # the fidelity issue's held-out set: GPU micro-profile, the engine's own defaults
        # (8192-token budget, 64-token query padding, lazy graphs, auto-sized pool), CPU swap
        # under pressure, a shared system prompt, and cost micro-runs up to 8192-token steps

Engine configuration (one, documented in the README next to the data): FA2-varlen attention through
PyTorch's own FlashAttention-2 kernel, CUDA graphs + async batching on, every padded batch shape
captured before serving (`precapture_graphs`), so serving never stalls on a lazy capture.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from capture_client import REQUEST_TYPES, STEP_TYPES, Session, pack, run_requests, write_table
from capture_workloads import (
    NAMED_WORKLOADS,
    PRESSURE_LEN,
    Req,
    azure_workload,
    lognormal_lengths,
    microbench_mixed_plan,
    microbench_plan,
    microbench_small_plan,
    rename,
    w_closed,
    w_multiturn,
    w_poisson,
    w_sessions_shared,
)
from hf_engine import EngineSpec, destroy_engine, engine_config, make_engine
from hf_instrument import Recorder, resolve_gpu_times
from hf_model import build_model, check_fast_path

perf_counter = time.perf_counter


# --------------------------------------------------------------------------------------------- #
# Phases                                                                                        #
# --------------------------------------------------------------------------------------------- #
def phase_explore(s: Session, args: argparse.Namespace) -> None:
    """Fast-path check, pre-capture cost, graphs-vs-eager run-to-run spread (short Poisson list)."""
    print(json.dumps(check_fast_path("cuda")), flush=True)
    rec = Recorder(use_cuda=True)
    g = EngineSpec("graphs_precaptured", num_blocks=320)
    mgr, info = make_engine(s.model, g, rec, s.smoke)
    probe = w_closed("capacity_probe", 96, 0, 0)
    rng = np.random.default_rng(7)
    p = lognormal_lengths(rng, 96, 512, 0.8, 32, 2048)
    o = lognormal_lengths(rng, 96, 128, 0.6, 16, 512)
    probe = [Req(r.request_id, int(p[i]), int(o[i]), send_s=0.0) for i, r in enumerate(probe)]
    s.capture(mgr, rec, g, info, "capacity_probe_b96", probe, runs=1)
    cap = capacity_rps(s.stage / "capacity_probe_b96" / "run1" / "requests.parquet")
    rate = 0.5 * cap
    print(
        f"[explore] closed-batch capacity {cap:.2f} req/s -> explore rate {rate:.2f} req/s",
        flush=True,
    )
    reqs = w_poisson("explore_poisson", 80, rate, seed=11)
    s.capture(mgr, rec, g, info, "explore_graphs", reqs, runs=2, limit_s=60)
    destroy_engine(mgr)
    print(
        f"[explore] free GPU memory after destroy: {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB",
        flush=True,
    )
    e = EngineSpec("eager_async", num_blocks=320, use_cuda_graph=False, precapture_max_seqlen_k=0)
    rec = Recorder(use_cuda=True)
    mgr, info = make_engine(s.model, e, rec, s.smoke)
    s.capture(mgr, rec, e, info, "explore_eager", reqs, runs=2, limit_s=60)
    destroy_engine(mgr)


def capacity_rps(path: Path) -> float:
    """Closed-batch capacity: 75 % of the batch over the time the first 75 % took to finish."""
    import pyarrow.parquet as pq

    ends = sorted(e for e in pq.read_table(path).column("end_us").to_pylist() if e is not None)
    k = int(0.75 * len(ends))
    return k / (ends[k - 1] / 1e6)


MAIN_SPEC = EngineSpec("main_precaptured", num_blocks=448)
PRESSURE_BLOCKS = 40


def main_plan(args: argparse.Namespace) -> list[tuple[str, list[Req], dict]]:
    """The validation workloads (capture_workloads.NAMED_WORKLOADS, in order) and the Azure
    conversation window at --azure-rate."""
    names = (
        "closed_b16",
        "closed_b64",
        "poisson_r3",
        "poisson_r6",
        "poisson_r9",
        "multiturn",
        "burst_4x",
    )
    plan = [(name, *NAMED_WORKLOADS[name]()) for name in names]
    reqs, meta = azure_workload(args.azure, args.azure_num, args.azure_rate)
    plan.append(("azure_conv_sample", reqs, meta))
    print(
        f"[main] capacity {args.capacity_rps} req/s (explore); azure gaps "
        f"x{meta['time_stretch']:.2f}",
        flush=True,
    )
    return plan


def phase_main(
    s: Session,
    args: argparse.Namespace,
    run_ids: tuple[int, ...] = (1, 2),
    only: list[str] | None = None,
) -> None:
    """Validation workloads below memory pressure, each run twice on one pre-captured engine."""
    skip = set(args.skip.split(","))
    rec = Recorder(use_cuda=True)
    mgr, info = make_engine(s.model, MAIN_SPEC, rec, s.smoke)
    plan = {name: (reqs, meta) for name, reqs, meta in main_plan(args)}
    for name in only or list(plan):
        if name in skip:
            continue
        reqs, meta = plan[name]
        s.capture(mgr, rec, MAIN_SPEC, info, name, reqs, limit_s=90, meta=meta, run_ids=run_ids)
    destroy_engine(mgr)


def phase_pressure(s: Session, args: argparse.Namespace) -> None:
    """Small KV cache (requests queue or are preempted), then the cost micro-runs."""
    skip = set(args.skip.split(","))
    reqs = w_poisson("pressure", 48, 3.0, seed=61, lengths=PRESSURE_LEN)
    meta = {"kind": "pressure", "rate_rps": 3.0, "num_blocks": PRESSURE_BLOCKS, **PRESSURE_LEN}
    rec = Recorder(use_cuda=True)
    spec_q = EngineSpec("pressure_queue", num_blocks=PRESSURE_BLOCKS)
    mgr, info = make_engine(s.model, spec_q, rec, s.smoke)
    if "pressure_queue" not in skip:
        s.capture(
            mgr,
            rec,
            spec_q,
            info,
            "pressure_queue",
            rename(reqs, "pressure_queue"),
            limit_s=45,
            meta={**meta, "safety_margin": 0.15},
        )
    if "pressure_soft_reset" not in skip:
        spec_r = EngineSpec("pressure_soft_reset", num_blocks=PRESSURE_BLOCKS, safety_margin=0.0)
        mgr.batch_processor.scheduler.safety_margin = (
            0.0  # same engine and graphs; only the margin differs
        )
        s.capture(
            mgr,
            rec,
            spec_r,
            info,
            "pressure_soft_reset",
            rename(reqs, "pressure_soft_reset"),
            limit_s=45,
            meta={**meta, "safety_margin": 0.0},
        )
    destroy_engine(mgr)
    if "pressure_cpu_swap" not in skip:
        rec = Recorder(use_cuda=True)
        spec_c = EngineSpec(
            "pressure_cpu_swap",
            num_blocks=PRESSURE_BLOCKS,
            safety_margin=0.0,
            cpu_offload_space_gib=1.0,
        )
        mgr, info = make_engine(s.model, spec_c, rec, s.smoke)
        s.capture(
            mgr,
            rec,
            spec_c,
            info,
            "pressure_cpu_swap",
            rename(reqs, "pressure_cpu_swap"),
            limit_s=45,
            meta={**meta, "safety_margin": 0.0, "cpu_offload_space_gib": 1.0},
        )
        destroy_engine(mgr)
    if "microbench" not in skip:
        microbench(s, args)
    if args.rerun:
        # run 2 of main-phase workloads, on a fresh engine in this process (prefix cache clean)
        phase_main(s, args, run_ids=(2,), only=args.rerun.split(","))


MICRO_SPEC = EngineSpec("microbench_lazy_graphs", num_blocks=2200, precapture_max_seqlen_k=0)


def microbench(
    s: Session,
    args: argparse.Namespace,
    plan: Callable[[], list[tuple[dict, list[Req]]]] = microbench_plan,
    name: str = "microbench",
    spec: EngineSpec = MICRO_SPEC,
) -> None:
    rec = Recorder(use_cuda=not s.smoke)
    mgr, info = make_engine(s.model, spec, rec, s.smoke)
    mgr.start()
    folder = s.stage / name
    folder.mkdir(parents=True, exist_ok=True)
    all_steps, all_reqs, configs = [], [], []
    for rep in (1, 2):
        for cfg, reqs in plan():
            reqs = [
                Req(
                    **{
                        **asdict(r),
                        "request_id": f"{r.request_id}-r{rep}",
                        "parent_id": f"{r.parent_id}-r{rep}" if r.parent_id else None,
                        "prefix_of": f"{r.prefix_of}-r{rep}" if r.prefix_of else None,
                    }
                )
                for r in reqs
            ]
            res = run_requests(mgr, rec, reqs, s.seed, s.smoke, limit_s=30)
            resolve_gpu_times(rec)
            tag = {**cfg, "rep": rep, "config_id": len(configs)}
            configs.append(
                {
                    **tag,
                    "wall_s": round(res["wall_s"], 3),
                    "steps": len(rec.steps),
                    "graph_captures": len(rec.captures),
                }
            )
            all_steps += [{**st, **tag} for st in rec.steps]
            all_reqs += [{**r, **tag} for r in res["records"]]
        print(f"[{name}] rep {rep}: {len(configs)} configs, {len(all_steps)} steps", flush=True)
        tag_types = {
            "bench": "string",
            "batch_size": "int32",
            "cfg_prompt_tokens": "int32",
            "context_tokens": "int32",
            "rep": "int32",
            "config_id": "int32",
        }
        write_table(all_steps, {**STEP_TYPES, **tag_types}, folder / "steps")
        write_table(all_reqs, {**REQUEST_TYPES, **tag_types}, folder / "micro_requests")
        eng = engine_config(mgr, spec, info, s.smoke)
        eng.update(
            configs=configs,
            note="cost micro-runs; rep 1 may capture graphs lazily (graph_captures > 0 "
            "on those steps), rep 2 replays them",
        )
        (folder / "microbench.json").write_text(json.dumps(eng, indent=1, default=str))
        pack(s.stage, s.out, "gt")
    destroy_engine(mgr)


def _micro_phase(
    s: Session, args: argparse.Namespace, plan: Callable[..., list], name: str
) -> None:
    """Micro-runs of `plan` on the micro-run engine; on the CPU smoke check a tiny engine runs the
    first three configurations at 1/8 of every length."""
    if not s.smoke:
        microbench(s, args, plan, name)
        return
    spec = EngineSpec(
        f"smoke_{name}",
        num_blocks=256,
        block_size=32,
        max_batch_tokens=256,
        use_cuda_graph=False,
        use_async_batching=False,
        precapture_max_seqlen_k=0,
    )
    microbench(s, args, lambda: plan(scale=8)[:3], name, spec)


def phase_mixed(s: Session, args: argparse.Namespace) -> None:
    """Mixed-context decode micro-runs (microbench_mixed_plan)."""
    _micro_phase(s, args, microbench_mixed_plan, "microbench_mixed")


def phase_small(s: Session, args: argparse.Namespace) -> None:
    """Small-prefill mixed-step micro-runs (microbench_small_plan)."""
    _micro_phase(s, args, microbench_small_plan, "microbench_small")


def _capture_fresh(
    s: Session, spec: EngineSpec, name: str, reqs: list[Req], meta: dict, **kw: object
) -> None:
    """One workload first on a freshly built engine (no prefix cache left by earlier ones)."""
    rec = Recorder(use_cuda=not s.smoke)
    mgr, info = make_engine(s.model, spec, rec, s.smoke)
    s.capture(mgr, rec, spec, info, name, reqs, meta=meta, **kw)  # type: ignore[arg-type]
    destroy_engine(mgr)


def _pressure_workload(name: str, rate: float, seed: int, lengths: dict) -> tuple[list, dict]:
    """A pressure workload with no safety margin (the engine soft-resets instead of queueing)."""
    reqs = rename(w_poisson("pressure", 48, rate, seed=seed, lengths=lengths), name)
    meta = {
        "kind": "pressure",
        "rate_rps": rate,
        "num_blocks": PRESSURE_BLOCKS,
        **lengths,
        "safety_margin": 0.0,
    }
    return reqs, meta


def phase_fresh(s: Session, args: argparse.Namespace) -> None:
    """multiturn run 2 (its run-to-run spread) and pressure_soft_reset run 3 (captured before on
    the engine that had just served pressure_queue), each on a fresh engine."""
    plan = {name: (reqs, meta) for name, reqs, meta in main_plan(args)}
    reqs, meta = plan["multiturn"]
    _capture_fresh(s, MAIN_SPEC, "multiturn", reqs, meta, limit_s=90, run_ids=(2,))
    reqs, meta = _pressure_workload("pressure_soft_reset", 3.0, 61, PRESSURE_LEN)
    spec = EngineSpec("pressure_soft_reset", num_blocks=PRESSURE_BLOCKS, safety_margin=0.0)
    _capture_fresh(s, spec, "pressure_soft_reset", reqs, meta, limit_s=45, run_ids=(3,))


def phase_hashdiag(s: Session, args: argparse.Namespace) -> None:
    """multiturn run 1 with the block manager's hash registrations and lookups logged
    (hashdiag.py), then pressure_preempt: twice the rate, longer replies, no safety margin."""
    import hashdiag

    hashdiag.patch()
    plan = {name: (reqs, meta) for name, reqs, meta in main_plan(args)}
    reqs, meta = plan["multiturn"]
    _capture_fresh(s, MAIN_SPEC, "multiturn", reqs, meta, limit_s=90, run_ids=(1,))
    hashdiag.dump(args.out / "hashdiag.jsonl")
    heavy = dict(PRESSURE_LEN, out_median=320, out_lo=128, out_hi=640)
    reqs, meta = _pressure_workload("pressure_preempt", 5.0, 62, heavy)
    spec = EngineSpec("pressure_preempt", num_blocks=PRESSURE_BLOCKS, safety_margin=0.0)
    _capture_fresh(s, spec, "pressure_preempt", reqs, meta, limit_s=60, run_ids=(1, 2))
    hashdiag.dump(args.out / "hashdiag_pressure.jsonl")


def phase_preemptdiag(s: Session, args: argparse.Namespace) -> None:
    """pressure_preempt twice on fresh engines, every block allocation, starved list and victim
    logged (preemptdiag.py): who runs out of blocks and who is preempted."""
    import preemptdiag

    preemptdiag.patch()
    heavy = dict(PRESSURE_LEN, out_median=320, out_lo=128, out_hi=640)
    reqs, meta = _pressure_workload("pressure_preempt", 5.0, 62, heavy)
    spec = EngineSpec("pressure_preempt", num_blocks=PRESSURE_BLOCKS, safety_margin=0.0)
    for run in (1, 2):
        _capture_fresh(s, spec, "pressure_preempt", reqs, meta, limit_s=60, run_ids=(run,))
        preemptdiag.dump(args.out / f"preemptdiag_run{run}.jsonl")


def phase_smoke(s: Session, args: argparse.Namespace) -> None:
    rec = Recorder(use_cuda=False)
    spec = EngineSpec(
        "smoke",
        num_blocks=64,
        block_size=32,
        max_batch_tokens=256,
        use_cuda_graph=False,
        use_async_batching=False,
        precapture_max_seqlen_k=0,
    )
    mgr, info = make_engine(s.model, spec, rec, s.smoke)
    small = dict(
        prompt_median=64,
        prompt_sigma=0.5,
        prompt_lo=8,
        prompt_hi=200,
        out_median=8,
        out_sigma=0.3,
        out_lo=2,
        out_hi=16,
    )
    s.capture(
        mgr,
        rec,
        spec,
        info,
        "smoke_poisson",
        w_poisson("smoke_poisson", 12, 20.0, 3, small),
        runs=2,
    )
    mt = w_multiturn("smoke_mt", 3, 3, 5.0, 0.05, 5)
    for r in mt:
        r.prompt_tokens = max(4, r.prompt_tokens // 8)
        r.max_new_tokens = 4
    s.capture(mgr, rec, spec, info, "smoke_multiturn", mt, runs=1)
    destroy_engine(mgr)
    rec = Recorder(use_cuda=False)
    spec = EngineSpec(
        "smoke_pressure",
        num_blocks=6,
        block_size=32,
        max_batch_tokens=256,
        use_cuda_graph=False,
        use_async_batching=False,
        safety_margin=0.0,
        precapture_max_seqlen_k=0,
    )
    mgr, info = make_engine(s.model, spec, rec, s.smoke)
    press = [Req(f"smoke_press-{i}", 40, 30, send_s=0.01 * i) for i in range(8)]
    s.capture(mgr, rec, spec, info, "smoke_pressure", press, runs=1)
    destroy_engine(mgr)


# The engine's own defaults (ContinuousBatchingConfig with nothing set but graphs and async on):
# 8192-token budget, 64-token query padding, graphs captured lazily while serving, a pool of 0.9
# of free memory. Never fitted on: the held-out configuration of the fidelity issue.
DEFAULTS_SPEC = EngineSpec(
    "defaults_lazy",
    num_blocks=None,
    max_batch_tokens=8192,
    q_padding_interval_size=64,
    precapture_max_seqlen_k=0,
)
MICRO8K_SPEC = EngineSpec(
    "microbench_8k_lazy",
    num_blocks=2200,
    max_batch_tokens=8192,
    q_padding_interval_size=64,
    precapture_max_seqlen_k=0,
)


def phase_portable(s: Session, args: argparse.Namespace) -> None:
    """Held-out captures for the fidelity issue, in the order of `--parts` (the GPU micro-profile
    is a command of its own, kernels/profile_gpu.py): `main` (the fitted configuration: does
    the fit transfer to this GPU?), `defaults` (the engine's defaults, each run on a fresh engine so
    every run pays its own lazy captures), `shared` (a shared system prompt), `swap` (CPU swap
    under pressure with the defaults' budget and padding), `micro8k` (cost micro-runs up to
    8192-token steps at 64-token padding). Every part is packed as soon as it ends."""
    plan = {name: (reqs, meta) for name, reqs, meta in main_plan(args)}
    runs = tuple(range(1, args.runs + 1))
    for part in args.parts.split(","):
        t = perf_counter()
        if part == "main":
            rec = Recorder(use_cuda=not s.smoke)
            mgr, info = make_engine(s.model, MAIN_SPEC, rec, s.smoke)
            for name in args.main_workloads.split(","):
                reqs, meta = plan[name]
                s.capture(mgr, rec, MAIN_SPEC, info, name, reqs, limit_s=90, meta=meta, runs=1)
            destroy_engine(mgr)
        elif part == "defaults":
            for name in args.defaults_workloads.split(","):
                reqs, meta = plan[name]
                for run in runs:
                    _capture_fresh(
                        s,
                        DEFAULTS_SPEC,
                        f"defaults/{name}",
                        reqs,
                        meta,
                        limit_s=90,
                        run_ids=(run,),
                    )
        elif part == "shared":
            reqs, meta = NAMED_WORKLOADS["shared_prompt"]()
            for run in runs:
                _capture_fresh(
                    s,
                    DEFAULTS_SPEC,
                    "defaults/shared_prompt",
                    reqs,
                    meta,
                    limit_s=90,
                    run_ids=(run,),
                )
        elif part == "swap":
            heavy = dict(PRESSURE_LEN, out_median=320, out_lo=128, out_hi=640)
            reqs, meta = _pressure_workload("pressure_swap", 5.0, 62, heavy)
            spec = EngineSpec(
                "defaults_pressure_swap",
                num_blocks=PRESSURE_BLOCKS,
                max_batch_tokens=8192,
                q_padding_interval_size=64,
                precapture_max_seqlen_k=0,
                safety_margin=0.0,
                cpu_offload_space_gib=1.0,
            )
            meta = {**meta, "cpu_offload_space_gib": 1.0}
            for run in runs:
                _capture_fresh(
                    s, spec, "defaults/pressure_swap", reqs, meta, limit_s=60, run_ids=(run,)
                )
        elif part == "micro8k":
            spec = MICRO8K_SPEC
            if args.micro_blocks:  # an 80 GB card holds fewer than the H200's 2,200 blocks
                spec = dataclasses.replace(spec, num_blocks=args.micro_blocks)
            microbench(s, args, name="microbench_8k", spec=spec)
        else:
            raise SystemExit(f"--parts: no part {part!r}")
        pack(s.stage, s.out, "gt")
        print(f"[portable] {part} done in {perf_counter() - t:.1f} s", flush=True)


# --------------------------------------------------------------------------------------------- #
# Policy A/B (issue 29)                                                                         #
# --------------------------------------------------------------------------------------------- #
AB_BLOCKS, AB_SWAP_BLOCKS = 64, 40
AB_SESSIONS = dict(
    num_sessions=20, turns=3, session_rate=1.25, think_mean_s=2.0, seed=81, system_tokens=512
)
AB_SPECS = {
    # the engine's default safety margin: a pool too small for every session's blocks, requests
    # queue instead of preempting
    "ab_sessions": EngineSpec("ab_sessions", num_blocks=AB_BLOCKS),
    # no margin and pinned CPU space: decodes that run out of blocks swap a request out
    "ab_sessions_swap": EngineSpec(
        "ab_sessions_swap", num_blocks=AB_SWAP_BLOCKS, safety_margin=0.0, cpu_offload_space_gib=1.0
    ),
}
AB_SMOKE = dict(block_size=32, max_batch_tokens=256, use_cuda_graph=False, use_async_batching=False)


def phase_policy_ab(s: Session, args: argparse.Namespace) -> None:
    """Every policy of `--policies` on the same engines and request list, `--runs` runs each,
    runs interleaved across policies (run 1 of every policy, then run 2): drift of the machine
    falls on all policies alike. Folders `<policy>/<workload>/run<k>`, packed after every run.

    Runtime estimate (not measured: from hf_cb/2026-12-01 on the H200, where the model built in
    11.6 s, 24 padded shapes x 2 pre-captured in 5.4 s, and `multiturn`, 96 requests of 24 sessions
    at 1.5/s, served in 31 s; these 60 requests of 20 sessions at 1.25/s should take 25-30 s a
    run, `ab_sessions_swap` longer when it swaps): ~30 s of model, engines and pinned pool, then
    ~60 s per policy and run over both workloads. `--policies A,B` x 2 runs ~= 4.5 min,
    `--policies A,B,C` ~= 6.5-7 min: at most 3 policies per 10-minute command (`none`, the
    engine's own order, counts as one); a timeout still returns every packed run."""
    policies = [p for p in args.policies.split(",") if p]  # names checked in main()
    scale = 8 if s.smoke else 1
    meta = {"kind": "policy_ab", **AB_SESSIONS, "scale": scale}
    for name in args.ab_workloads.split(","):
        spec = AB_SPECS[name]  # names checked in main()
        if s.smoke:  # 32-token blocks and lengths / 8 on the CPU; no pinned memory there
            spec = dataclasses.replace(spec, **AB_SMOKE, num_blocks=spec.num_blocks // 2)
        rec = Recorder(use_cuda=not s.smoke)
        mgr, info = make_engine(s.model, spec, rec, s.smoke)
        for run in range(1, args.runs + 1):
            for policy in policies:
                s.policy = policy
                s.capture(
                    mgr,
                    rec,
                    spec,
                    info,
                    name,
                    w_sessions_shared(name, **AB_SESSIONS, scale=scale),  # type: ignore[arg-type]
                    limit_s=90,
                    meta={**meta, "num_blocks": spec.num_blocks},
                    run_ids=(run,),
                    folder_name=f"{policy}/{name}",
                )
        destroy_engine(mgr)
    s.policy = args.policy


PHASES = {
    "policy_ab": phase_policy_ab,
    "portable": phase_portable,
    "mixed": phase_mixed,
    "small": phase_small,
    "fresh": phase_fresh,
    "hashdiag": phase_hashdiag,
    "preemptdiag": phase_preemptdiag,
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument(
        "--phase",
        required=True,
        choices=[
            "explore",
            "main",
            "pressure",
            "smoke",
            "mixed",
            "small",
            "fresh",
            "hashdiag",
            "preemptdiag",
            "portable",
            "policy_ab",
        ],
    )
    ap.add_argument(
        "--policy",
        default="none",
        help="cached-block reuse order of every run (policy_hook.py): a simulator policy name "
        "(mru, lru, lfu, perc, s3fifo, ...); none = the engine's own (dict popitem)",
    )
    ap.add_argument("--policies", default="mru,lru,lfu,perc,s3fifo", help="policy_ab: policies")
    ap.add_argument(
        "--ab-workloads", default="ab_sessions,ab_sessions_swap", help="policy_ab: workloads"
    )
    ap.add_argument("--parts", default="main,defaults,shared,swap,micro8k")
    ap.add_argument("--runs", type=int, default=2, help="portable, policy_ab: runs per workload")
    ap.add_argument("--main-workloads", default="poisson_r6,multiturn,closed_b64,azure_conv_sample")
    ap.add_argument("--defaults-workloads", default="poisson_r6,multiturn,burst_4x")
    ap.add_argument("--micro-blocks", type=int, default=0, help="portable micro8k: KV blocks")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--explore-rate", type=float, default=6.0)
    ap.add_argument(
        "--capacity-rps", type=float, default=11.7, help="closed-batch capacity measured in explore"
    )
    ap.add_argument(
        "--azure", type=Path, default=Path(__file__).with_name("azure_conv_window.json")
    )
    ap.add_argument("--azure-num", type=int, default=80)
    ap.add_argument(
        "--azure-rate", type=float, default=2.4, help="target mean arrival rate after scaling"
    )
    ap.add_argument("--skip", default="", help="comma-separated workload names to skip")
    ap.add_argument(
        "--rerun", default="", help="pressure phase: main workloads to capture again as run 2"
    )
    args = ap.parse_args()
    from policy_hook import PolicyHook

    try:
        for p in [args.policy, *(args.policies.split(",") if args.phase == "policy_ab" else [])]:
            PolicyHook(p)  # unknown names fail here, before the model is built
    except (ValueError, ImportError) as err:
        print(f"error: --policy/--policies: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    bad = [w for w in args.ab_workloads.split(",") if w not in AB_SPECS]
    if args.phase == "policy_ab" and bad:
        print(f"error: --ab-workloads: no workload {bad[0]!r} (known: {', '.join(AB_SPECS)})",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    stage = Path("/tmp/cp_capture") / "gt"
    shutil.rmtree(stage.parent, ignore_errors=True)
    stage.mkdir(parents=True)
    t = perf_counter()
    model = build_model(args.cpu_smoke)
    print(
        f"[model] built in {perf_counter() - t:.1f} s; attn={model.config._attn_implementation}",
        flush=True,
    )
    s = Session(out=args.out, stage=stage, model=model, smoke=args.cpu_smoke, policy=args.policy)
    if args.phase == "smoke":
        phase_smoke(s, args)
    elif args.phase == "explore":
        phase_explore(s, args)
    elif args.phase in PHASES:
        PHASES[args.phase](s, args)
    else:
        (phase_main if args.phase == "main" else phase_pressure)(s, args)
    print("[done] " + json.dumps(s.summaries), flush=True)


if __name__ == "__main__":
    main()
