"""One vLLM engine, one cache policy: sessions in rounds, per-request TTFT and TPOT (CUDA host).

`run_one` runs inside `python -m cachepilot_sim.tools.vllm_bench`'s per-policy process and needs
vLLM 0.33 (or 0.26 with `--vllm-api 0.26`) with its CUDA dependencies (imported there, not at
module level), so it is not exercised by the test suite (the sessions, the summary, the argument
handling and the engine configuration are: tests/unit/test_vllm_bench.py).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class BenchSession:
    """One conversation: the user's turns (text, or token ids) and the answer length per turn."""

    session_id: str
    turns: list[Any]
    max_tokens: list[int]


def summarize(records: list[dict[str, Any]], wall_s: float) -> dict[str, float]:
    """records: per request ttft_s, tpot_s (nan for one-token answers), output_tokens."""
    ttft = np.array([r["ttft_s"] for r in records], dtype=np.float64)
    tpot = np.array([r["tpot_s"] for r in records], dtype=np.float64)
    tpot = tpot[~np.isnan(tpot)]
    tokens = sum(r["output_tokens"] for r in records)
    return {
        "requests": len(records),
        "ttft_s_mean": float(ttft.mean()) if ttft.size else 0.0,
        "ttft_s_p50": float(np.percentile(ttft, 50)) if ttft.size else 0.0,
        "ttft_s_p99": float(np.percentile(ttft, 99)) if ttft.size else 0.0,
        "tpot_ms_mean": float(tpot.mean() * 1e3) if tpot.size else 0.0,
        "tpot_ms_p50": float(np.percentile(tpot, 50) * 1e3) if tpot.size else 0.0,
        "output_tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(records) / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
    }


def _prompt(context: Any, turn: Any) -> Any:
    """Turn k's prompt: the whole earlier conversation, then the new user turn."""
    if isinstance(turn, list):
        return list(context or []) + turn
    return f"{context}\n{turn}" if context else turn


def _record(output: Any) -> dict[str, float]:
    m = output.metrics  # RequestStateStats; filled because disable_log_stats=False
    n = int(m.num_generation_tokens)
    tpot = (m.last_token_ts - m.first_token_ts) / (n - 1) if n > 1 else math.nan
    return {"ttft_s": float(m.first_token_latency), "tpot_s": float(tpot), "output_tokens": n}


def run_one(
    args: argparse.Namespace, sessions: list[BenchSession], kwargs: dict[str, Any]
) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**kwargs)
    contexts: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    for k in range(max((len(s.turns) for s in sessions), default=0)):
        batch = [s for s in sessions if len(s.turns) > k]
        prompts = [_prompt(contexts.get(s.session_id), s.turns[k]) for s in batch]
        inputs = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in prompts]
        params = [
            SamplingParams(
                max_tokens=s.max_tokens[k],
                ignore_eos=True,
                temperature=0.0,
                extra_args={"kv_transfer_params": {"session_id": s.session_id}},
            )
            for s in batch
        ]
        for s, prompt, out in zip(batch, prompts, llm.generate(inputs, params), strict=True):
            answer = out.outputs[0]
            contexts[s.session_id] = (
                prompt + list(answer.token_ids)
                if isinstance(prompt, list)
                else prompt + answer.text
            )
            records.append({**_record(out), "session": s.session_id, "turn": k})
    wall_s = time.perf_counter() - start
    extra = kwargs["kv_transfer_config"]["kv_connector_extra_config"]
    return {
        "policy": extra.get("eviction_policy") or extra.get("cachepilot_policy"),
        "engine_kwargs": kwargs,
        "records": records,
        "summary": summarize(records, wall_s),
    }
