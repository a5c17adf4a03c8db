#!/usr/bin/env python3
"""Device diagnosis (fidelity issue): why transformers CB loses prefix hits on multiturn.

`patch()` logs every hash registration, lookup, eviction and batch update of the engine's own
block manager; `capture.py --phase hashdiag` runs the workloads and `dump`s the log to
$OUT/hashdiag.jsonl (multiturn) and $OUT/hashdiag_pressure.jsonl (pressure_preempt)."""

from __future__ import annotations

import json
import time
from pathlib import Path

LOG: list[dict] = []
T0 = time.perf_counter()


def _t() -> int:
    return int((time.perf_counter() - T0) * 1e6)


def patch() -> None:
    from transformers.generation.continuous_batching import cache as cmod
    from transformers.generation.continuous_batching import cache_manager as bm
    from transformers.generation.continuous_batching import continuous_api as api

    registered: dict[int, tuple[str, int]] = {}

    o_mark = bm.BlockManager.mark_shareable_blocks_as_complete

    def mark(self, num_complete_blocks, allocated_blocks, prompt_ids):
        before = {b: self._id_to_block[b].hash for b in allocated_blocks if b in self._id_to_block}
        o_mark(self, num_complete_blocks, allocated_blocks, prompt_ids)
        new = []
        for i, b in enumerate(allocated_blocks):
            blk = self._id_to_block.get(b)
            if blk is not None and blk.hash is not None and before.get(b) is None:
                new.append(i)
                registered.setdefault(blk.hash, (CUR[0], i))
        LOG.append(
            dict(
                ev="hash",
                t=_t(),
                rid=CUR[0],
                n=num_complete_blocks,
                nblocks=len(allocated_blocks),
                new_idx=new,
                ntok=len(prompt_ids),
            )
        )

    bm.BlockManager.mark_shareable_blocks_as_complete = mark

    CUR = [""]
    o_cmark = cmod.PagedAttentionCache.mark_shareable_blocks_as_complete

    def cmark(self, state, num_complete_blocks):
        CUR[0] = state.request_id
        LOG.append(
            dict(
                ev="mark",
                t=_t(),
                rid=state.request_id,
                n=num_complete_blocks,
                status=state.status.name,
                pos=state.position_offset,
                gen=len(state.generated_tokens),
            )
        )
        return o_cmark(self, state, num_complete_blocks)

    cmod.PagedAttentionCache.mark_shareable_blocks_as_complete = cmark

    o_search = cmod.PagedAttentionCache.search_prefix_match

    def search(self, request_id, prompt_ids):
        r = o_search(self, request_id, prompt_ids)
        bs = self.block_size
        h, chain = None, []
        for b in range(len(prompt_ids) // bs):
            h = self._block_manager.compute_hash(h, prompt_ids[b * bs : (b + 1) * bs], group_id=0)
            chain.append(registered.get(h))
        LOG.append(
            dict(
                ev="search",
                t=_t(),
                rid=request_id,
                ntok=len(prompt_ids),
                hit=r // bs,
                ever=[None if c is None else list(c) for c in chain],
            )
        )
        return r

    cmod.PagedAttentionCache.search_prefix_match = search

    o_enough = bm.BlockManager.has_enough_free_blocks

    def enough(self, n_blocks):
        k = len(self._init_block_ids)
        r = o_enough(self, n_blocks)
        if len(self._init_block_ids) < k:
            LOG.append(dict(ev="evict", t=_t(), n=k - len(self._init_block_ids), need=n_blocks))
        return r

    bm.BlockManager.has_enough_free_blocks = enough

    o_update = api.ContinuousBatchProcessor.update_batch

    def update(self):
        ios = self.inputs_and_outputs
        orig = ios.prepare_batch_update
        snap: list = []

        def pbu():
            r = orig()
            snap.extend(
                (
                    fs.state.request_id,
                    fs.has_new_token,
                    fs.complete_blocks,
                    fs.state.status.name,
                    fs.query_length,
                )
                for fs in r[0]
            )
            return r

        ios.prepare_batch_update = pbu
        try:
            o_update(self)
        finally:
            del ios.prepare_batch_update
        LOG.append(dict(ev="update", t=_t(), reqs=snap))

    api.ContinuousBatchProcessor.update_batch = update


def dump(path: Path) -> None:
    """Write the log gathered since the last dump as JSON lines and start a new one."""
    path.write_text("\n".join(json.dumps(e) for e in LOG))
    LOG.clear()
