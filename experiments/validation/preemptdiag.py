#!/usr/bin/env python3
"""Device diagnosis (fidelity issue): who runs out of KV blocks in transformers CB, and who goes.

`patch()` logs, for every step the engine composes, each block allocation the scheduler tries
(request, status, tokens asked for, its cache length and blocks before, blocks needed, success,
free blocks), the starved requests and the victims `OffloadingManager.offload_requests` picks
(with free blocks before and after), and each finished request. `capture.py --phase preemptdiag`
runs `pressure_preempt` with it and `dump`s the log to $OUT/preemptdiag.jsonl; the simulator's
own choices are compared with it offline (`diagnose.py preempt-log`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

LOG: list[dict] = []
T0 = time.perf_counter()


def _t() -> int:
    """Microseconds since the recorder's origin (the clock of requests and steps tables)."""
    import hf_instrument

    rec = hf_instrument.REC
    return int((time.perf_counter() - (rec.t0 if rec is not None else T0)) * 1e6)


def patch() -> None:
    from transformers.generation.continuous_batching import continuous_api as api
    from transformers.generation.continuous_batching import offloading_manager as om
    from transformers.generation.continuous_batching import scheduler as sch

    o_alloc = sch.Scheduler._allocate_blocks_if_needed

    def alloc(self, state, len_next_tokens):
        before = state.allocated_blocks
        cur = state.current_len()
        free = self.cache.get_num_free_blocks()
        ok = o_alloc(self, state, len_next_tokens)
        if state.allocated_blocks != before or not ok:
            LOG.append(
                dict(
                    ev="alloc",
                    t=_t(),
                    rid=state.request_id,
                    status=state.status.name,
                    active=state.request_id in self.active_requests,
                    n=len_next_tokens,
                    cur=cur,
                    before=before,
                    after=state.allocated_blocks,
                    ok=ok,
                    free=free,
                )
            )
        return ok

    sch.Scheduler._allocate_blocks_if_needed = alloc

    o_offload = om.OffloadingManager.offload_requests

    def offload(self):
        sc = self.scheduler
        starved = [
            (s.request_id, n, self.cache.blocks_in_use(s.request_id))
            for s, n in sc.starved_requests
        ]
        free = self.cache.get_num_free_blocks()
        active = list(sc.active_requests)
        k = o_offload(self)
        LOG.append(
            dict(
                ev="offload",
                t=_t(),
                starved=starved,
                free_before=free,
                free_after=self.cache.get_num_free_blocks(),
                active=active,
                gone=[r for r in active if r not in sc.active_requests],
                evicted=k,
            )
        )
        return k

    om.OffloadingManager.offload_requests = offload

    o_prep = api.ContinuousBatchProcessor.prepare_next_batch

    def prep(self):
        ok = o_prep(self)
        sc = self.scheduler
        LOG.append(
            dict(
                ev="step",
                t=_t(),
                ok=ok,
                free=self.cache.get_num_free_blocks(),
                active={r: s.allocated_blocks for r, s in sc.active_requests.items()},
                waiting=list(sc.waiting_requests_order),
                block_new=sc.block_new_requests,
            )
        )
        return ok

    api.ContinuousBatchProcessor.prepare_next_batch = prep


def dump(path: Path) -> None:
    """Write the log gathered since the last dump as JSON lines and start a new one."""
    path.write_text("\n".join(json.dumps(e) for e in LOG))
    LOG.clear()
