#!/usr/bin/env python3
"""Ground truth from vLLM 0.26 (issue 28): the transformers captures' request lists, open loop.

One AsyncLLM engine (engine core in its own process, as `vllm serve` runs it) serves a
dummy-weight Llama-3-8B in bf16, with every scheduler limit pinned (vllm_common.EngineSpec).
Each request is one `generate()` at its arrival time, streamed with DELTA outputs, so every token
has its client time; a stat logger keeps each step's SchedulerStats/IterationStats
(engine_stats.parquet), and the engine core process logs each step's schedule and update times
and token counts (vllm_steplog.py -> steps.parquet). Before every run the prefix cache is reset.
Output: one ground-truth folder per workload and run (requests.parquet, steps.parquet,
engine.json; docs/validation.md), packed into $OUT/gt.tar.gz after every run.

    PYTHONPATH=/tmp/vllm_site python3 experiments/validation/vllm/capture_vllm.py --out $OUT
    ... --workloads poisson_r6,multiturn,shared_prompt --runs 2        # the default
    ... --micro                           # cost micro-runs (capture_workloads.microbench_plan)
    ... --and-micro                       # the workloads, then the micro-runs on the same engine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this folder, experiments/validation
import vllm_steplog  # noqa: E402
from capture_common import REQUEST_TYPES, STEP_TYPES, pack, summarize, write_table  # noqa: E402
from capture_workloads import Req  # noqa: E402
from vllm_common import LLAMA3_8B, EngineSpec, apply_env, write_model_dir  # noqa: E402
from vllm_gt import (  # noqa: E402
    CORE_STEP_TYPES,
    ENGINE_REQUEST_TYPES,
    MICRO_PLANS,
    OpenLoop,
    engine_json,
    preemptions,
    step_rows,
    workload,
)

vllm_steplog.install()  # a spawned engine core process re-imports this module: wrap there too

STAGE = Path("/tmp/cp_vllm_capture") / "gt"
STEP_LOG = Path("/tmp/cp_vllm_capture") / "core_steps.jsonl"
STAT_ROWS: list[dict] = []
EXTRA_STEP_TYPES = {**CORE_STEP_TYPES, "update_end_us": "int64"}
STAT_TYPES = {
    "t_us": "int64",
    "num_running": "int32",
    "num_waiting": "int32",
    "kv_cache_usage_pct": "int32",
    "prefix_queries": "int64",
    "prefix_hits": "int64",
    "ctx_requests": "int32",
    "ctx_tokens": "int32",
    "gen_requests": "int32",
    "gen_tokens": "int32",
    "elapsed_us": "int64",
    "num_generation_tokens": "int32",
    "num_prompt_tokens": "int32",
    "num_preempted_reqs": "int32",
}


def make_stat_logger() -> type:
    """A StatLoggerBase that keeps every record() call (one per engine step's outputs)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepStats(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            row: dict[str, Any] = {"t": time.monotonic()}
            if scheduler_stats is not None:
                pc = scheduler_stats.prefix_cache_stats
                row.update(
                    num_running=scheduler_stats.num_running_reqs,
                    num_waiting=scheduler_stats.num_waiting_reqs,
                    kv_cache_usage_pct=round(100 * scheduler_stats.kv_cache_usage),
                    prefix_queries=pc.queries,
                    prefix_hits=pc.hits,
                )
                d = scheduler_stats.iteration_details
                if d is not None:
                    row.update(
                        ctx_requests=d.num_ctx_requests,
                        ctx_tokens=d.num_ctx_tokens,
                        gen_requests=d.num_generation_requests,
                        gen_tokens=d.num_generation_tokens,
                        elapsed_us=round(d.elapsed_ms * 1e3),
                    )
            if iteration_stats is not None:
                row.update(
                    num_generation_tokens=iteration_stats.num_generation_tokens,
                    num_prompt_tokens=iteration_stats.num_prompt_tokens,
                    num_preempted_reqs=iteration_stats.num_preempted_reqs,
                )
            STAT_ROWS.append(row)

        def log_engine_initialized(self) -> None:
            pass

    return StepStats


class InprocEngine:
    """LLMEngine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), the smoke run's last
    fallback, behind AsyncLLM's `generate`/`abort`/`reset_prefix_cache`/`shutdown`: a task steps
    the engine whenever it has work, and each step's outputs go to their requests' streams."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.vllm_config = engine.vllm_config
        self.streams: dict[str, asyncio.Queue] = {}
        self.task: asyncio.Task | None = None

    async def _loop(self) -> None:
        while True:
            if not self.engine.has_unfinished_requests():
                await asyncio.sleep(0.001)
                continue
            for out in self.engine.step():  # blocks the loop for one step, as the core does
                stream = self.streams.get(out.request_id)
                if stream is not None:
                    stream.put_nowait(out)
            await asyncio.sleep(0)  # let due requests be added between steps

    async def generate(self, prompt: Any, params: Any, rid: str) -> Any:
        if self.task is None:
            self.task = asyncio.create_task(self._loop())
        stream: asyncio.Queue = asyncio.Queue()
        self.streams[rid] = stream
        self.engine.add_request(rid, prompt, params)
        try:
            while (out := await stream.get()) is not None:
                yield out
                if out.finished:
                    return
        finally:
            self.streams.pop(rid, None)

    async def abort(self, ids: list[str]) -> None:
        self.engine.abort_request(list(ids))
        for rid in ids:
            if rid in self.streams:
                self.streams[rid].put_nowait(None)

    async def reset_prefix_cache(self) -> bool:
        return bool(self.engine.reset_prefix_cache())

    def shutdown(self) -> None:
        if self.task is not None:
            self.task.cancel()


def resolve_config(cfg: Any) -> dict[str, Any]:
    """The engine's resolved settings, read back from its VllmConfig (not the arguments). A value
    that cannot be read is None (engine.json then says so, and validate refuses it) rather than
    the end of a capture whose engine is already up."""

    def name(v: Any) -> Any:
        return getattr(v, "name", None) or (None if v is None else str(v))

    fields: dict[str, tuple[str, Callable[[Any], Any]]] = {
        "max_num_batched_tokens": ("scheduler_config.max_num_batched_tokens", int),
        "max_num_seqs": ("scheduler_config.max_num_seqs", int),
        "block_size": ("cache_config.block_size", int),
        "num_gpu_blocks": ("cache_config.num_gpu_blocks", int),
        "enable_prefix_caching": ("cache_config.enable_prefix_caching", bool),
        "enable_chunked_prefill": ("scheduler_config.enable_chunked_prefill", bool),
        "async_scheduling": ("scheduler_config.async_scheduling", bool),
        "scheduling_policy": ("scheduler_config.policy", str),
        "watermark": ("scheduler_config.watermark", float),
        "scheduler_reserve_full_isl": ("scheduler_config.scheduler_reserve_full_isl", bool),
        "long_prefill_token_threshold": ("scheduler_config.long_prefill_token_threshold", int),
        "max_model_len": ("model_config.max_model_len", int),
        "compilation_mode": ("compilation_config.mode", int),
        "cudagraph_mode": ("compilation_config.cudagraph_mode", name),
        "enforce_eager": ("model_config.enforce_eager", bool),
        "gpu_memory_utilization": ("cache_config.gpu_memory_utilization", float),
        "kv_offloading_size": ("cache_config.kv_offloading_size", lambda v: v),
        "kv_offloading_backend": ("cache_config.kv_offloading_backend", str),
        "prefix_caching_hash_algo": ("cache_config.prefix_caching_hash_algo", str),
        "dtype": ("model_config.dtype", lambda v: str(v).removeprefix("torch.")),
        "model_runner": ("use_v2_model_runner", lambda v: "v2" if v else "v1"),
        "cudagraph_capture_sizes": ("compilation_config.cudagraph_capture_sizes", list),
        "max_cudagraph_capture_size": ("compilation_config.max_cudagraph_capture_size", int),
        "attention_backend": ("attention_config.backend", name),
    }
    out: dict[str, Any] = {}
    for key, (path, conv) in fields.items():
        try:
            value = cfg
            for part in path.split("."):
                value = getattr(value, part)
            out[key] = None if value is None else conv(value)
        except Exception as e:  # recorded; validate refuses what it needs and lacks
            out[key] = None
            print(f"[engine] cannot read {path}: {type(e).__name__}: {e}", flush=True)
    return out


def machine() -> dict[str, Any]:
    import torch
    import vllm

    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm": "{}{}".format(*torch.cuda.get_device_capability(0)),
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__},
    }


def vllm_request(r: Req, ids: list[int]) -> tuple[Any, Any]:
    """The prompt and sampling parameters of one request: its token ids, exactly max_new_tokens
    greedy tokens (EOS ignored), streamed as deltas, not detokenized."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=r.max_new_tokens,
        ignore_eos=True,
        detokenize=False,
        temperature=0.0,
        output_kind=RequestOutputKind.DELTA,
    )
    return TokensPrompt(prompt_token_ids=ids), params


