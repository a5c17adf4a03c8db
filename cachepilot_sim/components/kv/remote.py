"""The prefix manager's side of a KV store beyond its GPU, shared with other engines (a cluster's
shared tier: Mooncake Store, LMCache's remote backend).

A request whose chain continues, past its GPU (and CPU) blocks, into blocks the store holds loads
them over the network into GPU blocks held in flight, and is handed back to the front of the queue
when they land, where it finds them on the GPU (a hit): the load replaces their recompute. When a
request finishes, its computed blocks that the store lacks are written to it (write-through on
completion, not on eviction: a block is in the store while its GPU copy is still in use, so
another replica can hit it at once, as LMCache's store-on-prefill does).

The store itself (capacity, eviction, network lanes) is the cluster's (`cluster/shared_tier.py`);
the manager sees it through `RemoteKv`, one port per replica, handed in with `KvDeps`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Protocol

import simpy

from cachepilot_sim.components.kv.forest import HashBlock
from cachepilot_sim.components.kv.prefix_tier import PrefixCpuTier
from cachepilot_sim.components.kv.protocol import Admit, KvDeps, Tier
from cachepilot_sim.components.request import Request


class RemoteKv(Protocol):
    """One replica's port to the shared store of prefix blocks (by hash)."""

    def num_stored(self, hash_ids: Sequence[int], start: int) -> int:
        """How many blocks of `hash_ids`, from position `start` on, the store can serve now
        (consecutive: the first one it lacks ends the run)."""
        ...

    def start_load(self, hash_ids: Sequence[int]) -> simpy.Event:
        """Pin the blocks in the store now and start copying them to this replica; the event's
        value is the transfer time paid (µs) when they have landed."""
        ...

    def store(self, blocks: Sequence[tuple[int, int, float]]) -> None:
        """Write (hash id, group id, recompute µs) blocks this replica computed to the store;
        those it already holds or is writing are skipped."""
        ...


class OffGpuLoads:
    """A chain's continuation off the GPU: the CPU tier's, else the shared store's (when the
    manager has one: `deps.remote`); and the write-through of finished blocks to the store."""

    def __init__(
        self,
        deps: KvDeps,
        cpu_tier: PrefixCpuTier,
        make_room: Callable[[int], bool],
        insert: Callable[[list[HashBlock], list[int], Request], None],
        seen: set[int],
    ) -> None:
        """What the prefix manager lends: its CPU tier (tried first; its tree, block size, and
        `held`, the blocks pinned per request id until the request is admitted), its room rule
        (`make_room(bytes)`, True when free now), its block insertion (`insert(chain, new_ids,
        req)`: new GPU blocks extending `chain`, referenced once, appended to it) and the hash
        ids ever cached (`seen`)."""
        self.env, self.pool, self.queue, self.remote = deps.env, deps.pool, deps.queue, deps.remote
        self.cpu_tier, self.tree, self.hash_bytes = cpu_tier, cpu_tier.tree, cpu_tier.hash_bytes
        self.make_room, self.insert, self.seen = make_room, insert, seen

    def continuation(self, req: Request, ids: list[int], hits: int) -> Admit | None:
        """The CPU tier's reload (`PrefixCpuTier.continuation`) when the chain continues there;
        else a load of the store's run of blocks after the GPU hits (WAIT), or BLOCKED while the
        GPU has no room for them; None when neither holds a continuation."""
        early = self.cpu_tier.continuation(req, ids, hits)
        if early is not None or self.remote is None:
            return early
        num = self.remote.num_stored(ids, hits)
        if num == 0:
            return None
        chain = [self.tree.blocks[h] for h in ids[:hits]]
        for b in chain:  # pinned first, so making room cannot evict the prefix being extended
            self.tree.pin(b)
        num_bytes = num * self.hash_bytes
        if not self.make_room(num_bytes):
            for b in chain:
                self.tree.unpin(b)
            return Admit.BLOCKED
        self.pool.start_reload(num_bytes)
        self.insert(chain, ids[hits : hits + num], req)  # appends the new blocks to chain
        self.seen.update(ids[hits : hits + num])  # cached here now: a later miss is a restore
        back = chain[hits:]
        for b in back:
            b.tier = Tier.FLIGHT_IN
        self.cpu_tier.held.setdefault(req.req_id, []).extend(chain)
        self.env.process(self._land(req, back, self.remote.start_load(ids[hits : hits + num])))
        return Admit.WAIT

    def _land(
        self, req: Request, back: list[HashBlock], load: simpy.Event
    ) -> Generator[simpy.Event, object, None]:
        """Process: wait for the load; the blocks are GPU blocks, the request goes first."""
        yield load
        now = int(self.env.now)
        for b in back:
            b.tier = Tier.GPU
            b.computed = True
            b.entry.last_used_us = now
        self.pool.finish_reload(len(back) * self.hash_bytes)
        self.queue.requeue_front(req)

    def write_through(self, req: Request, chain: list[HashBlock]) -> None:
        """The finished request's computed blocks go to the store (if there is one)."""
        if self.remote is not None:
            self.remote.store([(b.hash_id, req.group_id, b.entry.recompute_us) for b in chain])
