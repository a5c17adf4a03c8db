"""Open-loop client of the engine and the ground-truth writer (Parquet via pyarrow on the device).

`Session.capture` runs one request list once per run id on an engine whose state (scheduler,
cache, prefix cache, offload pool) is reset before each run, and writes one ground-truth folder per
run, re-packing `$OUT/gt.tar.gz` so a timed-out call still returns every finished run."""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import sys
import tarfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from capture_workloads import Req
from hf_engine import EngineSpec, clear_prefix_cache, engine_config
from hf_instrument import Recorder, resolve_gpu_times
from hf_model import TINY

perf_counter = time.perf_counter
TOKEN_LOW, TOKEN_HIGH = 1000, 120000


def token_ids(seed: int, key: str, n: int, smoke: bool) -> list[int]:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng([seed, h])
    hi = TINY["vocab_size"] - 1 if smoke else TOKEN_HIGH
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


def run_requests(
    mgr: Any,
    rec: Recorder,
    reqs: list[Req],
    seed: int,
    smoke: bool,
    limit_s: float,
    block_size: int = 256,
) -> dict:
    """Send `reqs` open-loop and collect the results: per-request records and the wall time."""
    by_id = {r.request_id: r for r in reqs}
    children: dict[str, list[str]] = defaultdict(list)
    heap: list[tuple[float, int, str]] = []
    for i, r in enumerate(reqs):
        if r.parent_id is None:
            heap.append((float(r.send_s or 0.0), i, r.request_id))
        else:
            children[r.parent_id].append(r.request_id)
    heapq.heapify(heap)
    order = {r.request_id: i for i, r in enumerate(reqs)}
    prompts: dict[str, list[int]] = {}
    outputs: dict[str, Any] = {}
    planned: dict[str, float] = {}
    sent: dict[str, float] = {}
    rec.begin()
    t0 = rec.t0
    while len(outputs) < len(reqs):
        now = perf_counter() - t0
        if now > limit_s:
            print(
                f"[client] time limit {limit_s:.0f} s reached, "
                f"{len(reqs) - len(outputs)} unfinished",
                flush=True,
            )
            break
        while heap and heap[0][0] <= now:
            due, _, rid = heapq.heappop(heap)
            r = by_id[rid]
            if r.parent_id is None:
                ids = token_ids(seed, rid, r.prompt_tokens, smoke)
                if r.prefix_of is not None:
                    ids = prompts[r.prefix_of][: r.prefix_tokens] + ids[r.prefix_tokens :]
            else:
                par = outputs[r.parent_id]
                ids = (
                    prompts[r.parent_id]
                    + list(par.generated_tokens)
                    + token_ids(seed, rid, r.prompt_tokens, smoke)
                )
            prompts[rid] = ids
            planned[rid] = due
            sent[rid] = perf_counter()
            mgr.add_request(input_ids=ids, request_id=rid, max_new_tokens=r.max_new_tokens)
        wait = min(0.02, max(0.0, heap[0][0] - (perf_counter() - t0))) if heap else 0.05
        res = mgr.get_result(timeout=max(wait, 1e-4))
        if res is None:
            if not mgr.is_running():
                print("[client] engine thread died", flush=True)
                break
            continue
        if not res.is_finished():
            continue
        outputs[res.request_id] = res
        toks = rec.token_times.get(res.request_id)
        end_t = toks[-1] if toks else perf_counter()
        for cid in children.get(res.request_id, []):
            heapq.heappush(heap, (end_t - t0 + by_id[cid].think_s, order[cid], cid))
    wall_s = perf_counter() - t0
    rec.active = False
    records = []
    for r in reqs:
        rid = r.request_id
        out = outputs.get(rid)
        toks = rec.token_times.get(rid, [])
        status = "missing" if out is None else ("failed" if out.error is not None else "finished")
        records.append(
            dict(
                request_id=rid,
                session_id=r.session_id,
                parent_id=r.parent_id,
                turn=r.turn,
                think_time_us=int(round(r.think_s * 1e6)),
                planned_send_us=int(round(planned[rid] * 1e6)) if rid in planned else None,
                send_us=rec.rel_us(sent[rid]) if rid in sent else None,
                prompt_tokens=len(prompts[rid]) if rid in prompts else r.prompt_tokens,
                max_new_tokens=r.max_new_tokens,
                output_tokens=len(toks),
                first_token_us=rec.rel_us(toks[0]) if toks else None,
                end_us=rec.rel_us(toks[-1]) if toks else None,
                token_us=[rec.rel_us(t) for t in toks],
                status=status,
                error=None if out is None else out.error,
                engine_created_us=None if out is None else rec.rel_us(out.created_time),
                num_soft_resets=rec.num_soft_resets.get(rid, 0),
                num_cpu_swaps=rec.num_cpu_swaps.get(rid, 0),
                num_restores=rec.num_restores.get(rid, 0),
                prefix_hit_tokens=rec.prefix_hit.get(rid),
                block_hash_ids=block_hashes(prompts[rid], block_size, rid)
                if rid in prompts
                else None,
            )
        )
    return {"records": records, "wall_s": wall_s}


