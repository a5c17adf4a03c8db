"""Plain vLLM vs vLLM with our PERC CPU-offload cache policy, same model, same sessions (CUDA host).

Each policy runs in its own process (a fresh engine: GPU memory is not shared between runs). Every
engine gets the same KV-offload connector (CPU tier of --cpu-offload-gb) and differs only in
`eviction_policy` (+ `cache_policy_module_path` for ours). Sessions run in rounds: round k sends
turn k of every session that has one, its prompt extending the session's earlier context, with the
session id in kv_transfer_params. Reported per policy: TTFT, TPOT and throughput.

    python -m cachepilot_sim.tools.vllm_bench --model /models/llama-3.1-8b --out results/
    python -m cachepilot_sim.tools.vllm_bench --model ./cfg-dir --dummy-weights --emit-script job.sh
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.integrations.vllm.engine_run import BenchSession, run_one
from cachepilot_sim.integrations.vllm.params import (
    ENV_VAR,
    EXTRA_CONFIG_KEY,
    POLICY_MODULE,
    POLICY_NAME,
    PercParams,
)

GIB = 1024**3
POLICIES = ("lru", "arc", "perc")
# vLLM 0.26 (integrations/vllm/spec026.py; the spec sets tokens_per_chunk itself)
SPEC026_NAME = "PercCPUOffloadingSpec026"
SPEC026_MODULE = "cachepilot_sim.integrations.vllm.spec026"
POLICY_KEY_026 = "cachepilot_policy"
PERC_026_KEYS = ("delta_s", "ema_weight", "prior_gap_s", "hardware_file")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cachepilot_sim.tools.vllm_bench", description=__doc__
    )
    p.add_argument("--model", required=True, help="local model dir (weights, or config only)")
    p.add_argument(
        "--dummy-weights", action="store_true", help="random weights (load_format=dummy)"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompts", help='JSONL: {"session_id", "turns": [...]} or {"prompt"}')
    src.add_argument("--dataset", help="local ShareGPT-style JSON (human turns are used)")
    p.add_argument(
        "--workload",
        default=str(CONF_DIR / "workload" / "mixed.yaml"),
        help="without --prompts/--dataset: synthetic token-id sessions of this mix",
    )
    p.add_argument("--num-sessions", type=int, default=64)
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=0, help="answer length; 0: from the workload")
    p.add_argument("--vocab-size", type=int, default=32_000, help="synthetic token ids < this")
    p.add_argument("--policies", default="lru,perc", help=f"comma list of {POLICIES}")
    p.add_argument("--cpu-offload-gb", type=float, default=8.0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--max-model-len", type=int, default=32_768)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--blocks-per-chunk", type=int, default=16, help="tokens per chunk / block size")
    p.add_argument("--perc-delta-s", type=float, default=30.0)
    p.add_argument("--perc-ema-weight", type=float, default=0.3)
    p.add_argument("--perc-prior-gap-s", type=float, default=20.0)
    p.add_argument(
        "--hardware-file", default="", help="a hardware YAML (cachepilot_sim/conf/hardware/)"
    )
    p.add_argument(
        "--vllm-api",
        choices=("0.33", "0.26"),
        default="0.33",
        help="0.26: our policy through integrations/vllm/spec026.py (the lent GPU's vLLM), "
        "replies offloaded too (offload_prompt_only=false) for every policy",
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="compilation_config mode 0 with decode-only CUDA graphs (no torch.compile wait)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="vllm_bench_out", help="folder for per-policy JSON + summary")
    p.add_argument("--only", choices=POLICIES, help=argparse.SUPPRESS)  # one engine, one process
    p.add_argument("--emit-script", help="write a standalone job script with these args and exit")
    args = p.parse_args(argv)
    bad = [x for x in args.policies.split(",") if x not in POLICIES]
    if bad:
        p.error(f"--policies: unknown {bad}; known: {list(POLICIES)}")
    if args.cpu_offload_gb <= 0 or not 0 < args.gpu_memory_utilization <= 1:
        p.error("--cpu-offload-gb must be > 0 and --gpu-memory-utilization in (0, 1]")
    return args


def perc_params(args: argparse.Namespace) -> PercParams:
    return PercParams(
        delta_s=args.perc_delta_s,
        ema_weight=args.perc_ema_weight,
        prior_gap_s=args.perc_prior_gap_s,
        hardware_file=args.hardware_file,
        tokens_per_chunk=args.block_size * args.blocks_per_chunk,
    )


def engine_env(args: argparse.Namespace, policy: str) -> dict[str, str]:
    """Environment for the engine process: our parameters travel in $CACHEPILOT_PERC."""
    if policy != "perc":
        return {}
    params = perc_params(args)
    return {ENV_VAR: json.dumps({f: getattr(params, f) for f in params.__slots__})}


def engine_kwargs(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    """vllm.LLM(**kwargs) for one policy; only the cache policy differs between policies."""
    extra: dict[str, Any] = {
        "cpu_bytes_to_use": int(args.cpu_offload_gb * GIB),
        "blocks_per_chunk": args.blocks_per_chunk,
        "eviction_policy": policy,
    }
    if args.vllm_api == "0.26":  # a spec of ours; lru/arc are vLLM 0.26's own policies
        extra["offload_prompt_only"] = False  # 0.26's default offloads prompt blocks only
        if policy == "perc":
            params = perc_params(args)
            del extra["eviction_policy"]
            extra |= {
                "spec_name": SPEC026_NAME,
                "spec_module_path": SPEC026_MODULE,
                POLICY_KEY_026: "perc",
                EXTRA_CONFIG_KEY: {f: getattr(params, f) for f in PERC_026_KEYS},
            }
    elif policy == "perc":
        extra["eviction_policy"] = POLICY_NAME
        extra["cache_policy_module_path"] = POLICY_MODULE
    kwargs: dict[str, Any] = {
        "model": args.model,
        "seed": args.seed,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_model_len": args.max_model_len,
        "block_size": args.block_size,
        "enable_prefix_caching": True,
        "disable_log_stats": False,  # per-request metrics (TTFT, token timestamps)
        "kv_transfer_config": {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        },
    }
    if args.no_compile:
        kwargs["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    if args.dummy_weights:
        kwargs["load_format"] = "dummy"
    if args.prompts is None and args.dataset is None:
        kwargs["skip_tokenizer_init"] = True  # synthetic sessions are token ids
    return kwargs


def load_sessions(args: argparse.Namespace) -> list[BenchSession]:
    if args.prompts:
        sessions = _sessions_from_jsonl(Path(args.prompts), args)
    elif args.dataset:
        sessions = _sessions_from_sharegpt(Path(args.dataset), args)
    else:
        sessions = _synthetic_sessions(args)
    return sessions[: args.num_sessions]


def _answer_len(args: argparse.Namespace, n: int) -> list[int]:
    return [args.max_tokens or 256] * n


def _sessions_from_jsonl(path: Path, args: argparse.Namespace) -> list[BenchSession]:
    out: list[BenchSession] = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        turns = list(row["turns"]) if "turns" in row else [row["prompt"]]
        turns = turns[: args.max_turns]
        out.append(
            BenchSession(str(row.get("session_id", i)), turns, _answer_len(args, len(turns)))
        )
    return out


def _sessions_from_sharegpt(path: Path, args: argparse.Namespace) -> list[BenchSession]:
    out: list[BenchSession] = []
    for i, conv in enumerate(json.loads(path.read_text())):
        turns = [m["value"] for m in conv.get("conversations", []) if m.get("from") == "human"]
        turns = turns[: args.max_turns]
        if turns:
            sid = str(conv.get("id", i))
            out.append(BenchSession(sid, turns, _answer_len(args, len(turns))))
    return out


def _synthetic_sessions(args: argparse.Namespace) -> list[BenchSession]:
    """Token-id sessions with the simulator's lengths (SessionFactory on the workload file)."""
    from cachepilot_sim.config import SimConfig
    from cachepilot_sim.integrations.vllm.evictor_bench import load_workload
    from cachepilot_sim.rng import make_streams
    from cachepilot_sim.workloads.synthetic import SessionFactory

    streams = make_streams(args.seed)
    factory = SessionFactory(SimConfig(workload=load_workload(Path(args.workload))), streams)
    out: list[BenchSession] = []
    for _ in range(args.num_sessions):
        spec = factory.make()
        turns: list[Any] = []
        answers: list[int] = []
        context = 0
        for k in range(min(spec.num_turns, args.max_turns)):
            prompt, answer = (
                int(spec.prompt_tokens[k]),
                args.max_tokens or int(spec.output_tokens[k]),
            )
            if context + prompt + answer > args.max_model_len:
                break  # the conversation stops before it would exceed the engine's context
            turns.append(streams.spare.integers(0, args.vocab_size, prompt).tolist())
            answers.append(answer)
            context += prompt + answer
        if turns:
            out.append(BenchSession(f"s{spec.session_id}", turns, answers))
    return out


