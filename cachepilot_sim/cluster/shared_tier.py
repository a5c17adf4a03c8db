"""A KV store shared by every replica of a cluster (Mooncake Store, FAST'25; LMCache's remote
backend): prefix blocks by hash in the DRAM of storage nodes, reached over the network.

Each block is in exactly one state: absent, WRITING (its bytes reserved, not readable) or STORED
(readable; pinned while loads read it). When a write needs room the store evicts STORED blocks
that no load is reading, in the order of its own eviction policy (any registered name,
`cluster.shared_tier.policy`); a write that cannot get room even so stores only the leading
blocks that fit. The store is flat: it may evict a block whose chain continues in it, which
strands the rest (a load stops at the first missing).

When a replica writes (`cluster.shared_tier.write`; `components/kv/remote.py` is its side):
ON_COMPLETION writes the blocks a finished request computed and the store lacks (LMCache stores
on the save path of each forward, `save_decode_cache` and `save_unfull_chunk` off by default:
the prompt's full chunks, while the GPU still holds them, so another replica can hit them at
once). ON_EVICTION writes a block only when the replica's GPU evicts it and the store has no
record of it (write-back: fewer bytes and less store churn, later hits for other replicas), as
the eviction-aware lazy offload proposed in LMCache PR #4499 (stores deferred until the GPU
blocks near eviction, so nothing the GPU prefix cache still serves is copied down) and Mooncake
master's `offload_on_evict` (its DRAM tier to SSD) do. The write reads the GPU copy (GPUDirect
RDMA, as Mooncake's transfer engine does, zero-copy from VRAM): its GPU bytes are in flight,
neither free nor reusable, until it lands; then the block is disposed of as the eviction chose.

Whether a replica loads (`cluster.shared_tier.load`): ALWAYS loads the store's run of blocks after
its GPU prefix; CHEAPER loads it only when `load_estimate_us` (latency + bytes / bandwidth + the
loads queued on the replica's ingress lane) is below the recompute of those tokens at their depth
(`cost.recompute_us`, the prefix manager's price of a block), else recomputes. LMCache's
`min_retrieve_tokens` and SGLang HiCache's L3 prefetch threshold (256 tokens by default, per
sgl-project/sglang#12092) skip small retrievals by a fixed token count; this prices the choice.
All or nothing: the saving of loading the first k blocks, recompute(k) - load(k), is convex in k
(recompute grows with depth, a load is linear after its latency), so it peaks at k = 0 or at the
whole run and a partial load never wins. (Sources read: LMCache
docs/source/api_reference/configurations.rst and PR #4499; Mooncake issue #3331 and
doc/en/architecture.md.)

A transfer holds a GPU's lane of `cluster.shared_tier.link` (the same lane P/D handovers use)
and one of the store's `store_ports` lanes that way, for latency + bytes / bandwidth
(`network.py`'s link model).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from enum import IntEnum
from typing import Any

import simpy

from cachepilot_sim.clock import SimEnvironment, s_to_us
from cachepilot_sim.cluster.network import Network, handover_us
from cachepilot_sim.config import GB, SimConfig, TierLoad, TierWrite, policy_config
from cachepilot_sim.policies import CacheEntry, GapEstimator, make_policy
from cachepilot_sim.policies.candidates import CandidateIndex


class BlockState(IntEnum):
    """Where a block is in the store (absent blocks have no record)."""

    WRITING = 0
    STORED = 1


class _Block:
    __slots__ = ("entry", "state", "readers")

    def __init__(self, entry: CacheEntry) -> None:
        self.entry = entry
        self.state = BlockState.WRITING
        self.readers = 0  # loads reading it now: not evictable


class SharedKvTier:
    """The store: capacity in bytes, its blocks and their states, its policy, its lanes."""

    def __init__(self, env: SimEnvironment, cfg: SimConfig, network: Network) -> None:
        t, p = cfg.cluster.shared_tier, cfg.policy
        self.env, self.network, self.kind = env, network, t.link
        self.write, self.load = t.write, t.load
        self.capacity_bytes = int(t.capacity_gb * GB)
        self.hash_tokens = cfg.replay.hash_block_tokens
        self.block_bytes = cfg.model.kv_bytes_per_token * self.hash_tokens
        self.estimator = GapEstimator(p.ema_weight, s_to_us(p.prior_gap_s), s_to_us(p.delta_s))
        shared = {"delta_s": p.delta_s, "ema_weight": p.ema_weight, "prior_gap_s": p.prior_gap_s}
        self.policy = make_policy(policy_config(t.policy, **shared), self.estimator)
        self.index = CandidateIndex(self.policy)  # STORED blocks no load is reading
        self.store_in = simpy.Resource(env, t.store_ports)
        self.store_out = simpy.Resource(env, t.store_ports)
        self.blocks: dict[int, _Block] = {}
        self.entries: dict[int, CacheEntry] = {}  # per hash, kept after eviction (ghost state)
        self.hashes: list[int] = []  # entry id -> hash
        self.stored_bytes = 0
        self.writing_bytes = 0
        self.peak_bytes = 0
        self.backlog_us = [0] * len(network.ingress[t.link])  # per replica: loads not landed
        # Per request: the (blocks, recompute µs) of the store's run it chose to recompute
        # (CHEAPER), overwritten at each admission attempt, dropped when it loads instead.
        self.declined: dict[int, tuple[int, float]] = {}
        self.counts = dict.fromkeys(
            ("loads", "load_blocks", "load_us", "writes", "write_blocks", "write_us",
             "write_skipped_blocks", "evictions"),
            0,
        )  # fmt: skip

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.stored_bytes - self.writing_bytes

    def port(self, replica: int) -> SharedTierPort:
        """Replica `replica`'s port (`components/kv/protocol.py`'s `SharedKvStore`)."""
        return SharedTierPort(self, replica)

    def num_stored(self, hash_ids: Sequence[int], start: int) -> int:
        """Consecutive STORED blocks of `hash_ids` from position `start`."""
        num = 0
        for h in hash_ids[start:]:
            b = self.blocks.get(h)
            if b is None or b.state != BlockState.STORED:
                break
            num += 1
        return num

    def holds(self, hash_id: int) -> bool:
        """The store has a record of the block (WRITING or STORED): a write would be skipped."""
        return hash_id in self.blocks

    def load_estimate_us(self, replica: int, num_blocks: int) -> int:
        """What loading `num_blocks` into `replica` would take if started now: the transfer on
        an idle link plus the service time of the tier's loads not yet landed on its ingress lane
        (P/D handovers on that lane and the store ports' queue are not counted)."""
        fit = self.network.fits[self.kind]
        return handover_us(fit, num_blocks * self.block_bytes) + self.backlog_us[replica]

    def decline(self, req_id: int, num_blocks: int, recompute_us: float) -> None:
        """Request `req_id` recomputes `num_blocks` of the store's run that its replica never
        cached (CHEAPER found loading dearer; 0 when it loads them), worth `recompute_us`; its
        latest attempt counts."""
        if num_blocks:
            self.declined[req_id] = (num_blocks, recompute_us)
        else:
            self.declined.pop(req_id, None)

    def start_load(self, replica: int, hash_ids: Sequence[int]) -> simpy.Process:
        """Pin STORED blocks now (a use: the policy and the estimator see it) and copy them to
        `replica`; the process's value is the transfer time (µs)."""
        now = int(self.env.now)
        blocks = [self.blocks[h] for h in hash_ids]
        for b in blocks:
            assert b.state == BlockState.STORED, "a load of a block the store does not hold"
            e = b.entry
            if b.readers == 0:
                self.index.discard(e.entry_id)
                self.estimator.observe(e, now - e.last_used_us)
            b.readers += 1
            self.policy.on_access(e, now)
            e.last_used_us, e.num_uses = now, e.num_uses + 1
        return self.env.process(self._load(replica, blocks))

    def _load(self, replica: int, blocks: list[_Block]) -> Generator[simpy.Event, object, int]:
        """Process: store egress, then the replica's ingress lane; the blocks are idle again."""
        lane = self.network.ingress[self.kind][replica]
        num_bytes = len(blocks) * self.block_bytes
        service = handover_us(self.network.fits[self.kind], num_bytes)
        self.backlog_us[replica] += service
        duration = yield from self.network.move(self.kind, self.store_out, lane, num_bytes)
        self.backlog_us[replica] -= service
        now = int(self.env.now)
        for b in blocks:
            b.readers -= 1
            if b.readers == 0:
                self.policy.on_release(b.entry, now)
                self.index.add(b.entry, now)
        c = self.counts
        c["loads"] += 1
        c["load_blocks"] += len(blocks)
        c["load_us"] += duration
        return duration

    def store(
        self,
        replica: int,
        blocks: Sequence[tuple[int, int, float]],
        landed: Callable[[int], None] | None = None,
    ) -> int:
        """Write (hash, group, recompute µs) blocks from `replica` that the store has no record
        of: reserve room (evicting by policy) for as many leading ones as fit, then copy them.
        Returns how many are being written; `landed(µs paid)` runs when they are STORED."""
        new = [blk for blk in blocks if blk[0] not in self.blocks]
        if not new:
            return 0
        room = self.free_bytes + len(self.index) * self.block_bytes
        fit = min(len(new), max(0, room // self.block_bytes))
        if fit == 0 or not self._make_room(fit * self.block_bytes):
            fit = 0  # a policy may free less than asked: nothing is written then
        self.counts["write_skipped_blocks"] += len(new) - fit
        if fit == 0:
            return 0
        now = int(self.env.now)
        written = []
        for h, group, recompute in new[:fit]:
            e = self.entries.get(h)
            if e is None:
                e = CacheEntry(len(self.entries), group, 0, 0, 0, self.hash_tokens,
                               self.block_bytes, now, now, recompute_us=recompute)  # fmt: skip
                self.entries[h] = e
                self.hashes.append(h)
            e.session_id, e.last_used_us = group, now
            e.restore_us = e.recompute_us  # losing it costs its recompute
            b = self.blocks[h] = _Block(e)
            written.append(b)
        self.writing_bytes += fit * self.block_bytes
        self.env.process(self._write(replica, written, landed))
        return fit

    def _make_room(self, num_bytes: int) -> bool:
        """Evict idle STORED blocks, smallest policy key first, until `num_bytes` are free."""
        short = num_bytes - self.free_bytes
        if short > 0:
            now = int(self.env.now)
            for e in self.index.select(short, now, lambda e: e):
                self.policy.on_evict(e, now)
                self.index.discard(e.entry_id)
                del self.blocks[self.hashes[e.entry_id]]
                self.stored_bytes -= self.block_bytes
                self.counts["evictions"] += 1
        return self.free_bytes >= num_bytes

    def _write(
        self, replica: int, blocks: list[_Block], landed: Callable[[int], None] | None
    ) -> Generator[simpy.Event, object, None]:
        """Process: the replica's egress lane, then store ingress; the blocks are STORED (and
        the writer is told, `landed`)."""
        lane = self.network.egress[self.kind][replica]
        num_bytes = len(blocks) * self.block_bytes
        duration = yield from self.network.move(self.kind, lane, self.store_in, num_bytes)
        now = int(self.env.now)
        for b in blocks:
            b.state = BlockState.STORED
            self.policy.on_release(b.entry, now)
            self.index.add(b.entry, now)
        self.writing_bytes -= num_bytes
        self.stored_bytes += num_bytes
        self.peak_bytes = max(self.peak_bytes, self.stored_bytes)
        c = self.counts
        c["writes"] += 1
        c["write_blocks"] += len(blocks)
        c["write_us"] += duration
        if landed is not None:
            landed(duration)

    def conserved(self) -> bool:
        """Every byte in exactly one state: stored + writing + free == capacity, each state's
        bytes match its blocks, and only idle STORED blocks are eviction candidates."""
        states = [b.state for b in self.blocks.values()]
        num_stored = states.count(BlockState.STORED)
        idle_stored = {
            b.entry.entry_id
            for b in self.blocks.values()
            if b.readers == 0 and b.state == BlockState.STORED
        }
        return (
            self.free_bytes >= 0
            and self.stored_bytes == num_stored * self.block_bytes
            and self.writing_bytes == (len(states) - num_stored) * self.block_bytes
            and set(self.index.entries) == idle_stored
        )

    def metrics(self, lookup_blocks: int) -> dict[str, Any]:
        """Realized costs of the store; `lookup_blocks`: prefix blocks the replicas looked up."""
        c = self.counts
        num_declined = sum(n for n, _ in self.declined.values())
        declined_us = sum(us for _, us in self.declined.values())
        return {
            "shared_tier_gb": self.capacity_bytes / GB,
            "shared_tier_policy": self.policy.name,
            "shared_tier_write": self.write.value,
            "shared_tier_load": self.load.value,
            "shared_hit_ratio": c["load_blocks"] / lookup_blocks if lookup_blocks else 0.0,
            "shared_loads": c["loads"],
            "shared_load_blocks": c["load_blocks"],
            "shared_load_gb": c["load_blocks"] * self.block_bytes / GB,
            "shared_load_s": c["load_us"] / 1e6,
            "shared_writes": c["writes"],
            "shared_write_blocks": c["write_blocks"],
            "shared_write_gb": c["write_blocks"] * self.block_bytes / GB,
            "shared_write_s": c["write_us"] / 1e6,
            "shared_write_skipped_blocks": c["write_skipped_blocks"],
            "shared_evictions": c["evictions"],
            "shared_peak_gb": self.peak_bytes / GB,
            "shared_recompute_blocks": num_declined,
            "shared_recompute_s": declined_us / 1e6,
            "shared_restore_s": (c["load_us"] + declined_us) / 1e6,
        }


class SharedTierPort:
    """One replica's view of the store: what its prefix KV manager calls (`SharedKvStore`)."""

    __slots__ = ("tier", "replica", "write_on_eviction", "load_when_cheaper", "hash_tokens")

    def __init__(self, tier: SharedKvTier, replica: int) -> None:
        self.tier, self.replica = tier, replica
        self.write_on_eviction = tier.write == TierWrite.ON_EVICTION
        self.load_when_cheaper = tier.load == TierLoad.CHEAPER
        self.hash_tokens = tier.hash_tokens

    def num_stored(self, hash_ids: Sequence[int], start: int) -> int:
        """Consecutive blocks the store can serve from position `start`."""
        return self.tier.num_stored(hash_ids, start)

    def holds(self, hash_id: int) -> bool:
        """The store has the block or is writing it."""
        return self.tier.holds(hash_id)

    def load_estimate_us(self, num_blocks: int) -> int:
        """Modelled time to load `num_blocks` into this replica if started now."""
        return self.tier.load_estimate_us(self.replica, num_blocks)

    def record_choice(self, req_id: int, num_recomputed: int, recompute_us: float) -> None:
        """The request's latest load-or-recompute choice: blocks of the store's run it
        recomputes and this replica never cached (0 when it loads them), and their cost (µs)."""
        self.tier.decline(req_id, num_recomputed, recompute_us)

    def start_load(self, hash_ids: Sequence[int]) -> simpy.Event:
        """Pin the blocks and copy them to this replica (the event's value: µs paid)."""
        return self.tier.start_load(self.replica, hash_ids)

    def store(
        self,
        blocks: Sequence[tuple[int, int, float]],
        landed: Callable[[int], None] | None = None,
    ) -> int:
        """Write blocks of this replica to the store; how many are being written."""
        return self.tier.store(self.replica, blocks, landed)