async def serve(
    llm: Any,
    reqs: list[Req],
    limit_s: float,
    make_request: Callable[[Req, list[int]], tuple[Any, Any]] = vllm_request,
) -> tuple[OpenLoop, float, float]:
    """Send `reqs` open loop on `llm` (AsyncLLM: `generate`, `abort`), each request a task at its
    planned time; returns the client state and the run's start and end (time.monotonic)."""
    client = OpenLoop(reqs)
    t0 = time.monotonic()
    tasks: set[asyncio.Task] = set()

    async def one(r: Req, ids: list[int]) -> None:
        rid = r.request_id
        prompt, params = make_request(r, ids)
        client.sent(rid, time.monotonic())
        try:
            async for out in llm.generate(prompt, params, rid):
                client.tokens(rid, time.monotonic(), list(out.outputs[0].token_ids))
                rec = client.records[rid]
                if out.num_cached_tokens is not None:
                    rec.num_cached_tokens = out.num_cached_tokens
                if out.finished and out.metrics is not None:
                    m = out.metrics
                    rec.engine = {
                        k: getattr(m, k, None)
                        for k in ("queued_ts", "scheduled_ts", "first_token_ts")
                    }
            client.finish(rid, t0)
        except Exception as e:  # a failed request is a row, not the end of the run
            client.finish(rid, t0, error=f"{type(e).__name__}: {e}"[:500])

    while not client.done():
        now = time.monotonic() - t0
        if now > limit_s:
            left = [rid for rid, rec in client.records.items() if not rec.finished]
            print(f"[client] limit {limit_s:.0f} s: {len(left)} unfinished, aborted", flush=True)
            await llm.abort(left)
            if tasks:  # an aborted stream ends; one that does not is cancelled
                _, stuck = await asyncio.wait(tasks, timeout=2)
                for task in stuck:
                    task.cancel()
            break
        for r, ids in client.due(now):
            task = asyncio.create_task(one(r, ids))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        nxt = client.next_due_s()
        await asyncio.sleep(0.005 if nxt is None else min(0.005, max(0.0, nxt - now)))
    return client, t0, time.monotonic()


