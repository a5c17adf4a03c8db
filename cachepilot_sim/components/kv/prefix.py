"""Prefix-sharing KV manager (trace replay): ref-counted hash blocks, suffix eviction, a CPU tier.

A request reuses the leading cached blocks of its hash chain and computes the rest; when it ends,
its blocks stay cached (idle). A decision shows the policy every idle block whose GPU subtree is
idle, as chains cut at branch points (`forest.py`); it may cut only tails. A block's restore cost
is the recompute of its tokens at its chain position, or a reload when a CPU copy will exist and is
cheaper (priced by the CPU store's survival estimate). Tokens outside hash blocks (output, traces
without hashes) sit in private pages freed at the end. With `kv.offload_enabled`, evicted tails go
to the CPU store (`prefix_tier.py`).
"""

from __future__ import annotations

from cachepilot_sim.components.kv.cpu_store import CpuStore
from cachepilot_sim.components.kv.forest import HashBlock, PrefixTree
from cachepilot_sim.components.kv.prefix_tier import PrefixCpuTier
from cachepilot_sim.components.kv.protocol import Admit, KvDeps, KvStats, Tier
from cachepilot_sim.components.kv.remote import OffGpuLoads
from cachepilot_sim.components.kv.room import RoomRule
from cachepilot_sim.components.kv.tails import TailIndex
from cachepilot_sim.components.kv.transfers import Transfers, cpu_kv_bytes_per_token
from cachepilot_sim.components.request import KvSource, Outcome, Request
from cachepilot_sim.config import SimConfig
from cachepilot_sim.cost import recompute_us
from cachepilot_sim.policies import CacheEntry


class _Running:
    """A running request's prefix chain and the private pages it holds."""

    __slots__ = ("chain", "pages", "private_pages", "hash_tokens")

    def __init__(
        self, chain: list[HashBlock], pages: int, private_pages: int, hash_tokens: int
    ) -> None:
        self.chain = chain
        self.pages = pages  # pages as the batcher counts them
        self.private_pages = private_pages  # pages held beyond the hash blocks
        self.hash_tokens = hash_tokens


