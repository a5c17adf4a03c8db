"""Prefix-sharing KV manager for trace replay: reference-counted hash blocks, suffix-first eviction.

A request's input is a chain of prefix blocks named by hash (Mooncake `hash_ids`, 512 tokens
each); equal hashes are one cached object. A request reuses the leading blocks of its chain that are
cached and computes the rest; when it ends, its blocks stay cached (idle, reference count 0).
Evicting block j makes every later block of the chain useless, so only a chain's tail is
evictable: a block is a candidate when nothing references it and no block on the GPU extends it.
Evicting it exposes its parent. A decision shows the policy every idle block whose GPU subtree is
idle, as chains cut at branch points (`CandidateForest`); it may cut only tails, and a branch only
after the chains below it. The restore cost of a block is the recompute of its tokens at its
position in the chain. Tokens not covered by hash blocks (output, traces without hashes) sit in
private pages freed at the end. This manager drops evicted blocks; `prefix_offload.py` adds the
CPU tier (used when kv.offload_enabled).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepilot_sim.clock import SimEnvironment
from cachepilot_sim.components.kv_manager import Admit, KvManager, KvStats, SessionKV, Tier
from cachepilot_sim.components.pcie_link import PcieLink
from cachepilot_sim.components.request import KvSource, Request
from cachepilot_sim.components.vram_pool import VramPool
from cachepilot_sim.config import SimConfig
from cachepilot_sim.cost import ComputeFit, recompute_us
from cachepilot_sim.policies import CacheEntry, EvictionPolicy, GapEstimator
from cachepilot_sim.policies.knapsack import CoverProblem
from cachepilot_sim.trace.recorder import TraceRecorder
from cachepilot_sim.workloads.replay import ReplayWorkload


class HashBlock:
    """One cached prefix block: a node of the prefix tree."""

    __slots__ = ("hash_id", "parent", "children", "num_children", "refcount", "entry",
                 "computed", "tier")

    def __init__(self, hash_id: int, parent: HashBlock | None, entry: CacheEntry) -> None:
        self.hash_id = hash_id
        self.parent = parent
        self.children: dict[int, HashBlock] = {}  # cached blocks that extend this one
        self.num_children = 0  # of those, the ones on the GPU or coming back to it
        self.refcount = 0  # running (or reloading) requests using it
        self.entry = entry
        self.computed = False  # some request finished computing it
        self.tier = Tier.GPU  # CPU tiers only with offload (components/prefix_offload.py)


@dataclass
class PrefixStats(KvStats):
    """KvStats plus prefix lookups, counted once per request at its first admission."""

    lookup_blocks: int = 0
    hit_blocks: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    cap_evictions: int = 0  # blocks evicted to respect replay.prefix_cache_max_blocks
    reload_blocks: int = 0  # blocks brought back from the CPU store (offload only)


class _Running:
    __slots__ = ("chain", "pages", "private_pages", "hash_tokens")

    def __init__(self, chain: list[HashBlock], pages: int, private_pages: int,
                 hash_tokens: int) -> None:
        self.chain = chain
        self.pages = pages  # pages as the batcher counts them
        self.private_pages = private_pages  # pages held beyond the hash blocks
        self.hash_tokens = hash_tokens


class CandidateForest:
    """A decision's candidates: blocks, chains of their positions (root first) and, per chain,
    the chain whose tail is its root's parent (-1: none), as `select_victims` takes them."""

    def __init__(self) -> None:
        self.blocks: list[HashBlock] = []
        self.chains: list[list[int]] = []
        self.parents: list[int] = []
        self.kids: list[list[int]] = []

    def add(self, run: list[HashBlock], kids: list[int]) -> int:
        g = len(self.chains)
        self.chains.append(list(range(len(self.blocks), len(self.blocks) + len(run))))
        self.blocks.extend(run)
        self.parents.append(-1)
        self.kids.append(kids)
        for h in kids:
            self.parents[h] = g
        return g

    def cut_order(self, victims: list[CacheEntry], policy_name: str) -> list[HashBlock]:
        """The victims in the policy's order, each chain cut from its end after the chains below
        it; a selection that is not a tail of the forest breaks the policy contract and raises."""
        index = {b.entry.entry_id: i for i, b in enumerate(self.blocks)}
        chosen = [index[v.entry_id] for v in victims]
        problem = CoverProblem.of([1] * len(self.blocks), [0.0] * len(self.blocks), 0,
                                  self.chains, self.parents)
        if len(set(chosen)) != len(chosen) or not problem.is_feasible_set(chosen):
            raise ValueError(f"policy {policy_name!r} cut blocks that are not tails")
        chain_of = {i: g for g, c in enumerate(self.chains) for i in c}
        end = [len(c) for c in self.chains]  # items still on the GPU per chain
        cut: list[HashBlock] = []

        def cut_to(g: int, pos: int) -> None:
            if end[g] > pos and end[g] == len(self.chains[g]):
                for h in self.kids[g]:  # the chains below go first, whole
                    cut_to(h, 0)
            while end[g] > pos:
                end[g] -= 1
                cut.append(self.blocks[self.chains[g][end[g]]])

        for i in chosen:
            g = chain_of[i]
            cut_to(g, self.chains[g].index(i))
        return cut


