"""A KV store shared by every replica of a cluster (Mooncake Store, FAST'25; LMCache's remote
backend): prefix blocks by hash in the DRAM of storage nodes, reached over the network.

A replica writes the blocks a finished request computed (write-through on completion: LMCache
stores on prefill, so another replica can hit them while the first still holds them) and loads,
instead of recomputing, the run of blocks after its GPU prefix that the store holds
(`components/kv/remote.py` is the replica's side). Each block is in exactly one state: absent,
WRITING (its bytes reserved, not readable) or STORED (readable; pinned while loads read it).
When a write needs room the store evicts STORED blocks that no load is reading, in the order of
its own eviction policy (any registered name, `cluster.shared_tier.policy`); a write that cannot
get room even so stores only the leading blocks that fit. The store is flat: it may evict a
block whose chain continues in it, which strands the rest (a load stops at the first missing).

A transfer holds a GPU's lane of `cluster.shared_tier.link` (the same lane P/D handovers use)
and one of the store's `store_ports` lanes that way, for latency + bytes / bandwidth
(`network.py`'s link model).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from enum import IntEnum
from typing import Any

import simpy

from cachepilot_sim.clock import SimEnvironment, s_to_us
from cachepilot_sim.cluster.network import Network
from cachepilot_sim.config import GB, SimConfig, policy_config
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
        self.counts = dict.fromkeys(
            ("loads", "load_blocks", "load_us", "writes", "write_blocks", "write_us",
             "write_skipped_blocks", "evictions"),
            0,
        )  # fmt: skip

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.stored_bytes - self.writing_bytes

    def port(self, replica: int) -> SharedTierPort:
        """Replica `replica`'s port (`components/kv/remote.py`'s `RemoteKv`)."""
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
        duration = yield from self.network.move(self.kind, self.store_out, lane, num_bytes)
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

    def store(self, replica: int, blocks: Sequence[tuple[int, int, float]]) -> None:
        """Write (hash, group, recompute µs) blocks from `replica` that the store has no record
        of: reserve room (evicting by policy) for as many leading ones as fit, then copy them."""
        new = [blk for blk in blocks if blk[0] not in self.blocks]
        if not new:
            return
        room = self.free_bytes + len(self.index) * self.block_bytes
        fit = min(len(new), max(0, room // self.block_bytes))
        if fit == 0 or not self._make_room(fit * self.block_bytes):
            fit = 0  # a policy may free less than asked: nothing is written then
        self.counts["write_skipped_blocks"] += len(new) - fit
        if fit == 0:
            return
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
        self.env.process(self._write(replica, written))

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

    def _write(self, replica: int, blocks: list[_Block]) -> Generator[simpy.Event, object, None]:
        """Process: the replica's egress lane, then store ingress; the blocks are STORED."""
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
        return {
            "shared_tier_gb": self.capacity_bytes / GB,
            "shared_tier_policy": self.policy.name,
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
        }


class SharedTierPort:
    """One replica's view of the store: what its prefix KV manager calls (`RemoteKv`)."""

    __slots__ = ("tier", "replica")

    def __init__(self, tier: SharedKvTier, replica: int) -> None:
        self.tier, self.replica = tier, replica

    def num_stored(self, hash_ids: Sequence[int], start: int) -> int:
        """Consecutive blocks the store can serve from position `start`."""
        return self.tier.num_stored(hash_ids, start)

    def start_load(self, hash_ids: Sequence[int]) -> simpy.Event:
        """Pin the blocks and copy them to this replica (the event's value: µs paid)."""
        return self.tier.start_load(self.replica, hash_ids)

    def store(self, blocks: Sequence[tuple[int, int, float]]) -> None:
        """Write-through of blocks this replica computed."""
        self.tier.store(self.replica, blocks)
