"""What every ground-truth capture shares, engine aside (stdlib, numpy; pyarrow when present):
the prompt token ids seeded by request id, the Mooncake-style block hash ids, the column types of
requests.parquet and steps.parquet, the table writer and the packer of `$OUT/gt.tar.gz`.

Split from capture_client.py so that the vLLM capture (vllm/capture_vllm.py) replays the same
prompts without importing torch or transformers."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

TOKEN_LOW, TOKEN_HIGH = 1000, 120000
SMOKE_VOCAB = 4096  # hf_model.TINY["vocab_size"]: the CPU smoke model's vocabulary


# The captures' model: Llama-3-8B's geometry (random weights, bf16), for transformers and vLLM.
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
)


def token_ids(seed: int, key: str, n: int, smoke: bool) -> list[int]:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng([seed, h])
    hi = SMOKE_VOCAB - 1 if smoke else TOKEN_HIGH
    lo = 10 if smoke else TOKEN_LOW
    return rng.integers(lo, hi, size=n).tolist()


def block_hashes(ids: list[int], block_size: int, salt: str) -> list[int]:
    """Mooncake-style hash ids of a prompt: one per block, each a hash of every token up to the
    block's end (so equal ids mean equal prefixes, whoever sent them); a partial last block gets
    an id of its own (`salt`: the request id), as the engine never shares it."""
    out, h = [], hashlib.blake2b(digest_size=8)
    for start in range(0, len(ids), block_size):
        block = ids[start : start + block_size]
        h.update(np.asarray(block, dtype=np.int64).tobytes())
        if len(block) < block_size:
            h.update(salt.encode())
        out.append(int.from_bytes(h.copy().digest(), "little") >> 1)
    return out


REQUEST_TYPES = {
    "request_id": "string",
    "session_id": "string",
    "parent_id": "string",
    "turn": "int32",
    "think_time_us": "int64",
    "planned_send_us": "int64",
    "send_us": "int64",
    "prompt_tokens": "int32",
    "max_new_tokens": "int32",
    "output_tokens": "int32",
    "first_token_us": "int64",
    "end_us": "int64",
    "token_us": "list_int64",
    "status": "string",
    "error": "string",
    "engine_created_us": "int64",
    "num_soft_resets": "int32",
    "num_cpu_swaps": "int32",
    "num_restores": "int32",
    "prefix_hit_tokens": "int32",
    "block_hash_ids": "list_int64",
}
STEP_TYPES = {
    "step": "int32",
    "start_us": "int64",
    "prepare_end_us": "int64",
    "update_start_us": "int64",
    "end_us": "int64",
    "gpu_us": "int64",
    "num_requests": "int32",
    "num_prefill_requests": "int32",
    "num_decode_requests": "int32",
    "num_new_requests": "int32",
    "prefill_tokens": "int32",
    "decode_tokens": "int32",
    "q_tokens": "int32",
    "q_tokens_padded": "int32",
    "kv_read_tokens": "int64",
    "kv_read_padded": "int64",
    "max_seqlen_k": "int32",
    "prefix_hit_tokens": "int32",
    "num_restores": "int32",
    "kv_blocks_in_use": "int32",
    "num_waiting": "int32",
    "num_active": "int32",
    "num_preemptions_total": "int32",
    "graph_captures": "int32",
    "capture_us": "int64",
}


def write_table(
    rows: list[dict], types: dict[str, str], path: Path, extra: dict | None = None
) -> None:
    """Parquet with explicit types: through pyarrow (the GPU machine has it), else polars (the
    simulator's own dependency: tests on a plain install), else JSON lines (converted later)."""
    cols = {name: [row.get(name) for row in rows] for name in types}
    for k, v in (extra or {}).items():
        cols[k] = [v] * len(rows)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        def pa_type(t: str) -> Any:
            return {
                "string": pa.string(),
                "int32": pa.int32(),
                "int64": pa.int64(),
                "list_int64": pa.list_(pa.int64()),
            }.get(t, pa.string())

        arrays = {k: pa.array(v, type=pa_type(types.get(k, "string"))) for k, v in cols.items()}
        pq.write_table(pa.table(arrays), path.with_suffix(".parquet"), compression="zstd")
    except ImportError:
        if _write_with_polars(cols, types, path):
            return
        with open(path.with_suffix(".jsonl"), "w") as f:
            for i in range(len(rows)):
                f.write(json.dumps({k: v[i] for k, v in cols.items()}) + "\n")


def _write_with_polars(cols: dict[str, list], types: dict[str, str], path: Path) -> bool:
    """The same typed Parquet through polars; False where polars is absent too."""
    try:
        import polars as pl
    except ImportError:
        return False
    kinds = {
        "string": pl.Utf8,
        "int32": pl.Int32,
        "int64": pl.Int64,
        "list_int64": pl.List(pl.Int64),
    }
    series = [
        pl.Series(k, v, dtype=kinds.get(types.get(k, "string"), pl.Utf8)) for k, v in cols.items()
    ]
    pl.DataFrame(series).write_parquet(path.with_suffix(".parquet"), compression="zstd")
    return True


def pack(stage: Path, out: Path, name: str) -> None:
    tmp = out / f"{name}.partial"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(stage, arcname=stage.name)
    os.replace(tmp, out / f"{name}.tar.gz")


def summarize(records: list[dict], steps: list[dict], wall_s: float) -> dict:
    done = [r for r in records if r["status"] == "finished" and r["first_token_us"] is not None]
    ttft = [(r["first_token_us"] - r["send_us"]) / 1e3 for r in done]
    tpot = [
        (r["end_us"] - r["first_token_us"]) / 1e3 / (r["output_tokens"] - 1)
        for r in done
        if r["output_tokens"] > 1
    ]
    e2e = [(r["end_us"] - r["send_us"]) / 1e6 for r in done]
    span = (
        (max(r["end_us"] for r in done) - min(r["send_us"] for r in done)) / 1e6
        if done
        else float("nan")
    )
    toks = sum(r["output_tokens"] for r in done)
    return dict(
        requests=len(records),
        finished=len(done),
        wall_s=round(wall_s, 2),
        ttft_mean_ms=float(np.mean(ttft)) if ttft else None,
        ttft_p99_ms=float(np.percentile(ttft, 99)) if ttft else None,
        tpot_mean_ms=float(np.mean(tpot)) if tpot else None,
        tpot_p99_ms=float(np.percentile(tpot, 99)) if tpot else None,
        e2e_mean_s=float(np.mean(e2e)) if e2e else None,
        throughput_tok_s=toks / span if done else None,
        steps=len(steps),
        captures_serving=int(sum(s.get("graph_captures", 0) for s in steps)),
        soft_resets=int(sum(r["num_soft_resets"] for r in records)),
        cpu_swaps=int(sum(r["num_cpu_swaps"] for r in records)),
        step_ms_p50=float(np.median([(s["end_us"] - s["start_us"]) / 1e3 for s in steps]))
        if steps
        else None,
        gpu_ms_p50=float(np.median(gpu))
        if (gpu := [s["gpu_us"] / 1e3 for s in steps if "gpu_us" in s])
        else None,
    )