# --------------------------------------------------------------------------------------------- #
# Output                                                                                        #
# --------------------------------------------------------------------------------------------- #
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
    """Parquet with pyarrow (explicit types) where available, else JSON lines (converted later)."""
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
        with open(path.with_suffix(".jsonl"), "w") as f:
            for i in range(len(rows)):
                f.write(json.dumps({k: v[i] for k, v in cols.items()}) + "\n")


def pack(stage: Path, out: Path, name: str) -> None:
    tmp = out / f"{name}.partial"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(stage, arcname=stage.name)
    os.replace(tmp, out / f"{name}.tar.gz")


def kv_traffic(records: list[dict], rec: Recorder, hook: dict, block_size: int) -> dict:
    """Per run: tokens prefilled, hit, recomputed (prefix blocks computed earlier in the run,
    looked up again at a request's first admission and missed), dropped by soft resets and
    swapped to the CPU (preempted requests' blocks x block size)."""
    by_kind: dict[str, int] = defaultdict(int)
    for p in rec.preemptions:
        by_kind[p["kind"]] += int(p["blocks"])
    return dict(
        prefill_tokens=int(sum(s["prefill_tokens"] for s in rec.steps)),
        prefix_hit_tokens=int(sum(r["prefix_hit_tokens"] or 0 for r in records)),
        recomputed_prefix_tokens=int(hook["recomputed_blocks"]) * block_size,
        soft_reset_tokens=by_kind["soft_reset"] * block_size,
        swapped_tokens=by_kind["cpu_swap"] * block_size,
        num_restores=int(sum(r["num_restores"] for r in records)),
    )


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


@dataclass
class Session:
    out: Path
    stage: Path
    model: Any
    smoke: bool
    seed: int = 1234
    summaries: dict = field(default_factory=dict)
    policy: str = "none"  # cached-block reuse order (policy_hook.py); none: the engine's own

    def capture(
        self,
        mgr: Any,
        rec: Recorder,
        spec: EngineSpec,
        info: dict,
        name: str,
        reqs: list[Req],
        runs: int = 2,
        limit_s: float = 120.0,
        meta: dict | None = None,
        run_ids: tuple[int, ...] | None = None,
        folder_name: str | None = None,
    ) -> list[dict]:
        """Run `reqs` once per run id on this engine (scheduler, cache, prefix cache and offload
        state reset before each run; pre-captured graphs kept); one ground-truth folder per run,
        under `folder_name` (default: the workload's name). The cached-block reuse order is
        `self.policy`'s (a fresh hook per run, as a fresh simulation has a fresh policy)."""
        from policy_hook import PolicyHook

        groups = {}
        for r in reqs:  # a turn's group is its session, else the request's own
            groups[r.request_id] = r.session_id or groups.get(r.parent_id or "", r.request_id)
        results = []
        for run in run_ids or tuple(range(1, runs + 1)):
            if mgr.is_running():
                mgr.stop(block=True, timeout=60, keep_for_next_session=True)
            clear_prefix_cache(mgr)
            hook = PolicyHook(self.policy, lambda rid: groups.get(rid, rid))
            hook.attach(mgr)
            mgr.start()
            res = run_requests(mgr, rec, reqs, self.seed, self.smoke, limit_s, spec.block_size)
            mgr.stop(
                block=True,
                timeout=60,
                keep_for_next_session=True,
                hard_stop=len([r for r in res["records"] if r["status"] == "missing"]) > 0,
            )
            resolve_gpu_times(rec)
            folder = self.stage / (folder_name or name) / f"run{run}"
            folder.mkdir(parents=True, exist_ok=True)
            write_table(res["records"], REQUEST_TYPES, folder / "requests")
            write_table(rec.steps, STEP_TYPES, folder / "steps")
            eng = engine_config(mgr, spec, info, self.smoke)
            eng.update(
                workload=name,
                run=run,
                captured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                workload_meta=meta or {},
                wall_s=round(res["wall_s"], 3),
                graph_captures_during_run=rec.captures,
                preemption_events=rec.preemptions,
                prefix_cache_cleared_before_run=True,
                command=" ".join(sys.argv),
                policy=self.policy,
                policy_hook=hook.stats(),
                kv_traffic=kv_traffic(res["records"], rec, hook.stats(), spec.block_size),
            )
            (folder / "engine.json").write_text(json.dumps(eng, indent=1, default=str))
            summ = summarize(res["records"], rec.steps, res["wall_s"])
            self.summaries[f"{folder_name or name}/run{run}"] = summ
            print(
                f"[{folder_name or name} run{run}] "
                + json.dumps(
                    {k: (round(v, 2) if isinstance(v, float) else v) for k, v in summ.items()}
                ),
                flush=True,
            )
            pack(self.stage, self.out, "gt")
            (self.out / "summary.json").write_text(json.dumps(self.summaries, indent=1))
            results.append(summ)
        return results