class PrefixKvManager:
    """KV shared by prefix hash (trace replay); requests carry their hash chain and group."""

    def __init__(self, cfg: SimConfig, deps: KvDeps) -> None:
        self.env, self.pool, self.link = deps.env, deps.pool, deps.link
        self.policy, self.estimator, self.fit = deps.policy, deps.estimator, deps.fit
        self.events, self.queue, self.wake = deps.events, deps.queue, deps.wake
        model = cfg.model
        self.block_tokens = cfg.kv.block_tokens
        self.block_bytes = [m.kv_bytes_per_token * cfg.kv.block_tokens for m in cfg.models]
        self.hash_tokens = cfg.replay.hash_block_tokens
        self.hash_bytes = model.kv_bytes_per_token * self.hash_tokens
        self.cpu_hash_bytes = (
            cpu_kv_bytes_per_token(model, cfg.kv.offload_dtype_bytes) * self.hash_tokens
        )
        self.max_blocks = cfg.replay.prefix_cache_max_blocks
        self.max_context, self.prompt_room = model.max_context_tokens, cfg.engine.prompt_room_tokens
        self.offload_enabled = cfg.kv.offload_enabled
        self.stats = KvStats()
        self.room = RoomRule(self.pool, cfg.kv.watermark_fraction, cfg.engine.atomic_admission)
        self.cpu = CpuStore(cfg.kv.cpu_store_bytes, cfg.kv.cpu_store_evicts_lru, self.stats)
        self.transfers = Transfers(
            self.env, self.pool, self.link, self.stats, cfg.hardware.quantize_bytes_per_us
        )
        self.reload_block_us = self.transfers.reload_estimate_us(
            self.hash_bytes, self.cpu_hash_bytes
        )
        self.tree = PrefixTree()
        self.tails = TailIndex(self.tree, self.policy, self)
        self.cpu_tier = PrefixCpuTier(
            deps,
            self.tree,
            self.cpu,
            self.transfers,
            self.stats,
            (self.hash_bytes, self.cpu_hash_bytes),
            self._make_room,
        )
        self.running: dict[int, _Running] = {}
        self.seen: set[int] = set()  # hash ids ever cached: a miss on one is a paid restore
        self.group_entries: dict[int, CacheEntry] = {}  # per inferred session: its gap EMA
        # One policy entry per hash, kept after eviction (a returning block keeps its history).
        self.hash_entries: dict[int, CacheEntry] = {}
        self._next_entry_id = 0
        self._block_costs: list[float] = []  # _block_recompute_us by depth
        # Evicted tails may go to the cluster's shared tier first (its write on eviction)
        self.writes_evicted = deps.remote is not None and deps.remote.write_on_eviction
        self.off_gpu = OffGpuLoads(deps, self.cpu_tier, self._make_room, self._insert, self.seen)

    def blocks_for(self, num_tokens: int) -> int:
        """Pages of `kv.block_tokens` that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_tokens)

    def evictable_bytes(self) -> int:
        """GPU bytes of idle blocks: every one is evictable, tails first."""
        return self.tree.num_idle_gpu_blocks * self.hash_bytes

    # -- arrivals: inferred sessions feed the reuse estimator ---------------------------------
    def _group_entry(self, group: int) -> CacheEntry:
        e = self.group_entries.get(group)
        if e is None:
            now = int(self.env.now)
            e = CacheEntry(self._next_entry_id, group, 0, 0, 0, 0, 0, now, now)
            self._next_entry_id += 1
            self.group_entries[group] = e
        return e

    def on_arrival(self, req: Request) -> None:
        """A continuation's gap since its parent finished is one idle-gap observation; every
        block of its chain that was ever cached is accessed (a hit, or a miss after eviction)."""
        now = int(self.env.now)
        parent = req.parent
        if parent is not None and parent.outcome == Outcome.COMPLETED:
            self.estimator.observe(self._group_entry(req.group_id), now - parent.finish_us)
            self.tails.regroup(req.group_id)
        blocks = self.tree.blocks
        for h in req.hash_ids:
            entry = self.hash_entries.get(h)
            if entry is not None:
                self.policy.on_access(entry, now)
                b = blocks.get(h)
                if b is not None:
                    self.tree.touch(b)  # the hook may re-key an idle tail

    # -- admission ---------------------------------------------------------------------------
    def _block_recompute_us(self, depth: int) -> float:
        """Recompute of the hash block at `depth` of a chain (µs): computed once per depth."""
        costs = self._block_costs
        fit, n = self.fit, self.hash_tokens
        while len(costs) <= depth:
            j = len(costs)
            costs.append(recompute_us(fit, (j + 1) * n) - recompute_us(fit, j * n))
        return costs[depth]

    def admit(self, req: Request) -> Admit:
        """Reuse the cached leading blocks, reload CPU ones, allocate the rest + private pages."""
        ids = req.hash_ids
        tokens = req.prompt_tokens + (req.generated if req.num_preemptions else 0)
        final_tokens = req.prompt_tokens + req.output_tokens
        hash_tokens = len(ids) * self.hash_tokens
        final_private = self.blocks_for(max(0, final_tokens - hash_tokens))
        total_bytes = len(ids) * self.hash_bytes + final_private * self.block_bytes[0]
        if total_bytes > self.pool.capacity_bytes or final_tokens > self.max_context:
            return Admit.REJECT
        tree, blocks, on_gpu = self.tree, self.tree.blocks, Tier.GPU
        hits = 0
        while hits < len(ids) and (b := blocks.get(ids[hits])) is not None and b.tier == on_gpu:
            hits += 1
        early = self.off_gpu.continuation(req, ids, hits)
        if early is not None:
            return early
        chain = [tree.blocks[h] for h in ids[:hits]]
        for b in chain:  # pinned first, so making room cannot evict the prefix being reused
            tree.pin(b)
        room = tokens + self.prompt_room  # the engine's KV room beyond the prompt
        private = self.blocks_for(max(0, room - hash_tokens))
        need = (len(ids) - hits) * self.hash_bytes + private * self.block_bytes[0]
        if not self._make_room(need):
            for b in chain:
                tree.unpin(b)
            return Admit.BLOCKED_HIT if hits else Admit.BLOCKED
        self.pool.allocate(need)
        self._insert(chain, ids[hits:], req)
        self.running[req.session_id] = _Running(chain, self.blocks_for(room), private, hash_tokens)
        self.cpu_tier.release_held(req)
        req.prefill_tokens = max(1, tokens - min(hits * self.hash_tokens, tokens))
        if req.admitted_us < 0:  # its first admission
            req.prefix_hit_tokens = tokens - req.prefill_tokens  # the engine keeps one to compute
            self._count_lookup(req, ids, hits)
        self._enforce_cap()
        return Admit.READY

    def _make_room(self, need_bytes: int) -> bool:
        idle = not self.running and self.pool.in_flight_bytes == 0
        target = self.room.target(need_bytes, idle, self.evictable_bytes)
        if self.pool.free_bytes >= target:
            return True
        pending = self.transfers.pending_free_bytes
        short = self.room.shortfall(target, pending, self.evictable_bytes())
        if short > 0:
            self.evict(short, allow_offload=True)
        return self.pool.free_bytes >= target

    def abandon(self, req: Request) -> None:
        """A queued request gave up: unpin the blocks its reload was holding for it."""
        self.cpu_tier.release_held(req)

    def _insert(self, chain: list[HashBlock], new_ids: list[int], req: Request) -> None:
        group = req.group_id
        parent = chain[-1] if chain else None
        now, priority, entries, add = (
            int(self.env.now),
            req.priority,
            self.hash_entries,
            self.tree.add,
        )
        for h in new_ids:
            entry = entries.get(h)
            if entry is None:
                entry = CacheEntry(
                    entry_id=self._next_entry_id,
                    session_id=group,
                    model_index=0,
                    class_index=0,
                    priority=priority,
                    num_tokens=self.hash_tokens,
                    num_bytes=self.hash_bytes,
                    created_us=now,
                    last_used_us=now,
                    recompute_us=self._block_recompute_us(len(chain)),
                )
                self._next_entry_id += 1
                entries[h] = entry
            else:  # cached again after eviction: the same entry, used now
                entry.session_id, entry.priority, entry.last_used_us = group, priority, now
            b = HashBlock(h, parent, entry)
            add(b)
            chain.append(b)
            parent = b

    def _count_lookup(self, req: Request, ids: list[int], hits: int) -> None:
        st = self.stats
        st.lookup_blocks += len(ids)
        st.hit_blocks += hits
        st.input_tokens += req.prompt_tokens
        st.hit_tokens += min(hits * self.hash_tokens, req.prompt_tokens)
        restored = [j for j in range(hits, len(ids)) if ids[j] in self.seen]
        self.seen.update(ids[hits:])
        now = int(self.env.now)
        if hits and req.kv_source != KvSource.RELOAD:
            req.kv_source = KvSource.HIT
            st.hits += 1
            self.events.hit(now, req, hits)
        if restored:
            cost = sum(self._block_recompute_us(j) for j in restored)
            req.recompute_us_paid = cost
            st.recomputes += 1
            st.realized_recompute_us += cost
            if not hits:
                req.kv_source = KvSource.RECOMPUTE
            self.events.recompute(now, req, cost, len(restored))

    # -- eviction: idle chain tails, smallest policy key first ---------------------------------
    def evict(self, bytes_needed: int, allow_offload: bool) -> int:
        """Evict idle chain tails chosen by the policy until `bytes_needed` are (being) freed."""
        num_blocks = -(-bytes_needed // self.hash_bytes) if bytes_needed > 0 else 0
        return self._evict_blocks(num_blocks, allow_offload) * self.hash_bytes

    def _evict_blocks(self, num_blocks: int, allow_offload: bool = True) -> int:
        """Evict up to num_blocks tails of the idle prefix forest, picked by the policy; returns how
        many (fewer when nothing else is idle). A decision that frees less than asked (a policy may
        stop short) is repeated on what is left."""
        now, done, tree = int(self.env.now), 0, self.tree
        offloaded: list[HashBlock] = []
        while done < num_blocks and tree.evictable:
            cut = self._choose(num_blocks - done, now, allow_offload)
            if not cut:
                break
            for b in cut:
                self.policy.on_evict(b.entry, now)
            if self.writes_evicted:  # the shared tier may hold each one for its write
                for b in cut:
                    tree.evictable.pop(b.hash_id, None)
                    if not self.off_gpu.write_evicted(b, allow_offload, self._dispose):
                        self._dispose(b, now, allow_offload)
            else:
                self.cpu_tier.dispose(cut, now, allow_offload and self.offload_enabled, offloaded)
            done += len(cut)
            for b in cut:  # what the cut leaves idle and childless is a tail now
                tree.expose_parent(b)
        if offloaded:  # nothing above schedules an event: the copies start as if one by one
            self.cpu_tier.start_copies(offloaded)
        return done

    def _dispose(self, b: HashBlock, now: int, allow_offload: bool) -> None:
        """Dispose of one evicted tail, its copy started now: the shared tier's writes on eviction
        schedule events between tails (a held tail goes when its write lands), so one by one."""
        offloaded: list[HashBlock] = []
        self.cpu_tier.dispose([b], now, allow_offload and self.offload_enabled, offloaded)
        if offloaded:
            self.cpu_tier.start_copies(offloaded)

    def _choose(self, num_blocks: int, now: int, allow_offload: bool) -> list[HashBlock]:
        """One decision: the tails to cut, in order. A policy ranking each block alone picks from
        the tail index; one that needs the chains (the oracle) sees the whole candidate forest."""
        if self.tails.enabled:
            return self.tails.select(
                num_blocks, now, lambda b: self._prepare(b, now, allow_offload), allow_offload
            )
        forest = self.tree.forest()
        entries = [self._prepare(b, now, allow_offload) for b in forest.blocks]
        victims = self.policy.select_victims(
            entries, num_blocks * self.hash_bytes, now, forest.chains, forest.parents
        )
        return forest.cut_order(victims, self.policy.name)

    def _prepare(self, b: HashBlock, now: int, allow_offload: bool) -> CacheEntry:
        """Fill in the block's entry for a decision: restore cost and its group's gap EMA."""
        e = b.entry
        s = self.group_entries.get(e.session_id)
        e.gap_ema_us = s.gap_ema_us if s is not None else -1.0
        e.restore_us = e.recompute_us
        if allow_offload and self.offload_enabled and self.cpu.can_take(self.cpu_hash_bytes):
            e.restore_us = self.cpu.restore_us(
                self.reload_block_us,
                e.recompute_us,
                self.estimator.gap_us(e, now),
                self.estimator.delta_us,
            )
        return e

    def _enforce_cap(self) -> None:
        n = self.tree.num_gpu_blocks
        if self.max_blocks and n > self.max_blocks:
            self.stats.cap_evictions += self._evict_blocks(n - self.max_blocks)

    def maintain_watermark(self) -> None:
        """After an iteration: evict idle tails so that the watermark is free again soon."""
        short = self.room.watermark_shortfall(self.transfers.pending_free_bytes)
        if short > 0 and self.tree.evictable:
            self.evict(short, allow_offload=True)

    # -- running requests ----------------------------------------------------------------------
    def grow(self, session_ids: list[int], num_blocks: list[int]) -> bool:
        """More pages for running requests (all or nothing); pages inside hash blocks are free."""
        extra: list[int] = []
        for sid, n in zip(session_ids, num_blocks, strict=True):
            r = self.running[sid]
            want = self.blocks_for(max(0, (r.pages + n) * self.block_tokens - r.hash_tokens))
            extra.append(max(0, want - r.private_pages))
        num_bytes = sum(extra) * self.block_bytes[0]
        if self.pool.free_bytes < num_bytes:
            self.evict(num_bytes - self.pool.free_bytes, allow_offload=False)
        if self.pool.free_bytes < num_bytes:
            return False
        self.pool.allocate(num_bytes)
        for sid, n, x in zip(session_ids, num_blocks, extra, strict=True):
            r = self.running[sid]
            r.pages += n
            r.private_pages += x
        return True

    def finish(self, req: Request, num_tokens: int) -> None:
        """The request ended: private pages are freed, its blocks stay cached and idle."""
        r = self.running.pop(req.session_id)
        self.pool.release(r.private_pages * self.block_bytes[0])
        now = int(self.env.now)
        for b in r.chain:
            b.computed = True
            b.entry.last_used_us = now
            b.entry.session_id = req.group_id
            b.entry.num_uses += 1
            self.tree.unpin(b)
            if b.refcount == 0:  # idle now: a reuse gap starts
                self.policy.on_release(b.entry, now)
        self.off_gpu.write_through(req, r.chain)
        self._enforce_cap()

    def preempt(self, req: Request, num_tokens: int, swapped: bool = False) -> None:
        """Private pages and unfinished blocks go; recomputed on resume unless `swapped`."""
        r = self.running.pop(req.session_id)
        self.pool.release(r.private_pages * self.block_bytes[0])
        kept = 0
        now = int(self.env.now)
        for depth in range(len(r.chain) - 1, -1, -1):  # deepest first: a chain loses its tail
            b = r.chain[depth]
            b.computed = b.computed or (depth + 1) * self.hash_tokens <= num_tokens
            if b.computed:  # used until now, like the blocks of a finished request
                b.entry.last_used_us = now
            self.tree.unpin(b)
            if not b.computed and b.refcount == 0 and b.num_children == 0:
                self.tree.remove_gpu(b)
                self.pool.release(self.hash_bytes)
            elif b.computed:
                kept = max(kept, (depth + 1) * self.hash_tokens)
                if b.refcount == 0:  # idle now: a reuse gap starts
                    self.policy.on_release(b.entry, now)
        done = recompute_us(self.fit, min(kept, num_tokens))
        cost = 0.0 if swapped else recompute_us(self.fit, num_tokens) - done
        self.stats.preemptions += 1
        self.stats.preempt_recompute_us += cost
        self.events.preempt(int(self.env.now), req, r.pages, 0, cost)
        req.num_preemptions += 1
        self._enforce_cap()  # its blocks may be idle now: the cap applies to them again

    def metrics(self) -> dict[str, float | int]:
        """Prefix-sharing metrics: hit ratios, cached, CPU and reloaded blocks."""
        st = self.stats
        tree = self.tree
        return {
            "prefix_hit_ratio": st.hit_blocks / st.lookup_blocks if st.lookup_blocks else 0.0,
            "prefix_hit_token_ratio": st.hit_tokens / st.input_tokens if st.input_tokens else 0.0,
            "prefix_lookup_blocks": st.lookup_blocks,
            "prefix_hit_blocks": st.hit_blocks,
            "prefix_cached_blocks": tree.num_gpu_blocks,
            "prefix_cap_evictions": st.cap_evictions,
            "prefix_cpu_blocks": len(tree.blocks) - tree.num_gpu_blocks,
            "prefix_reload_blocks": st.reload_blocks,
        }
