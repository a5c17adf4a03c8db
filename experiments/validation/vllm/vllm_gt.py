"""The vLLM capture's logic that needs no GPU and no vllm: the request lists (the transformers
captures' own), the open-loop client state, a scheduler step's summary, and the rows of
requests.parquet, steps.parquet and engine.json (format: docs/validation.md).

Times are `time.monotonic()` seconds (CLOCK_MONOTONIC, one clock for the client and the engine
core process on one host), written as integer microseconds from the run's start."""

from __future__ import annotations

import heapq
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # experiments/validation: the transformers captures' modules
from capture_common import block_hashes, token_ids  # noqa: E402
from capture_workloads import (  # noqa: E402
    NAMED_WORKLOADS,
    Req,
    azure_workload,
    microbench_mixed_plan,
    microbench_plan,
)

ENGINE_NAME = "vllm_v1"
SEED = 1234  # capture_client.Session.seed: the same prompt token ids as the HF captures
AZURE = HERE.parent / "azure_conv_window.json"


WORKLOADS: dict[str, Callable[[], tuple[list[Req], dict]]] = {
    **NAMED_WORKLOADS,
    "azure_conv_sample": lambda: azure_workload(AZURE),
}


def microbench_distinct_plan() -> list[tuple[dict, list[Req]]]:
    """vLLM cost micro-runs the transformers plans leave out (issue 28). `decode_distinct`:
    decode batches of b requests whose contexts are all different (no shared prefix, unlike
    `microbench_plan`'s, whose shared context the GPU's L2 serves), sent at once, 32 tokens each.
    `eager_alone`: single small prompts sent 0.4 s apart, so each prefill is an eager step that
    has the engine to itself (its host launch and interval are measured). `eager_joining`:
    prompts joining 16 running decodes one at a time (the serving case of an eager step after a
    graph step)."""
    plan: list[tuple[dict, list[Req]]] = []
    for b, c in ((8, 512), (8, 2048), (32, 512), (32, 2048), (64, 512), (64, 2048), (128, 1024)):
        reqs = [Req(f"mb-dd-b{b}-c{c}-{i:03d}", c, 32, send_s=0.0) for i in range(b)]
        tag = {"bench": "decode_distinct", "batch_size": b, "cfg_prompt_tokens": c}
        plan.append(({**tag, "context_tokens": c}, reqs))
    sizes = (16, 64, 256, 512, 1024, 128)
    alone = [Req(f"mb-ea-{i:03d}", sizes[i % 6], 3, send_s=0.4 * i) for i in range(24)]
    tag = {"bench": "eager_alone", "batch_size": 1, "cfg_prompt_tokens": 0, "context_tokens": 0}
    plan.append((tag, alone))
    running = [Req(f"mb-ej-run-{i:03d}", 512, 200, send_s=0.0) for i in range(16)]
    joining = [Req(f"mb-ej-{i:03d}", sizes[i % 6], 4, send_s=0.5 + 0.15 * i) for i in range(12)]
    tag = {
        "bench": "eager_joining",
        "batch_size": 16,
        "cfg_prompt_tokens": 0,
        "context_tokens": 512,
    }
    plan.append((tag, running + joining))
    return plan


MICRO_PLANS = {
    "microbench": microbench_plan,
    "microbench_mixed": microbench_mixed_plan,
    "microbench_distinct": microbench_distinct_plan,
}


def workload(name: str) -> tuple[list[Req], dict]:
    if name not in WORKLOADS:
        raise SystemExit(f"--workloads: no workload {name!r} (known: {', '.join(WORKLOADS)})")
    return WORKLOADS[name]()


@dataclass
class Record:
    """What the client saw of one request."""

    planned_s: float | None = None
    sent_s: float | None = None
    prompt: list[int] = field(default_factory=list)
    token_s: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    error: str | None = None
    num_cached_tokens: int | None = None
    engine: dict[str, float] = field(default_factory=dict)  # RequestStateStats timestamps