def write_run(
    folder: Path,
    client: OpenLoop,
    t0: float,
    t1: float,
    engine: dict[str, Any],
) -> dict:
    """requests.parquet, steps.parquet, engine_stats.parquet, engine.json of one run."""
    core = vllm_steplog.read(STEP_LOG)
    block_size = engine["block_size"]
    rows = client.rows(t0, block_size, preemptions(core, t0, t1))
    steps = step_rows(core, t0, t1)
    stats = [
        {**{k: v for k, v in s.items() if k != "t"}, "t_us": round((s["t"] - t0) * 1e6)}
        for s in STAT_ROWS
        if t0 <= s["t"] <= t1
    ]
    folder.mkdir(parents=True, exist_ok=True)
    write_table(rows, {**REQUEST_TYPES, **ENGINE_REQUEST_TYPES}, folder / "requests")
    if steps:
        write_table(steps, {**STEP_TYPES, **EXTRA_STEP_TYPES}, folder / "steps")
    write_table(stats, STAT_TYPES, folder / "engine_stats")
    eng = {**engine, "step_source": "engine_core_step_log" if steps else "none"}
    eng["num_preemptions"] = sum(r["num_soft_resets"] for r in rows)
    (folder / "engine.json").write_text(json.dumps(eng, indent=1, default=str))
    return summarize(rows, steps, t1 - t0)


