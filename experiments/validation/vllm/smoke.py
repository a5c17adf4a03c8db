#!/usr/bin/env python3
"""First vLLM command on the GPU machine: do vLLM 0.26's kernels run on this GPU (SM90)?

Prints the versions of the packages the bundle does not carry (the machine's own) and the GPU,
then generates 4 requests on a dummy-weight Llama-3-8B through AsyncLLM (engine core in a child
process, the path the capture uses). If that fails it tries the fallbacks in order, each one
adding to the last: the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0), eager mode (no CUDA graphs),
the in-process engine (LLMEngine with VLLM_ENABLE_V1_MULTIPROCESSING=0). Each attempt runs in a
subprocess under a timeout; the report (what worked, what failed and the error's tail) goes to
--out as JSON, each attempt's full log beside it.

    PYTHONPATH=/tmp/vllm_site python3 experiments/validation/vllm/smoke.py --out $OUT/smoke.json
    ... --attempts default,compiled --all    # also time vLLM's default torch.compile start-up
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_common import EngineSpec, apply_env, write_model_dir  # noqa: E402

# Packages vLLM imports that the bundle leaves to the machine.
MACHINE_PACKAGES = [
    "torch", "triton", "numpy", "transformers", "tokenizers", "safetensors", "huggingface-hub",
    "numba", "llvmlite", "protobuf", "psutil", "prometheus-client", "sentencepiece", "tiktoken",
    "aiohttp", "anyio", "httpx", "httpcore", "h11", "idna", "msgpack", "cloudpickle", "pyyaml",
    "regex", "pillow", "opencv-python-headless", "einops", "requests", "filelock", "jinja2",
    "typing-extensions", "setuptools", "ninja", "py-cpuinfo", "tqdm", "pyarrow", "uvloop",
    "nvidia-nccl-cu13", "nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13",
]  # fmt: skip
CARRIED = ["vllm", "pydantic", "pydantic-core", "pyzmq", "xgrammar", "llguidance", "openai"]

# name -> (EngineSpec changes, extra env, in-process engine); each fallback adds to the one before.
ATTEMPTS: dict[str, tuple[dict[str, Any], dict[str, str], bool]] = {
    "default": ({}, {}, False),
    "v1_runner": ({}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, False),
    "eager": ({"enforce_eager": True}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, False),
    "inproc": (
        {"enforce_eager": True},
        {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        True,
    ),
    # not a fallback: vLLM's own default compilation (torch.compile + FULL_AND_PIECEWISE graphs)
    "compiled": ({"compilation_mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"}, {}, False),
}
FALLBACK_ORDER = ["default", "v1_runner", "eager", "inproc"]
# capture_vllm.py's flags for the engine each attempt ran
CAPTURE_FLAGS = {
    "default": "",
    "v1_runner": "--v1-runner",
    "eager": "--v1-runner --enforce-eager",
    "inproc": "--v1-runner --enforce-eager --inproc",
    "compiled": "--compilation-mode 3 --cudagraph-mode FULL_AND_PIECEWISE",
}
PROMPT_LENGTHS = (64, 300, 777, 1500)
MAX_TOKENS = 32


def versions(names: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def machine_report() -> dict[str, Any]:
    """Versions, GPU, driver, /dev/shm: what the reference note left unverified."""
    rep: dict[str, Any] = {
        "python": platform.python_version(),
        "machine_packages": versions(MACHINE_PACKAGES),
        "carried_packages": versions(CARRIED),
        "cpu_count": os.cpu_count(),
    }
    try:
        shm = shutil.disk_usage("/dev/shm")
        rep["dev_shm_free_gib"] = round(shm.free / 2**30, 1)
    except OSError as e:
        rep["dev_shm_free_gib"] = f"unreadable: {e}"
    try:
        import torch

        rep["torch_cuda"] = torch.version.cuda
        rep["gpu"] = torch.cuda.get_device_name(0)
        rep["sm"] = "{}{}".format(*torch.cuda.get_device_capability(0))
        free, total = torch.cuda.mem_get_info(0)
        rep["gpu_mem_free_gib"] = round(free / 2**30, 1)
        rep["gpu_mem_total_gib"] = round(total / 2**30, 1)
    except Exception as e:  # the report must still be written
        rep["gpu"] = f"torch/CUDA unusable: {type(e).__name__}: {e}"
    try:
        smi = ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"]
        rep["nvidia_smi"] = subprocess.run(
            smi, capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        rep["nvidia_smi"] = f"unavailable: {e}"
    return rep


def prompts() -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(5)
    return [rng.integers(1000, 120000, size=n).tolist() for n in PROMPT_LENGTHS]


def check_outputs(counts: dict[str, int]) -> None:
    bad = {rid: n for rid, n in counts.items() if n != MAX_TOKENS}
    if len(counts) != len(PROMPT_LENGTHS) or bad:
        raise RuntimeError(f"expected {MAX_TOKENS} tokens from each of 4 requests, got {counts}")


async def run_async(spec: EngineSpec, model_dir: Path) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**spec.engine_kwargs(model_dir)))
    init_s = time.perf_counter() - t0
    params = SamplingParams(
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
        detokenize=False,
        temperature=0.0,
        output_kind=RequestOutputKind.DELTA,
    )

    async def one(i: int, ids: list[int]) -> tuple[str, int, list[float]]:
        n, times = 0, []
        async for out in llm.generate(TokensPrompt(prompt_token_ids=ids), params, f"smoke-{i}"):
            n += len(out.outputs[0].token_ids)
            times.append(time.perf_counter())
        return f"smoke-{i}", n, times

    try:
        t1 = time.perf_counter()
        res = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts())))
        gen_s = time.perf_counter() - t1
        counts = {rid: n for rid, n, _ in res}
        check_outputs(counts)
        cache = llm.vllm_config.cache_config
        return {
            "engine_init_s": round(init_s, 1),
            "generate_s": round(gen_s, 2),
            "tokens": counts,
            "num_gpu_blocks": cache.num_gpu_blocks,
            "block_size": cache.block_size,
            "ttft_ms": {rid: round((t[0] - t1) * 1e3, 1) for rid, _, t in res},
        }
    finally:
        llm.shutdown()


def run_inproc(spec: EngineSpec, model_dir: Path) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine

    t0 = time.perf_counter()
    engine = LLMEngine.from_engine_args(EngineArgs(**spec.engine_kwargs(model_dir)))
    init_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
    for i, ids in enumerate(prompts()):
        engine.add_request(f"smoke-{i}", TokensPrompt(prompt_token_ids=ids), params)
    t1, counts, steps = time.perf_counter(), {}, 0
    while engine.has_unfinished_requests():
        steps += 1
        for out in engine.step():
            if out.finished:
                counts[out.request_id] = len(out.outputs[0].token_ids)
    check_outputs(counts)
    return {
        "engine_init_s": round(init_s, 1),
        "generate_s": round(time.perf_counter() - t1, 2),
        "tokens": counts,
        "steps": steps,
        "num_gpu_blocks": engine.vllm_config.cache_config.num_gpu_blocks,
    }


def child(name: str, result: Path) -> int:
    changes, env, inproc = ATTEMPTS[name]
    apply_env(env)
    spec = EngineSpec(name=f"smoke_{name}", max_model_len=4096, **changes)
    out: dict[str, Any] = {"attempt": name, "spec": spec.as_dict(), "env": env}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = write_model_dir(Path(tmp) / "llama3_8b_dummy")
            res = run_inproc(spec, model_dir) if inproc else asyncio.run(run_async(spec, model_dir))
        out.update(ok=True, **res)
    except BaseException as e:  # reported, not raised: the parent reads the result file
        out.update(
            ok=False,
            error=f"{type(e).__name__}: {e}"[:2000],
            traceback=traceback.format_exc()[-3000:],
        )
    result.write_text(json.dumps(out, indent=1, default=str))
    print(f"[smoke {name}] " + json.dumps(out, default=str)[:1500], flush=True)
    return 0 if out["ok"] else 1


def interesting(log: str) -> list[str]:
    keys = ("backend", "FlashAttention", "Model Runner", "model runner", "cudagraph", "CUDA graph")
    lines = [ln for ln in log.splitlines() if any(k in ln for k in keys)]
    return [ln[-300:] for ln in lines[:40]]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, help="report JSON (logs beside it)")
    ap.add_argument("--attempts", default=",".join(FALLBACK_ORDER))
    ap.add_argument("--all", action="store_true", help="run every attempt, not up to the first ok")
    ap.add_argument("--timeout-s", type=float, default=330.0, help="per attempt")
    ap.add_argument("--budget-s", type=float, default=540.0, help="all attempts together")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.result)
    if args.out is None:
        print("smoke: --out is required", file=sys.stderr)
        return 2
    names = args.attempts.split(",")
    unknown = [n for n in names if n not in ATTEMPTS]
    if unknown:
        print(f"smoke: --attempts: unknown {unknown} (known: {list(ATTEMPTS)})", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    report: dict[str, Any] = {"machine": machine_report(), "attempts": []}
    print("[smoke] " + json.dumps(report["machine"]), flush=True)
    for name in names:
        left = args.budget_s - (time.perf_counter() - t_start)
        if left < 60:
            report["attempts"].append({"attempt": name, "ok": False, "error": "budget spent"})
            continue
        log_path = args.out.with_name(f"smoke_{name}.log")
        result = args.out.with_name(f"smoke_{name}.json")
        cmd = [sys.executable, __file__, "--child", name, "--result", str(result)]
        t = time.perf_counter()
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, timeout=min(args.timeout_s, left)
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        text = log_path.read_text(errors="replace")
        entry: dict[str, Any] = (
            json.loads(result.read_text()) if result.is_file() else {"attempt": name, "ok": False}
        )
        entry.update(rc=rc, wall_s=round(time.perf_counter() - t, 1), notes=interesting(text))
        if not entry.get("ok"):
            entry.setdefault("error", "timed out" if rc == 124 else f"exit {rc}, no result")
            entry["log_tail"] = text[-4000:]
        report["attempts"].append(entry)
        args.out.write_text(json.dumps(report, indent=1, default=str))
        status = "ok" if entry.get("ok") else "FAILED: " + str(entry.get("error"))[:300]
        print(f"[smoke] {name}: {status} ({entry['wall_s']} s)", flush=True)
        if entry.get("ok") and not args.all:
            break
    report["ok"] = [a["attempt"] for a in report["attempts"] if a.get("ok")]
    if report["ok"]:
        report["capture_flags"] = CAPTURE_FLAGS[report["ok"][0]]
    args.out.write_text(json.dumps(report, indent=1, default=str))
    flags = report.get("capture_flags")
    print(
        f"[smoke] working: {report['ok'] or 'none'}; capture_vllm.py flags: {flags!r}; "
        f"report {args.out}",
        flush=True,
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
