"""Open-loop client of the engine and the ground-truth writer (Parquet via pyarrow on the device).

`Session.capture` runs one request list once per run id on an engine whose state (scheduler,
cache, prefix cache, offload pool) is reset before each run, and writes one ground-truth folder per
run, re-packing `$OUT/gt.tar.gz` so a timed-out call still returns every finished run."""

from __future__ import annotations

import heapq
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capture_common import (  # noqa: F401 (re-exported for capture.py)
    REQUEST_TYPES,
    STEP_TYPES,
    block_hashes,
    pack,
    summarize,
    token_ids,
    write_table,
)
from capture_workloads import Req
from hf_engine import EngineSpec, clear_prefix_cache, engine_config
from hf_instrument import Recorder, resolve_gpu_times

perf_counter = time.perf_counter


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
