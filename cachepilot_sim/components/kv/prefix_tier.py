"""The prefix manager's CPU tier: evicted chain tails go to the CPU store over PCIe and come back
when a request continues into them (used when `kv.offload_enabled`).

Along a chain the tiers run GPU..., then CPU..., because tails leave first and a reload brings back
the run that continues the GPU prefix. An evicted GPU tail goes to the CPU store when it has room
(making room by dropping the oldest CPU tails, if `kv.cpu_store_evicts_lru`), otherwise it is
dropped with its CPU descendants, which nothing could reach any more. A block in flight either way
is neither evictable nor reusable: a request that needs it waits (BLOCKED) until it lands.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import simpy

from cachepilot_sim.components.kv.cpu_store import CpuStore
from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.protocol import Admit, KvDeps, KvStats, Tier
from cachepilot_sim.components.kv.transfers import Transfers
from cachepilot_sim.components.request import KvSource, Request


class PrefixCpuTier:
    """Reloads of CPU continuations, offloads of evicted tails, drops of whole chains."""

    def __init__(
        self,
        deps: KvDeps,
        tree: PrefixTree,
        cpu: CpuStore,
        transfers: Transfers,
        stats: KvStats,
        block_bytes: tuple[int, int],
        make_room: Callable[[int], bool],
    ) -> None:
        """`block_bytes`: a hash block's (GPU, CPU store) bytes; `make_room(bytes)`: the
        manager's room rule, True when the bytes are free now."""
        self.env, self.pool, self.events = deps.env, deps.pool, deps.events
        self.policy, self.estimator = deps.policy, deps.estimator
        self.queue, self.wake = deps.queue, deps.wake
        self.tree, self.cpu, self.transfers, self.stats = tree, cpu, transfers, stats
        self.hash_bytes, self.cpu_hash_bytes = block_bytes
        self.make_room = make_room
        self.held: dict[int, list[HashBlock]] = {}  # req id -> blocks pinned by its reload
        self.orphans = 0  # blocks in flight out whose chain was dropped meanwhile

    def has_room(self) -> bool:
        """Room in the CPU store for one more block, dropping its oldest tails if it may."""
        return self.cpu.can_take(self.cpu_hash_bytes) and self.cpu.make_room(
            self.cpu_hash_bytes, self._drop_cpu_tail
        )

    def dispose(
        self, cut: list[HashBlock], now: int, may_offload: bool, offloaded: list[HashBlock]
    ) -> None:
        """Evict the cut's tails in order: offload each (appending it to `offloaded`) when
        `may_offload` and the store has room, else drop it with its CPU descendants. Decode growth
        needs bytes now (the manager passes may_offload False): an offload frees them later.
        One trace row, expected-cost and byte count per block."""
        st, estimator, key = self.stats, self.estimator, self.policy.key
        evictable, num_bytes = self.tree.evictable, self.hash_bytes
        for b in cut:
            evictable.pop(b.hash_id, None)
            e = b.entry
            expected = estimator.resume_probability(e, now) * e.restore_us
            st.expected_evict_cost_us += expected
            score = float(key(e, now)[0])
            offload = may_offload and self.has_room()
            self.events.evict(now, e, 1, num_bytes, offload, score, expected)
            if offload:
                st.evictions_offload += 1
                st.evicted_bytes_offload += num_bytes
                self.offload(b)
                offloaded.append(b)
            else:
                st.evictions_drop += 1
                st.evicted_bytes_drop += num_bytes
                self.forget(b)

    def offload(self, b: HashBlock) -> None:
        """An evicted idle tail leaves the GPU for the store: its GPU bytes are in flight and its
        store bytes reserved now; its copy starts with the others of its eviction call
        (`start_copies`), and its GPU bytes are free when the copy lands."""
        self.transfers.start_offload(self.hash_bytes)
        self.cpu.reserve(self.cpu_hash_bytes)
        self.tree.leave_gpu(b)

    def start_copies(self, blocks: list[HashBlock]) -> None:
        """Start the copies of the tails `offload` took out, in that order (call it before any
        other event is scheduled: `Transfers.offload_each_then`)."""
        self.transfers.offload_each_then(
            self.hash_bytes, self.cpu_hash_bytes, blocks, self._offloaded
        )

    def continuation(self, req: Request, ids: list[int], hits: int) -> Admit | None:
        """Reload the CPU-resident continuation of the hits (WAIT), or wait for a block in
        flight (BLOCKED); None when the chain does not continue into the CPU tier."""
        tree = self.tree
        end = hits
        while end < len(ids) and tree.tier(ids[end]) == Tier.CPU:
            end += 1
        if end < len(ids) and tree.tier(ids[end]) in (Tier.FLIGHT_OUT, Tier.FLIGHT_IN):
            return Admit.BLOCKED  # wait for the copy to land, then look again
        if end == hits:
            return None
        chain = [tree.blocks[h] for h in ids[:hits]]
        for b in chain:
            tree.pin(b)
        back = [tree.blocks[h] for h in ids[hits:end]]
        num_bytes = len(back) * self.hash_bytes
        if not self.make_room(num_bytes):
            for b in chain:
                tree.unpin(b)
            return Admit.BLOCKED
        self.pool.start_reload(num_bytes)
        self.cpu.release(len(back) * self.cpu_hash_bytes)
        for b in back:
            tree.come_back(b)
        self.held.setdefault(req.req_id, []).extend(chain + back)
        self.events.reload_start(int(self.env.now), req, len(back), num_bytes)
        self.env.process(self._reload_blocks(req, back, num_bytes))
        return Admit.WAIT

    def _reload_blocks(
        self, req: Request, back: list[HashBlock], num_bytes: int
    ) -> Generator[simpy.Event, object, None]:
        """Process: copy the blocks back; the request re-queues and then finds them on the GPU."""
        duration = yield from self.transfers.reload(num_bytes, len(back) * self.cpu_hash_bytes)
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
        self.events.reload_done(now, req, len(back), len(back) * self.cpu_hash_bytes, duration)
        self.queue.requeue_front(req)

    def release_held(self, req: Request) -> None:
        """The request was admitted or gave up: unpin what its reload held."""
        for b in self.held.pop(req.req_id, []):
            self.tree.unpin(b)

    def _drop_cpu_tail(self, hash_id: int, last_used_us: int) -> bool | None:
        """The CPU store's drop: the oldest CPU block that no cached block extends."""
        b = self.tree.blocks.get(hash_id)
        if b is None or b.tier != Tier.CPU or b.children:
            return None
        now = int(self.env.now)
        self.cpu.record_drop(now - b.cpu_since_us)
        self.events.cpu_drop(now, b.entry, 1, self.hash_bytes)
        self.tree.forget_off_gpu(b)  # `forget` of a CPU block without children
        self.cpu.release(self.cpu_hash_bytes)
        if b.parent is not None:
            self._push_cpu_tail(b.parent)
        return True

    def _push_cpu_tail(self, b: HashBlock) -> None:
        if b.tier == Tier.CPU and not b.children:
            self.cpu.push(b.entry.last_used_us, b.entry.entry_id, b.hash_id)

    def _offloaded(self, b: HashBlock, duration: int) -> None:
        """One block's copy landed (`duration` µs paid): it is on the CPU, its GPU bytes free."""
        now = int(self.env.now)
        if self.tree.blocks.get(b.hash_id) is b:
            b.tier = Tier.CPU
            b.cpu_since_us = now
            if not b.children:  # a CPU tail: droppable
                self.cpu.push(b.entry.last_used_us, b.entry.entry_id, b.hash_id)
        else:  # its chain was dropped while it was in flight
            self.cpu.release(self.cpu_hash_bytes)
            self.orphans -= 1
        self.events.offload_done(now, b.entry, 1, self.cpu_hash_bytes, duration)
        self.wake.notify()

    def forget(self, b: HashBlock) -> None:
        """Remove b and its descendants from the cache, freeing what each tier holds."""
        for child in list(b.children.values()):
            self.forget(child)
        assert b.refcount == 0 and b.tier != Tier.FLIGHT_IN
        if b.tier == Tier.GPU:
            self.tree.remove_gpu(b)
            self.pool.release(self.hash_bytes)
            return
        self.tree.forget_off_gpu(b)
        if b.tier == Tier.CPU:
            self.cpu.release(self.cpu_hash_bytes)
        else:  # FLIGHT_OUT: the landing copy frees its bytes
            self.orphans += 1
        if b.parent is not None:
            self._push_cpu_tail(b.parent)