class PrefixKvManager(KvManager):
    """KvManager's interface for the batcher; KV is shared by prefix hash instead of session."""

    def __init__(
        self, env: SimEnvironment, cfg: SimConfig, pool: VramPool, link: PcieLink,
        policy: EvictionPolicy, estimator: GapEstimator, fit: ComputeFit, recorder: TraceRecorder,
        workload: ReplayWorkload,
    ) -> None:
        super().__init__(env, cfg, pool, link, policy, estimator, fit, recorder)
        self.workload = workload
        self.hash_tokens = cfg.replay.hash_block_tokens
        self.hash_bytes = self.block_bytes[0] // self.block_tokens * self.hash_tokens
        self.max_blocks = cfg.replay.prefix_cache_max_blocks
        self.max_context = cfg.model.max_context_tokens
        self.stats: PrefixStats = PrefixStats()
        self.blocks: dict[int, HashBlock] = {}  # every cached block, on any tier
        self.num_gpu_blocks = 0  # blocks on the GPU or in flight to it
        self.evictable: dict[int, HashBlock] = {}  # idle tails: refcount 0, no cached child
        self.running: dict[int, _Running] = {}
        self.seen: set[int] = set()  # hash ids ever cached: a miss on one is a paid restore
        self.session_entries: dict[int, CacheEntry] = {}  # per inferred session: its gap EMA
        # One policy entry per hash, kept after eviction: a returning block is the same entry to
        # the policy (its uses, its ghost-list record), as a returning session is.
        self.hash_entries: dict[int, CacheEntry] = {}
        self.finish_us = np.full(workload.num_requests, -1, dtype=np.int64)

    # -- arrivals: inferred sessions feed the reuse estimator ---------------------------------
    def _session_entry(self, session: int) -> CacheEntry:
        e = self.session_entries.get(session)
        if e is None:
            now = int(self.env.now)
            e = CacheEntry(self._next_entry_id, session, 0, 0, 0, 0, 0, now, now)
            self._next_entry_id += 1
            self.session_entries[session] = e
        return e

    def on_arrival(self, req: Request) -> None:
        """A continuation's gap since its parent finished is one idle-gap observation; every
        block of its chain that was ever cached is accessed (a hit, or a miss after eviction)."""
        sessions = self.workload.sessions
        now = int(self.env.now)
        parent = int(sessions.parent[req.req_id])
        if parent >= 0 and self.finish_us[parent] >= 0:
            e = self._session_entry(int(sessions.session[req.req_id]))
            self.estimator.observe(e, now - int(self.finish_us[parent]))
        for h in self.workload.table.hash_ids(req.req_id).tolist():
            entry = self.hash_entries.get(h)
            if entry is not None:
                self.policy.on_access(entry, now)

    # -- admission ---------------------------------------------------------------------------
    def _block_recompute_us(self, depth: int) -> float:
        return (recompute_us(self.fit, (depth + 1) * self.hash_tokens)
                - recompute_us(self.fit, depth * self.hash_tokens))

    def _pin(self, b: HashBlock) -> None:
        b.refcount += 1
        self.evictable.pop(b.hash_id, None)

    def admit(self, req: Request) -> Admit:
        """Reuse the cached leading blocks, allocate the rest plus private pages."""
        ids = self.workload.table.hash_ids(req.req_id).tolist()
        tokens = req.prompt_tokens + (req.generated if req.num_preemptions else 0)
        final_tokens = req.prompt_tokens + req.output_tokens
        hash_tokens = len(ids) * self.hash_tokens
        final_private = self.blocks_for(max(0, final_tokens - hash_tokens))
        total_bytes = len(ids) * self.hash_bytes + final_private * self.block_bytes[0]
        if total_bytes > self.pool.capacity_bytes or final_tokens > self.max_context:
            return Admit.REJECT
        hits = 0
        while hits < len(ids) and self._on_gpu(ids[hits]):
            hits += 1
        early = self._admit_from_cpu(req, ids, hits)
        if early is not None:
            return early
        chain = [self.blocks[h] for h in ids[:hits]]
        for b in chain:  # pinned first, so making room cannot evict the prefix being reused
            self._pin(b)
        private = self.blocks_for(max(0, tokens - hash_tokens))
        need = (len(ids) - hits) * self.hash_bytes + private * self.block_bytes[0]
        if not self._make_room(need, exclude=None):
            for b in chain:
                self._unpin(b)
            return Admit.BLOCKED
        self.pool.allocate(need)
        self._insert(chain, ids[hits:], req)
        self.running[req.session_id] = _Running(chain, self.blocks_for(tokens), private,
                                                hash_tokens)
        self._release_held(req)
        req.prefill_tokens = max(1, tokens - min(hits * self.hash_tokens, tokens))
        if req.num_preemptions == 0:
            self._count_lookup(req, ids, hits)
        self._enforce_cap()
        return Admit.READY

    def _on_gpu(self, hash_id: int) -> bool:
        b = self.blocks.get(hash_id)
        return b is not None and b.tier == Tier.GPU

    def _admit_from_cpu(self, req: Request, ids: list[int], hits: int) -> Admit | None:
        """Hook: the offloading manager reloads a CPU-resident continuation of the hits here."""
        return None

    def _release_held(self, req: Request) -> None:
        """Hook: pins a reload held for `req` until its admission are let go."""

    def abandon(self, req: Request) -> None:
        """A queued request gave up: unpin the blocks its reload was holding for it."""
        self._release_held(req)

    def _insert(self, chain: list[HashBlock], new_ids: list[int], req: Request) -> None:
        session = int(self.workload.sessions.session[req.req_id])
        parent = chain[-1] if chain else None
        now = int(self.env.now)
        for h in new_ids:
            entry = self.hash_entries.get(h)
            if entry is None:
                entry = CacheEntry(
                    entry_id=self._next_entry_id, session_id=session, model_index=0,
                    class_index=0, priority=req.priority, num_tokens=self.hash_tokens,
                    num_bytes=self.hash_bytes, created_us=now, last_used_us=now,
                    recompute_us=self._block_recompute_us(len(chain)),
                )
                self._next_entry_id += 1
                self.hash_entries[h] = entry
            else:  # cached again after eviction: the same entry, used now
                entry.session_id, entry.priority, entry.last_used_us = session, req.priority, now
            b = HashBlock(h, parent, entry)
            b.refcount = 1
            if parent is not None:
                parent.num_children += 1
                parent.children[h] = b
            self.blocks[h] = b
            self.num_gpu_blocks += 1
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
        if hits and req.kv_source != KvSource.RELOAD:
            req.kv_source = KvSource.HIT
            st.hits += 1
            self.recorder.emit(int(self.env.now), "kv", "hit", req.session_id, req.req_id, 0, hits)
        if restored:
            cost = sum(self._block_recompute_us(j) for j in restored)
            req.recompute_us_paid = cost
            st.recomputes += 1
            st.realized_recompute_us += cost
            if not hits:
                req.kv_source = KvSource.RECOMPUTE
            self.recorder.emit(int(self.env.now), "kv", "recompute", req.session_id, req.req_id, 0,
                               len(restored), value=int(cost))

    # -- eviction: idle chain tails, smallest policy key first ---------------------------------
    def _unpin(self, b: HashBlock) -> None:
        b.refcount -= 1
        if b.refcount == 0 and b.num_children == 0:
            self.evictable[b.hash_id] = b

    def evict(self, bytes_needed: int, exclude: SessionKV | None, allow_offload: bool) -> int:
        """Evict idle chain tails chosen by the policy until `bytes_needed` are (being) freed."""
        num_blocks = -(-bytes_needed // self.hash_bytes) if bytes_needed > 0 else 0
        return self._evict_blocks(num_blocks, allow_offload) * self.hash_bytes

    def _evict_blocks(self, num_blocks: int, allow_offload: bool = True) -> int:
        """Evict up to num_blocks blocks: the policy picks tails of the idle prefix forest.

        Returns the number evicted (fewer when nothing else is idle). A decision that frees less
        than asked (a policy may stop short) is repeated on what is left.
        """
        now = int(self.env.now)
        done = 0
        while done < num_blocks and self.evictable:
            forest = self.candidate_forest()
            entries = [self._prepare(b, now) for b in forest.blocks]
            victims = self.policy.select_victims(entries, (num_blocks - done) * self.hash_bytes,
                                                 now, forest.chains, forest.parents)
            cut = forest.cut_order(victims, self.policy.name)
            if not cut:
                break
            for b in cut:
                self.policy.on_evict(b.entry, now)
            for b in cut:
                self.evictable.pop(b.hash_id, None)
                self._dispose(b, now, allow_offload)
                done += 1
            for b in cut:  # what the cut leaves idle and childless is a tail now
                p = b.parent
                if (p is not None and self.blocks.get(p.hash_id) is p and p.refcount == 0
                        and p.num_children == 0 and p.tier == Tier.GPU):
                    self.evictable[p.hash_id] = p
        return done

    def candidate_forest(self) -> CandidateForest:
        """Every idle GPU block whose GPU subtree is idle, as chains cut at branch points.

        A chain runs from an idle tail up through ancestors with one GPU child each; a block with
        several GPU children starts a chain above them once all of them are candidates.
        """
        forest = CandidateForest()
        done_children: dict[int, list[int]] = {}  # branch block -> its candidate child chains
        work = list(self.evictable.values())
        for tail in work:  # grows while branch blocks complete
            run = [tail]
            p = tail.parent
            while p is not None and p.refcount == 0 and p.num_children == 1 and p.tier == Tier.GPU:
                run.append(p)
                p = p.parent
            g = forest.add(run[::-1], done_children.pop(tail.hash_id, []))
            if p is not None and p.refcount == 0 and p.tier == Tier.GPU:
                kids = done_children.setdefault(p.hash_id, [])
                kids.append(g)
                if len(kids) == p.num_children:
                    work.append(p)
        return forest

    def _prepare(self, b: HashBlock, now: int) -> CacheEntry:
        """Fill in the block's entry for a decision: restore cost and its session's gap EMA."""
        e = b.entry
        e.restore_us = e.recompute_us
        s = self.session_entries.get(e.session_id)
        e.gap_ema_us = s.gap_ema_us if s is not None else -1.0
        return e

    def _dispose(self, b: HashBlock, now: int, allow_offload: bool) -> None:
        """An evicted tail: counted, then dropped (the offloading manager may copy it out)."""
        e = b.entry
        self.stats.expected_evict_cost_us += (self.estimator.resume_probability(e, now)
                                              * e.restore_us)
        self._drop_block(b, now)

    def _drop_block(self, b: HashBlock, now: int) -> None:
        e = b.entry
        self.stats.evictions_drop += 1
        self.stats.evicted_bytes_drop += self.hash_bytes
        self.recorder.emit(now, "kv", "evict_drop", e.session_id, -1, 0, 1, self.hash_bytes,
                           "none", float(self.policy.key(e, now)[0]))
        self._remove(b)

    def _remove(self, b: HashBlock) -> None:
        """Forget a GPU block with no cached children and free its bytes."""
        assert b.tier == Tier.GPU and not b.children
        del self.blocks[b.hash_id]
        if b.parent is not None:
            b.parent.num_children -= 1
            del b.parent.children[b.hash_id]
        self.pool.release(self.hash_bytes)
        self.num_gpu_blocks -= 1

    def _enforce_cap(self) -> None:
        if self.max_blocks and self.num_gpu_blocks > self.max_blocks:
            self.stats.cap_evictions += self._evict_blocks(self.num_gpu_blocks - self.max_blocks)

    def maintain_watermark(self) -> None:
        short = self.watermark_bytes - self.pool.free_bytes - self.pending_free_bytes
        if short > 0 and self.evictable:
            self.evict(short, exclude=None, allow_offload=True)

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
            self.evict(num_bytes - self.pool.free_bytes, exclude=None, allow_offload=False)
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
        session = int(self.workload.sessions.session[req.req_id])
        now = int(self.env.now)
        for b in r.chain:
            b.computed = True
            b.entry.last_used_us = now
            b.entry.session_id = session
            b.entry.num_uses += 1
            self._unpin(b)
            if b.refcount == 0:  # idle now: a reuse gap starts
                self.policy.on_release(b.entry, now)
        self.finish_us[req.req_id] = now
        self._enforce_cap()

    def preempt(self, req: Request, num_tokens: int) -> None:
        """Recompute preemption: private pages and blocks it had not finished computing go."""
        r = self.running.pop(req.session_id)
        self.pool.release(r.private_pages * self.block_bytes[0])
        kept = 0
        for depth in range(len(r.chain) - 1, -1, -1):  # deepest first: a chain loses its tail
            b = r.chain[depth]
            b.computed = b.computed or (depth + 1) * self.hash_tokens <= num_tokens
            self._unpin(b)
            if not b.computed and b.refcount == 0 and b.num_children == 0:
                self.evictable.pop(b.hash_id, None)
                self._remove(b)
            elif b.computed:
                kept = max(kept, (depth + 1) * self.hash_tokens)
        cost = recompute_us(self.fit, num_tokens) - recompute_us(self.fit, min(kept, num_tokens))
        self.stats.preemptions += 1
        self.stats.preempt_recompute_us += cost
        self.recorder.emit(int(self.env.now), "kv", "preempt", req.session_id, req.req_id, 0,
                           r.pages, 0, "none", value=int(cost))
        req.num_preemptions += 1
        self._enforce_cap()  # its blocks may be idle now: the cap applies to them again

    def prefix_metrics(self) -> dict[str, float | int]:
        st = self.stats
        return {
            "prefix_hit_ratio": st.hit_blocks / st.lookup_blocks if st.lookup_blocks else 0.0,
            "prefix_hit_token_ratio": st.hit_tokens / st.input_tokens if st.input_tokens else 0.0,
            "prefix_lookup_blocks": st.lookup_blocks, "prefix_hit_blocks": st.hit_blocks,
            "prefix_cached_blocks": self.num_gpu_blocks, "prefix_cap_evictions": st.cap_evictions,
            "prefix_cpu_blocks": len(self.blocks) - self.num_gpu_blocks,
            "prefix_reload_blocks": st.reload_blocks,
        }
