"""Prefix blocks with a CPU tier: evicted chain tails are copied to the CPU store over PCIe and
copied back when a request continues into them (used when `kv.offload_enabled`).

Along a chain the tiers run GPU..., then CPU..., because tails leave first and a reload brings back
the run that continues the GPU prefix. An evicted GPU tail goes to the CPU store when it has room
(making room by dropping the oldest CPU tails, if `kv.cpu_store_evicts_lru`), otherwise it is
dropped with its CPU descendants, which nothing could reach any more. A block in flight either way
is neither evictable nor reusable: a request that needs it waits (BLOCKED) until it lands. A block's
restore cost is the cheaper of reloading and recomputing it.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator

import simpy

from cachepilot_sim.components.kv_manager import Admit, Tier
from cachepilot_sim.components.prefix_cache import HashBlock, PrefixKvManager
from cachepilot_sim.components.request import KvSource, Request
from cachepilot_sim.policies import CacheEntry


class OffloadingPrefixKvManager(PrefixKvManager):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 (PrefixKvManager's)
        super().__init__(*args, **kwargs)
        self.reload_block_us = float(self.link.duration_us("h2d", self.hash_bytes))
        self.cpu_tails: list[tuple[int, int, int]] = []  # (last used, entry id, hash), lazy
        self.held: dict[int, list[HashBlock]] = {}  # req id -> blocks pinned by its reload
        self.orphans = 0  # blocks in flight out whose chain was dropped meanwhile

    # -- admission: continue into the CPU tier ------------------------------------------------
    def _admit_from_cpu(self, req: Request, ids: list[int], hits: int) -> Admit | None:
        end = hits
        while end < len(ids) and self._tier(ids[end]) == Tier.CPU:
            end += 1
        if end < len(ids) and self._tier(ids[end]) in (Tier.FLIGHT_OUT, Tier.FLIGHT_IN):
            return Admit.BLOCKED  # wait for the copy to land, then look again
        if end == hits:
            return None
        chain = [self.blocks[h] for h in ids[:hits]]
        for b in chain:
            self._pin(b)
        back = [self.blocks[h] for h in ids[hits:end]]
        num_bytes = len(back) * self.hash_bytes
        if not self._make_room(num_bytes, exclude=None):
            for b in chain:
                self._unpin(b)
            return Admit.BLOCKED
        self.pool.start_reload(num_bytes)
        self.cpu_used_bytes -= num_bytes
        for b in back:
            b.tier = Tier.FLIGHT_IN
            b.refcount += 1
            self.num_gpu_blocks += 1
            if b.parent is not None:
                b.parent.num_children += 1
        self.held.setdefault(req.req_id, []).extend(chain + back)
        self.recorder.emit(int(self.env.now), "pcie", "reload_start", req.session_id, req.req_id,
                           0, len(back), num_bytes, "flight")
        self.env.process(self._reload_blocks(req, back, num_bytes))
        return Admit.WAIT

    def _tier(self, hash_id: int) -> Tier | None:
        b = self.blocks.get(hash_id)
        return None if b is None else b.tier

    def _reload_blocks(self, req: Request, back: list[HashBlock],
                num_bytes: int) -> Generator[simpy.Event, object, None]:
        """Process: copy the blocks back; the request re-queues and then finds them on the GPU."""
        duration = yield from self.link.transfer("h2d", num_bytes)
        self.pool.finish_reload(num_bytes)
        now = int(self.env.now)
        for b in back:
            b.tier = Tier.GPU
            b.entry.last_used_us = now
        st = self.stats
        st.reloads += 1
        st.reload_blocks += len(back)
        st.realized_reload_us += duration
        req.kv_source = KvSource.RELOAD
        req.reload_us_paid += duration
        self.recorder.emit(now, "pcie", "reload_done", req.session_id, req.req_id, 0, len(back),
                           num_bytes, "gpu", value=duration)
        self.on_ready(req)

    def _release_held(self, req: Request) -> None:
        for b in self.held.pop(req.req_id, []):
            self._unpin(b)

    # -- eviction: offload when the CPU store can take the block -------------------------------
    def _prepare(self, b: HashBlock, now: int) -> CacheEntry:
        e = super()._prepare(b, now)
        if self._can_offload(self.hash_bytes) and self.reload_block_us < e.recompute_us:
            e.restore_us = self.reload_block_us
        return e

    def _dispose(self, b: HashBlock, now: int, allow_offload: bool) -> None:
        """Offload when allowed and the store has room; else drop it and its CPU descendants.

        Decode growth needs bytes now (allow_offload False): an offload frees them only later.
        """
        e = b.entry
        self.stats.expected_evict_cost_us += (self.estimator.resume_probability(e, now)
                                              * e.restore_us)
        if allow_offload and self._cpu_store_room(self.hash_bytes):
            self._offload_start(b, now)
        else:
            self._drop_chain(b, now)

    def _cpu_store_room(self, num_bytes: int) -> bool:
        """Room in the CPU store, dropping its least recently used tails if allowed."""
        while self.cpu_used_bytes + num_bytes > self.cpu_capacity_bytes and self.cpu_store_lru:
            tail = self._oldest_cpu_tail()
            if tail is None:
                break
            self.stats.cpu_drops += 1
            self._forget(tail)
        return self.cpu_used_bytes + num_bytes <= self.cpu_capacity_bytes

    def _oldest_cpu_tail(self) -> HashBlock | None:
        while self.cpu_tails:
            _, _, h = heapq.heappop(self.cpu_tails)
            b = self.blocks.get(h)
            if b is not None and b.tier == Tier.CPU and not b.children:
                return b
        return None

    def _push_cpu_tail(self, b: HashBlock) -> None:
        if b.tier == Tier.CPU and not b.children:
            heapq.heappush(self.cpu_tails, (b.entry.last_used_us, b.entry.entry_id, b.hash_id))

    def _offload_start(self, b: HashBlock, now: int) -> None:
        e = b.entry
        st = self.stats
        st.evictions_offload += 1
        st.evicted_bytes_offload += self.hash_bytes
        self.recorder.emit(now, "kv", "evict_offload", e.session_id, -1, 0, 1, self.hash_bytes,
                           "flight", float(self.policy.key(e, now)[0]))
        self.pool.start_offload(self.hash_bytes)
        self.pending_free_bytes += self.hash_bytes
        self.cpu_used_bytes += self.hash_bytes
        st.cpu_peak_bytes = max(st.cpu_peak_bytes, self.cpu_used_bytes)
        b.tier = Tier.FLIGHT_OUT
        self.num_gpu_blocks -= 1
        if b.parent is not None:
            b.parent.num_children -= 1  # no longer on the GPU: the parent may be a tail now
        self.env.process(self._offload_block(b))

    def _offload_block(self, b: HashBlock) -> Generator[simpy.Event, object, None]:
        """Process: copy one block out; its GPU bytes are free when the copy lands."""
        duration = yield from self.link.transfer("d2h", self.hash_bytes)
        self.pool.finish_offload(self.hash_bytes)
        self.pending_free_bytes -= self.hash_bytes
        if self.blocks.get(b.hash_id) is b:
            b.tier = Tier.CPU
            self._push_cpu_tail(b)
        else:  # its chain was dropped while it was in flight
            self.cpu_used_bytes -= self.hash_bytes
            self.orphans -= 1
        self.recorder.emit(int(self.env.now), "pcie", "offload_done", b.entry.session_id, -1, 0,
                           1, self.hash_bytes, "cpu", value=duration)
        self.on_memory()

    def _drop_chain(self, b: HashBlock, now: int) -> None:
        """Drop a GPU tail and everything cached below it (CPU or on its way there)."""
        self.stats.evictions_drop += 1
        self.stats.evicted_bytes_drop += self.hash_bytes
        self.recorder.emit(now, "kv", "evict_drop", b.entry.session_id, -1, 0, 1,
                           self.hash_bytes, "none", float(self.policy.key(b.entry, now)[0]))
        self._forget(b)

    def _forget(self, b: HashBlock) -> None:
        """Remove b and its descendants from the cache, freeing what each tier holds."""
        for child in list(b.children.values()):
            self._forget(child)
        assert b.refcount == 0 and b.tier != Tier.FLIGHT_IN
        if b.tier == Tier.GPU:
            self._remove(b)
            return
        del self.blocks[b.hash_id]
        if b.tier == Tier.CPU:
            self.cpu_used_bytes -= self.hash_bytes
        else:  # FLIGHT_OUT: the landing copy frees its bytes
            self.orphans += 1
        p = b.parent
        if p is not None:
            del p.children[b.hash_id]
            self._push_cpu_tail(p)