class OpenLoop:
    """Open-loop sends of a request list: roots at their `send_s`, a child its think time after
    its parent's last token, with the parent's prompt + reply + its own new tokens as prompt; a
    `prefix_of` request shares that many leading tokens with the named one (capture_client)."""

    def __init__(self, reqs: list[Req], seed: int = SEED) -> None:
        self.reqs = {r.request_id: r for r in reqs}
        self.order = {r.request_id: i for i, r in enumerate(reqs)}
        self.children: dict[str, list[str]] = defaultdict(list)
        self.heap: list[tuple[float, int, str]] = []
        self.seed = seed
        self.records = {r.request_id: Record() for r in reqs}
        for r in reqs:
            if r.parent_id is None:
                heapq.heappush(
                    self.heap, (float(r.send_s or 0.0), self.order[r.request_id], r.request_id)
                )
            else:
                self.children[r.parent_id].append(r.request_id)

    def next_due_s(self) -> float | None:
        """Planned send time (s from the run's start) of the next request, if one is known."""
        return self.heap[0][0] if self.heap else None

    def due(self, now_s: float) -> list[tuple[Req, list[int]]]:
        """Pop every request due by `now_s` with its prompt token ids."""
        out = []
        while self.heap and self.heap[0][0] <= now_s:
            planned, _, rid = heapq.heappop(self.heap)
            r, rec = self.reqs[rid], self.records[rid]
            own = token_ids(self.seed, rid, r.prompt_tokens, False)
            if r.parent_id is not None:
                par = self.records[r.parent_id]
                ids = par.prompt + par.output_ids + own
            elif r.prefix_of is not None:
                ids = self.records[r.prefix_of].prompt[: r.prefix_tokens] + own[r.prefix_tokens :]
            else:
                ids = own
            rec.planned_s, rec.prompt = planned, ids
            out.append((r, ids))
        return out

    def sent(self, rid: str, t: float) -> None:
        self.records[rid].sent_s = t

    def tokens(self, rid: str, t: float, new_ids: list[int]) -> None:
        """A streamed output (DELTA): each new token gets the time it reached the client."""
        rec = self.records[rid]
        rec.output_ids += list(new_ids)
        rec.token_s += [t] * len(new_ids)

    def finish(self, rid: str, t0: float, error: str | None = None) -> None:
        """Mark `rid` done; its children become due their think time after its last token."""
        rec = self.records[rid]
        rec.finished, rec.error = error is None, error
        if error is not None:  # its later turns are never sent
            for cid in self.children.get(rid, []):
                self.finish(cid, t0, error=f"parent {rid} failed")
            return
        end = rec.token_s[-1] if rec.token_s else rec.sent_s
        for cid in self.children.get(rid, []):
            due = (end or t0) - t0 + self.reqs[cid].think_s
            heapq.heappush(self.heap, (due, self.order[cid], cid))

    def done(self) -> bool:
        return all(r.finished or r.error is not None for r in self.records.values())

    def rows(self, t0: float, block_size: int, preemptions: dict[str, int]) -> list[dict]:
        """requests.parquet rows (capture_common.REQUEST_TYPES plus the engine's timestamps)."""

        def us(t: float | None) -> int | None:
            return None if t is None else int(round((t - t0) * 1e6))

        rows = []
        for rid, r in self.reqs.items():
            rec = self.records[rid]
            if rec.finished:
                status = "finished"
            elif rec.error is not None:
                status = "failed"
            else:
                status = "missing"
            toks = rec.token_s if rec.finished else []
            rows.append(
                dict(
                    request_id=rid,
                    session_id=r.session_id,
                    parent_id=r.parent_id,
                    turn=r.turn,
                    think_time_us=int(round(r.think_s * 1e6)),
                    planned_send_us=None
                    if rec.planned_s is None
                    else int(round(rec.planned_s * 1e6)),
                    send_us=us(rec.sent_s),
                    prompt_tokens=len(rec.prompt) if rec.prompt else r.prompt_tokens,
                    max_new_tokens=r.max_new_tokens,
                    output_tokens=len(rec.token_s),
                    first_token_us=us(toks[0]) if toks else None,
                    end_us=us(toks[-1]) if toks else None,
                    token_us=[us(t) for t in toks],
                    status=status,
                    error=rec.error,
                    # RequestStateStats leaves a timestamp it never set at 0.0
                    engine_created_us=us(rec.engine.get("queued_ts") or None),
                    engine_scheduled_us=us(rec.engine.get("scheduled_ts") or None),
                    engine_first_token_us=us(rec.engine.get("first_token_ts") or None),
                    num_soft_resets=preemptions.get(rid, 0),
                    num_cpu_swaps=0,  # vLLM v1 preempts by recompute only
                    num_restores=0,
                    prefix_hit_tokens=rec.num_cached_tokens,
                    block_hash_ids=block_hashes(rec.prompt, block_size, rid)
                    if rec.prompt
                    else None,
                )
            )
        return rows


ENGINE_REQUEST_TYPES = {
    "engine_scheduled_us": "int64",
    "engine_first_token_us": "int64",
}


def external_id(internal: str) -> str:
    """vLLM appends '-' and 8 random characters to a request id inside the engine."""
    head, _, tail = internal.rpartition("-")
    return head if head and len(tail) == 8 else internal


def step_summary(out: Any, prompt_len: Callable[[str], int]) -> dict[str, int]:
    """Token counts of one SchedulerOutput: a token is a decode when its request is scheduled for
    exactly one token past its prompt (num_computed_tokens before the step >= the prompt); every
    other scheduled token (prompt chunks, recompute after preemption) is a prefill token."""
    nst: dict[str, int] = out.num_scheduled_tokens
    prefill = decode = num_decode = kv_read = max_seqlen = 0
    hit = sum(int(nr.num_computed_tokens) for nr in out.scheduled_new_reqs)
    cached = out.scheduled_cached_reqs
    resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
    before = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    before |= {nr.req_id: int(nr.num_computed_tokens) for nr in out.scheduled_new_reqs}
    for rid, n in nst.items():
        done = before.get(rid, 0)
        if rid not in resumed and n == 1 and done >= prompt_len(rid):
            decode += 1
            num_decode += 1
        else:
            prefill += n
        kv_read += done + n  # the attention reads the KV of every token up to its last query
        max_seqlen = max(max_seqlen, done + n)
    return {
        "num_requests": len(nst),
        "num_new_requests": len(out.scheduled_new_reqs) + len(resumed),
        "num_decode_requests": num_decode,
        "num_prefill_requests": len(nst) - num_decode,
        "prefill_tokens": prefill,
        "decode_tokens": decode,
        "q_tokens": int(out.total_num_scheduled_tokens),
        "kv_read_tokens": kv_read,
        "max_seqlen_k": max_seqlen,
        "prefix_hit_tokens": hit,
        "num_preempted": len(getattr(out, "preempted_req_ids", None) or ()),
    }


