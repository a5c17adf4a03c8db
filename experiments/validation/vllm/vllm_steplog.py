"""Per-step times and token counts from inside vLLM's engine core process (no vLLM code changed).

`install()` wraps three methods of `vllm.v1.core.sched.scheduler.Scheduler` (0.26): `schedule`
(its start and end, and the step's token counts), `update_from_output` (its start: the step's
model output is ready; its end) and `_preempt_request` (each recompute preemption). Each finished
step is one JSON line appended to the file named by $CP_VLLM_STEP_LOG, written by the engine core
process itself. It must run in that process: capture_vllm.py calls it at import, so a forked
engine core inherits the wrapped class and a spawned one, which re-imports the main module,
wraps it again.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "CP_VLLM_STEP_LOG"
_installed = False


def _writer() -> Any:
    path = os.environ.get(ENV)
    return None if not path else open(path, "a", buffering=1)  # noqa: SIM115 (lives with the process)


def install(scheduler_cls: Any = None) -> bool:
    """Wrap the scheduler's methods once per process; False when $CP_VLLM_STEP_LOG is unset."""
    global _installed
    if _installed or not os.environ.get(ENV):
        return _installed
    if scheduler_cls is None:
        from vllm.v1.core.sched.scheduler import Scheduler as scheduler_cls  # noqa: N813
    from vllm_gt import step_summary

    schedule = scheduler_cls.schedule
    update = scheduler_cls.update_from_output
    preempt = scheduler_cls._preempt_request
    state: dict[str, Any] = {"out": None, "pending": {}}

    def emit(row: dict) -> None:
        if state["out"] is None:
            state["out"] = _writer()
        state["out"].write(json.dumps(row) + "\n")

    def wrapped_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        out = schedule(self, *args, **kwargs)
        t1 = time.monotonic()
        if out.total_num_scheduled_tokens > 0:

            def prompt_len(rid: str) -> int:
                req = self.requests.get(rid)
                return int(req.num_prompt_tokens) if req is not None else 1 << 30

            row = {"kind": "step", "schedule_start": t0, "schedule_end": t1}
            row.update(step_summary(out, prompt_len))
            pool = self.kv_cache_manager.block_pool
            free = int(pool.get_num_free_blocks())
            row.update(
                num_waiting=len(self.waiting) + len(getattr(self, "skipped_waiting", ()) or ()),
                num_running=len(self.running),
                kv_blocks_free=free,
                kv_blocks_in_use=int(pool.num_gpu_blocks) - free,
            )
            state["pending"][id(out)] = row
        return out

    def wrapped_update(self: Any, scheduler_output: Any, model_output: Any) -> Any:
        t2 = time.monotonic()
        res = update(self, scheduler_output, model_output)
        row = state["pending"].pop(id(scheduler_output), None)
        if row is not None:
            row.update(update_start=t2, update_end=time.monotonic())
            emit(row)
        return res

    def wrapped_preempt(self: Any, request: Any, timestamp: float) -> Any:
        emit({"kind": "preempt", "t": time.monotonic(), "request_id": request.request_id})
        return preempt(self, request, timestamp)

    scheduler_cls.schedule = wrapped_schedule
    scheduler_cls.update_from_output = wrapped_update
    scheduler_cls._preempt_request = wrapped_preempt
    _installed = True
    return True


def read(path: str | os.PathLike[str]) -> list[dict]:
    """Every complete line of the step log (a line being written is skipped)."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    rows.append(json.loads(line))
    except FileNotFoundError:
        pass
    return rows