def standalone_script(argv: Sequence[str], project_spec: str = ".") -> str:
    """A bash job script that installs vLLM 0.33 and this project, then runs the benchmark with
    exactly `argv` (minus --emit-script), writing to its --out folder."""
    command = shlex.join(
        ["python", "-m", "cachepilot_sim.tools.vllm_bench", *_strip_emit_script(list(argv))]
    )
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            "# Generated by `python -m cachepilot_sim.tools.vllm_bench --emit-script`: plain vLLM",
            "# vs vLLM with the CachePilot PERC CPU-offload cache policy. Needs a CUDA GPU.",
            "set -euo pipefail",
            'VENV="${VENV:-.venv-vllm-bench}"',
            'python3 -m venv "$VENV"',
            'source "$VENV/bin/activate"',
            f"pip install {shlex.quote(project_spec + '[vllm]')}",
            "python -c 'import vllm; assert vllm.__version__.startswith(\"0.33.\")'",
            command,
            "",
        ]
    )


def _strip_emit_script(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--emit-script":
            skip = True
        elif not arg.startswith("--emit-script="):
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.emit_script:
        Path(args.emit_script).write_text(standalone_script(argv))
        print(f"wrote {args.emit_script}")
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        result = run_one(args, load_sessions(args), engine_kwargs(args, args.only))
        (out / f"{args.only}.json").write_text(json.dumps(result, indent=2) + "\n")
        return
    summary: dict[str, Any] = {}
    for policy in args.policies.split(","):
        env = {**os.environ, **engine_env(args, policy)}
        cmd = [sys.executable, "-m", "cachepilot_sim.tools.vllm_bench", *argv, "--only", policy]
        subprocess.run(cmd, check=True, env=env)
        summary[policy] = json.loads((out / f"{policy}.json").read_text())["summary"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