CORE_STEP_TYPES = {
    "schedule_start_us": "int64",
    "num_preempted": "int32",
    "num_running": "int32",
    "kv_blocks_free": "int32",
}


def step_rows(core: list[dict], t0: float, t1: float) -> list[dict]:
    """steps.parquet rows from the engine core's step log, the steps scheduled in [t0, t1].

    A step's GPU work starts when it is scheduled and the step before it has produced its output
    (under async scheduling step n is scheduled while step n-1 runs), and ends when its own output
    is ready: start = max(its schedule end, the previous step's update start), end = its update
    start. The raw times are kept: schedule_start_us, prepare_end_us (schedule end),
    update_start_us, and the update's end."""
    steps = sorted(
        (s for s in core if s.get("kind") == "step" and t0 <= s["schedule_start"] <= t1),
        key=lambda s: s["schedule_start"],
    )

    def us(t: float) -> int:
        return int(round((t - t0) * 1e6))

    rows, prev_ready = [], None
    for i, s in enumerate(steps):
        start = s["schedule_end"] if prev_ready is None else max(s["schedule_end"], prev_ready)
        end = max(s["update_start"], start)
        prev_ready = s["update_start"]
        rows.append(
            {
                "step": i,
                "start_us": us(start),
                "end_us": us(end),
                # no CUDA events: the step's interval on the engine core's clock stands in for
                # its device time (the GPU runs steps back to back while the engine is busy)
                "gpu_us": us(end) - us(start),
                "graph_captures": 0,  # vLLM captures its graphs at start-up, never while serving
                "schedule_start_us": us(s["schedule_start"]),
                "prepare_end_us": us(s["schedule_end"]),
                "update_start_us": us(s["update_start"]),
                "update_end_us": us(s["update_end"]),
                **{k: s[k] for k in STEP_COUNTS if k in s},
                "kv_blocks_in_use": s.get("kv_blocks_in_use"),
                "kv_blocks_free": s.get("kv_blocks_free"),
                "num_waiting": s.get("num_waiting"),
                "num_running": s.get("num_running"),
                "num_active": s.get("num_running"),
            }
        )
    return rows


STEP_COUNTS = (
    "kv_read_tokens",
    "max_seqlen_k",
    "num_requests",
    "num_new_requests",
    "num_decode_requests",
    "num_prefill_requests",
    "prefill_tokens",
    "decode_tokens",
    "q_tokens",
    "prefix_hit_tokens",
    "num_preempted",
)


def preemptions(core: list[dict], t0: float, t1: float) -> dict[str, int]:
    """Recompute preemptions per (external) request id in [t0, t1]."""
    out: dict[str, int] = defaultdict(int)
    for e in core:
        if e.get("kind") == "preempt" and t0 <= e["t"] <= t1:
            out[external_id(e["request_id"])] += 1
    return dict(out)


# Scheduler limits and engine settings engine.json pins (the keys validate's reader knows).
SETTING_KEYS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "block_size",
    "num_gpu_blocks",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "async_scheduling",
    "scheduling_policy",
    "watermark",
    "scheduler_reserve_full_isl",
    "long_prefill_token_threshold",
    "max_model_len",
    "compilation_mode",
    "cudagraph_mode",
    "enforce_eager",
    "gpu_memory_utilization",
    "kv_offloading_size",
    "kv_offloading_backend",
    "prefix_caching_hash_algo",
    "dtype",
    "model_runner",
)


def engine_json(resolved: dict[str, Any], model: dict[str, int], extra: dict[str, Any]) -> dict:
    """engine.json: the engine's name, every resolved setting of SETTING_KEYS (a missing one is
    an error: nothing is left to a default), the model geometry, then the run's records."""
    missing = [k for k in SETTING_KEYS if k not in resolved]
    if missing:
        raise ValueError(f"engine.json: resolved settings lack {missing}")
    heads = model["num_attention_heads"]
    head_dim = model["hidden_size"] // heads
    kv_bytes = 2 * model["num_hidden_layers"] * model["num_key_value_heads"] * head_dim * 2
    geometry = {
        k: model[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
        )
    }
    return {
        "engine": ENGINE_NAME,
        **{k: resolved[k] for k in SETTING_KEYS},
        "model": geometry,
        "kv_bytes_per_token": kv_bytes,  # bf16 K and V over all layers
        **{k: v for k, v in resolved.items() if k not in SETTING_KEYS},
        **extra,
    }