async def session(args: argparse.Namespace, spec: EngineSpec, model_dir: Path) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t = time.perf_counter()
    kw = spec.engine_kwargs(model_dir)
    # (enable_logging_iteration_details would add per-step token counts to the stats, but also
    # one INFO line per step from the default logger: the engine core's step log has them.)
    if args.inproc:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        llm: Any = InprocEngine(
            LLMEngine.from_engine_args(EngineArgs(**kw), stat_loggers=[make_stat_logger()])
        )
    else:
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw), stat_loggers=[make_stat_logger()])
    init_s = time.perf_counter() - t
    resolved = resolve_config(llm.vllm_config)
    base = {
        **machine(),
        "engine_spec": spec.as_dict(),
        "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("VLLM_")},
        "engine_init_s": round(init_s, 1),
        "frontend": "LLMEngine in-process" if args.inproc else "AsyncLLM, engine core process",
        "command": " ".join(sys.argv),
        "prefix_cache_cleared_before_run": True,
    }
    print(f"[engine] up in {init_s:.0f} s: " + json.dumps(resolved), flush=True)
    summaries: dict[str, Any] = {}
    try:
        if args.warmup:
            warm, _ = workload("poisson_r6")
            warm = [replace(r, request_id=f"warmup-{r.request_id}") for r in warm[: args.warmup]]
            client, t0, t1 = await serve(llm, warm, 60)
            print(f"[warmup] {len(warm)} requests in {t1 - t0:.1f} s", flush=True)
        if args.micro:
            await micro_runs(llm, args, resolved, base, summaries)
        for name, run, reqs, meta in [] if args.micro else runs_plan(args):
            await llm.reset_prefix_cache()
            client, t0, t1 = await serve(llm, reqs, args.limit_s)
            extra = {
                **base,
                "workload": name,
                "run": run,
                "workload_meta": meta,
                "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "wall_s": round(t1 - t0, 3),
            }
            eng = engine_json(resolved, LLAMA3_8B, extra)
            summ = write_run(STAGE / name / f"run{run}", client, t0, t1, eng)
            summaries[f"{name}/run{run}"] = summ
            short = {k: round(v, 2) if isinstance(v, float) else v for k, v in summ.items()}
            print(f"[{name}/run{run}] " + json.dumps(short), flush=True)
            pack(STAGE, args.out, "gt")
            (args.out / "summary.json").write_text(json.dumps(summaries, indent=1))
        if args.and_micro:  # the micro-runs on the same engine: one start-up fewer
            await micro_runs(llm, args, resolved, base, summaries)
            (args.out / "summary.json").write_text(json.dumps(summaries, indent=1))
    finally:
        llm.shutdown()
    return summaries


def runs_plan(args: argparse.Namespace) -> list[tuple[str, int, list[Req], dict]]:
    plan = []
    for name in args.workloads.split(","):
        reqs, meta = workload(name)
        for run in range(1, args.runs + 1):
            plan.append((name, run, reqs, meta))
    return plan


def micro_plan(name: str) -> list[tuple[dict, list[Req]]]:
    """A micro-run plan's configurations, each twice (rep 1 meets any lazy compilation, rep 2
    replays), request ids suffixed with the rep."""
    if name not in MICRO_PLANS:
        raise SystemExit(f"--micro-plans: no plan {name!r} (known: {', '.join(MICRO_PLANS)})")
    configs = MICRO_PLANS[name]()
    plan = []
    for rep in (1, 2):
        for cid, (cfg, reqs) in enumerate(configs):
            reqs = [
                replace(
                    r,
                    request_id=f"{r.request_id}-r{rep}",
                    parent_id=f"{r.parent_id}-r{rep}" if r.parent_id else None,
                    prefix_of=f"{r.prefix_of}-r{rep}" if r.prefix_of else None,
                )
                for r in reqs
            ]
            plan.append(({**cfg, "rep": rep, "config_id": cid}, reqs))
    return plan


MICRO_TAG_TYPES = {
    "bench": "string",
    "batch_size": "int32",
    "cfg_prompt_tokens": "int32",
    "context_tokens": "int32",
    "rep": "int32",
    "config_id": "int32",
}


