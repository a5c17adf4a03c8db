"""The prefix manager's side of a KV store beyond its GPU, shared with other engines (a cluster's
shared tier: Mooncake Store, LMCache's remote backend).

A request whose chain continues, past its GPU (and CPU) blocks, into blocks the store holds loads
them over the network into GPU blocks held in flight, and is handed back to the front of the queue
when they land, where it finds them on the GPU (a hit): the load replaces their recompute. With
`cluster.shared_tier.load=CHEAPER` the run is loaded only when the modelled transfer is below
the recompute of its tokens at their depth, else recomputed (all or nothing: the store's module
docstring says why). Writes (`cluster.shared_tier.write`): ON_COMPLETION writes a finished
request's computed blocks the store lacks; ON_EVICTION writes a block the GPU evicts and the store
lacks: it stays on the GPU, pinned and marked FLIGHT_OUT (not reusable: a request that needs it
waits), its bytes in flight, until the write lands; then it is disposed of as the eviction chose
(offloaded to the CPU tier or dropped), and its parent may become a tail.

The store itself (capacity, eviction, network lanes, the cited designs) is the cluster's
(`cluster/shared_tier.py`); the manager sees it through `SharedKvStore` (a port declared in
`protocol.py`), one per replica, handed in with `KvDeps`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import simpy

from cachepilot_sim.components.kv.forest import HashBlock
from cachepilot_sim.components.kv.prefix_tier import PrefixCpuTier
from cachepilot_sim.components.kv.protocol import Admit, KvDeps, Tier
from cachepilot_sim.components.request import Request
from cachepilot_sim.cost import recompute_us

# The manager's disposal of an evicted block: (block, now µs, allow_offload).
Dispose = Callable[[HashBlock, int, bool], None]


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
        self.fit, self.wake = deps.fit, deps.wake
        self.cpu_tier, self.tree, self.hash_bytes = cpu_tier, cpu_tier.tree, cpu_tier.hash_bytes
        self.make_room, self.insert, self.seen = make_room, insert, seen
        # ON_EVICTION: hash id of a held block -> what it waits for (its write, held children).
        self.holding: dict[int, int] = {}

    def continuation(self, req: Request, ids: list[int], hits: int) -> Admit | None:
        """The CPU tier's reload (`PrefixCpuTier.continuation`) when the chain continues there;
        else a load of the store's run of blocks after the GPU hits (WAIT), or BLOCKED while the
        GPU has no room for them; None when neither holds a continuation."""
        early = self.cpu_tier.continuation(req, ids, hits)
        if early is not None or self.remote is None:
            return early
        num = self.remote.num_stored(ids, hits)
        if num == 0 or not self._load_pays(req, ids, hits, num):
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

    def _load_pays(self, req: Request, ids: list[int], hits: int, num: int) -> bool:
        """ALWAYS: load. CHEAPER: load when the transfer is modelled below the recompute of the
        `num` blocks after the `hits` GPU ones. A recompute chosen is recorded for the metrics,
        less the blocks this replica had cached before (`realized_recompute_s` counts those)."""
        remote = self.remote
        assert remote is not None
        if not remote.load_when_cheaper:
            return True
        tokens, fit = remote.hash_tokens, self.fit
        cost = recompute_us(fit, (hits + num) * tokens) - recompute_us(fit, hits * tokens)
        pays = remote.load_estimate_us(num) < cost
        fresh = [] if pays else [j for j in range(hits, hits + num) if ids[j] not in self.seen]
        fresh_us = sum(
            recompute_us(fit, (j + 1) * tokens) - recompute_us(fit, j * tokens) for j in fresh
        )
        remote.record_choice(req.req_id, len(fresh), fresh_us)
        return pays

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
        """ON_COMPLETION: the finished request's computed blocks go to the store."""
        if self.remote is not None and not self.remote.write_on_eviction:
            self.remote.store([(b.hash_id, req.group_id, b.entry.recompute_us) for b in chain])

    def write_evicted(self, b: HashBlock, allow_offload: bool, dispose: Dispose) -> bool:
        """ON_EVICTION: hold an evicted idle tail on the GPU (pinned, FLIGHT_OUT, its bytes in
        flight) while its write to the store runs, and while children cut before it in the same
        decision are held (dropping it would drop them mid-write); when all that has landed,
        `dispose(b, now, True)`. False when the caller disposes of it now: no write policy, or
        nothing to wait for (the store holds it or has no room, and no child is held), or the
        bytes are needed at once (`allow_offload` False: decode growth)."""
        remote = self.remote
        if remote is None or not remote.write_on_eviction:
            return False
        waits = sum(c.hash_id in self.holding for c in b.children.values())
        writes = allow_offload and b.computed and not remote.holds(b.hash_id)
        if writes:
            e = b.entry

            def landed(_: int) -> None:
                self._settle(b, dispose)

            writes = remote.store([(b.hash_id, e.session_id, e.recompute_us)], landed) > 0
        if not writes and not waits:
            return False
        self.holding[b.hash_id] = waits + writes
        self.tree.pin(b)  # out of the idle count; its parent keeps it as a GPU child
        b.tier = Tier.FLIGHT_OUT  # not reusable while the NIC reads it
        self.pool.start_offload(self.hash_bytes)
        self.cpu_tier.transfers.pending_free_bytes += self.hash_bytes  # the room rule waits
        return True

    def _settle(self, b: HashBlock, dispose: Dispose) -> None:
        """One thing `b` waited for landed (its write, or a held child's release). When none is
        left: back to an idle GPU tail for a moment, then disposed of as its eviction chose; a
        held parent waits for one thing less, and blocked requests may go."""
        left = self.holding[b.hash_id] - 1
        if left:
            self.holding[b.hash_id] = left
            return
        del self.holding[b.hash_id]
        self.pool.finish_reload(self.hash_bytes)
        self.cpu_tier.transfers.pending_free_bytes -= self.hash_bytes
        b.tier = Tier.GPU
        self.tree.unpin(b)
        dispose(b, int(self.env.now), True)
        self.tree.expose_parent(b)
        p = b.parent
        if p is not None and p.hash_id in self.holding:
            self._settle(p, dispose)
        self.wake.notify()