async def micro_runs(
    llm: Any, args: argparse.Namespace, resolved: dict, base: dict, summaries: dict
) -> None:
    """Cost micro-runs in the transformers captures' format (one folder per plan: steps.parquet
    and micro_requests.parquet tagged with the configuration, microbench.json), the prefix cache
    reset before each configuration; rewritten and packed after each one."""
    for name in args.micro_plans.split(","):
        folder = STAGE / name
        folder.mkdir(parents=True, exist_ok=True)
        all_steps: list[dict] = []
        all_reqs: list[dict] = []
        configs: list[dict] = []
        for tag, reqs in micro_plan(name):
            await llm.reset_prefix_cache()
            client, t0, t1 = await serve(llm, reqs, 30.0)
            core = vllm_steplog.read(STEP_LOG)
            steps = [{**st, **tag} for st in step_rows(core, t0, t1)]
            rows = client.rows(t0, resolved["block_size"], preemptions(core, t0, t1))
            all_steps += steps
            all_reqs += [{**r, **tag} for r in rows]
            configs.append({**tag, "wall_s": round(t1 - t0, 3), "steps": len(steps)})
            write_table(
                all_steps, {**STEP_TYPES, **EXTRA_STEP_TYPES, **MICRO_TAG_TYPES}, folder / "steps"
            )
            write_table(
                all_reqs,
                {**REQUEST_TYPES, **ENGINE_REQUEST_TYPES, **MICRO_TAG_TYPES},
                folder / "micro_requests",
            )
            eng = engine_json(resolved, LLAMA3_8B, {**base, "configs": configs})
            eng["note"] = (
                "cost micro-runs; gpu_us is the step's interval on the engine core's clock "
                "(steps.parquet start_us..end_us), not CUDA events"
            )
            (folder / "microbench.json").write_text(json.dumps(eng, indent=1, default=str))
            pack(STAGE, args.out, "gt")
        summaries[name] = {"configs": len(configs), "steps": len(all_steps)}
        print(f"[{name}] {len(configs)} configurations, {len(all_steps)} steps", flush=True)


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, EngineSpec]:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workloads", default="poisson_r6,multiturn,shared_prompt")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--limit-s", type=float, default=120.0, help="per run")
    ap.add_argument("--warmup", type=int, default=48, help="warm-up requests before the runs")
    ap.add_argument("--micro", action="store_true", help="cost micro-runs instead of workloads")
    ap.add_argument("--and-micro", action="store_true", help="the workloads, then the micro-runs")
    ap.add_argument("--micro-plans", default="microbench,microbench_mixed")
    d = EngineSpec()
    ap.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    ap.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    ap.add_argument("--block-size", type=int, default=d.block_size)
    ap.add_argument("--max-model-len", type=int, default=d.max_model_len)
    ap.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    ap.add_argument("--num-gpu-blocks", type=int, default=None, help="num_gpu_blocks_override")
    ap.add_argument("--compilation-mode", type=int, default=d.compilation_mode)
    ap.add_argument("--cudagraph-mode", default=d.cudagraph_mode)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--no-async-scheduling", action="store_true")
    ap.add_argument("--kv-offloading-gib", type=float, default=None)
    ap.add_argument("--v1-runner", action="store_true", help="VLLM_USE_V2_MODEL_RUNNER=0")
    ap.add_argument(
        "--inproc", action="store_true", help="LLMEngine in this process (smoke's last fallback)"
    )
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.micro and args.and_micro:
        ap.error("--micro runs the micro-runs alone; --and-micro runs them after the workloads")
    spec = EngineSpec(
        name="vllm_micro" if args.micro else "vllm_main",
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpu_blocks_override=args.num_gpu_blocks,
        compilation_mode=args.compilation_mode,
        cudagraph_mode=args.cudagraph_mode,
        enforce_eager=args.enforce_eager,
        async_scheduling=not args.no_async_scheduling,
        kv_offloading_size_gib=args.kv_offloading_gib,
        env={
            **({"VLLM_USE_V2_MODEL_RUNNER": "0"} if args.v1_runner else {}),
            **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if args.inproc else {}),
        },
    )
    return args, spec


def main() -> int:
    args, spec = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(STAGE.parent, ignore_errors=True)
    STAGE.mkdir(parents=True)
    apply_env({**spec.env, vllm_steplog.ENV: str(STEP_LOG)})
    vllm_steplog.install()  # before the engine core process forks
    model_dir = write_model_dir(STAGE.parent / "llama3_8b_dummy")
    try:
        summaries = asyncio.run(session(args, spec, model_dir))
    except Exception:
        (args.out / "capture_error.txt").write_text(traceback.format_exc())
        print("[capture] failed:\n" + traceback.format_exc()[-3000:], flush=True)
        if STAGE.exists():
            pack(STAGE, args.out, "gt")
        return 1
    print("[done] " + json.dumps(summaries, default=str)[:4000], flush=True)
    print("spec: " + json.dumps(asdict(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
