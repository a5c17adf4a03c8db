"""Our eviction policies inside transformers 5.17 continuous batching's prefix cache.

The engine's `BlockManager` keeps freed, complete (hashed) blocks in an insertion-ordered dict and,
when fresh blocks run out, reuses them with `dict.popitem()`: the block freed last goes first (our
`mru`). `PolicyHook.attach` wraps that manager's methods on the live object (nothing in
transformers is edited) so that the blocks to reuse are picked by a simulator `EvictionPolicy`,
with the simulator's own prefix-cache rules (`components/kv/prefix.py`, its candidate forest
and hooks): one cached block is one `CacheEntry` named by its hash,
its last use is when a request released it, its restore cost the recompute of its 256 tokens at
its depth, its group the request's session, and only a chain's tail may go (evicting an inner
block would leave the blocks after it cached but unreachable). The engine's own order is
`policy="none"`: nothing is rerouted, only counted.

What the hook does not drive: the CPU-swap victims (`OffloadingManager.offload_requests` picks
whole requests, newest starved first, by a fixed rule: not a cached-block choice) stay the
engine's. Counters per run (`stats()`, written to engine.json): lookups, hit and recomputed
prefix blocks (a block computed earlier in the run, looked up again and missed), evictions, inner
evictions (the engine's own order only: a block evicted while a cached block extends it) and the
host time the decisions took.
"""

from __future__ import annotations

import collections
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENGINE_ORDER = "none"  # the engine's own reuse order (nothing rerouted)
Group = Callable[[str], str]


def _import_simulator() -> None:
    """Make `cachepilot_sim` importable from this checkout (capture.py runs from its folder); a
    missing dependency (simpy on the lent GPUs) is one line saying what to install."""
    try:
        import cachepilot_sim  # noqa: F401
    except ModuleNotFoundError as err:
        root = str(Path(__file__).resolve().parents[2])
        if err.name != "cachepilot_sim" or root in sys.path:
            raise ImportError(
                f"the policy hook needs the simulator package and its dependency {err.name!r}, "
                "not installed here (docs/validation.md, 'Policy hook': carry its wheel)"
            ) from None
        sys.path.insert(0, root)
        _import_simulator()


class HookError(RuntimeError):
    """The engine's block state and the hook's mirror disagree (a bug, never a policy outcome)."""


class Clock:
    """Microseconds since the hook was made; strictly increasing across the engine thread's calls,
    so that release order is last-use order (the engine's popitem order is release order)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.last = -1

    def raw_us(self) -> int:
        return int((time.perf_counter() - self.t0) * 1e6)

    def tick(self) -> int:
        self.last = max(self.raw_us(), self.last + 1)
        return self.last


class Counters:
    """What one run's prefix cache did, the same in every mode (the engine's order included)."""

    def __init__(self) -> None:
        self.ever: set[int] = set()  # hashes registered during the run
        self.parent: dict[int, int | None] = {}  # registered hash -> parent hash
        self.num_children: collections.Counter[int] = collections.Counter()
        self.seen_requests: set[str] = set()
        self.values = dict.fromkeys(
            (
                "lookups",
                "lookup_blocks",
                "hit_blocks",
                "recomputed_blocks",
                "evictions",
                "decisions",
                "inner_evictions",
                "decision_us",
                "max_idle_blocks",
            ),
            0,
        )

    def registered(self, h: int, parent: int | None) -> None:
        self.ever.add(h)
        self.parent[h] = parent
        if parent is not None:
            self.num_children[parent] += 1

    def evicted(self, h: int) -> None:
        self.values["evictions"] += 1
        if self.num_children[h] > 0:
            self.values["inner_evictions"] += 1
        p = self.parent.pop(h, None)
        if p is not None:
            self.num_children[p] -= 1

    def lookup(self, request_id: str, hashes: list[int], num_hits: int) -> None:
        """A request's first lookup: its full prompt blocks and how many leading ones hit."""
        if request_id in self.seen_requests:
            return  # a soft-reset request looks up again: counted as its preemption's cost
        self.seen_requests.add(request_id)
        v = self.values
        v["lookups"] += 1
        v["lookup_blocks"] += len(hashes)
        v["hit_blocks"] += num_hits
        v["recomputed_blocks"] += sum(1 for h in hashes[num_hits:] if h in self.ever)


class Block:
    """One cached block as the mirror sees it: a node of the engine's prefix tree."""

    __slots__ = ("hash_id", "parent", "entry", "refcount", "children")

    def __init__(self, hash_id: int, parent: Block | None, entry: Any) -> None:
        self.hash_id = hash_id
        self.parent = parent
        self.entry = entry
        self.refcount = 1  # the request that computed it
        self.children: dict[int, Block] = {}  # cached blocks that extend this one


class Mirror:
    """The simulator's view of the engine's cached blocks, kept as the prefix manager keeps its own
    (`components/kv/prefix.py`): one `CacheEntry` per hash (kept after eviction), one per group
    for its gap EMA, and a decision on the candidate forest (`PrefixTree.forest`'s rule: every
    idle block whose cached subtree is idle, chains cut at branch points) through the policy's
    own `select_victims` (the forest path the prefix manager's tail indexes reproduce). Only
    `cachepilot_sim.policies`, `config` and `cost` are imported: the KV managers' package pulls
    in the trace writer (polars), which the lent GPUs lack."""

    def __init__(self, policy_name: str, block_tokens: int, block_bytes: int) -> None:
        _import_simulator()
        from cachepilot_sim.config.hardware import HardwareConfig
        from cachepilot_sim.config.policy import policy_config
        from cachepilot_sim.cost import compute_fit
        from cachepilot_sim.policies import GapEstimator, make_policy

        cfg = policy_config(policy_name)  # the registered defaults: what a replay with it reads
        self.estimator = GapEstimator(cfg.ema_weight, cfg.prior_gap_s * 1e6, cfg.delta_s * 1e6)
        self.policy = make_policy(cfg, self.estimator)
        self.fit = compute_fit(HardwareConfig())  # the package's H200 default, as the replay's
        self.block_tokens, self.block_bytes = block_tokens, block_bytes
        self.blocks: dict[int, Block] = {}  # hash -> cached block
        self.idle: dict[int, Block] = {}  # hash -> cached block nobody references
        self.entries: dict[int, Any] = {}  # hash -> CacheEntry, kept after eviction
        self.group_entries: dict[int, Any] = {}
        self.group_ids: dict[str, int] = {}
        self.group_finish_us: dict[int, int] = {}
        self.next_entry_id = 0
        self._costs: list[float] = []

    def group(self, name: str) -> int:
        return self.group_ids.setdefault(name, len(self.group_ids))

    def _entry(self, session: int, now: int, recompute: float) -> Any:
        from cachepilot_sim.policies import CacheEntry

        e = CacheEntry(
            self.next_entry_id, session, 0, 0, 0, self.block_tokens, self.block_bytes, now, now
        )
        e.recompute_us = recompute
        self.next_entry_id += 1
        return e

    def _group_entry(self, group: int, now: int) -> Any:
        e = self.group_entries.get(group)
        if e is None:
            e = self.group_entries[group] = self._entry(group, now, 0.0)
        return e

    def recompute_us(self, depth: int) -> float:
        """Recompute of the block at `depth` of a chain (µs), as the prefix manager prices it."""
        from cachepilot_sim.cost import recompute_us

        n = self.block_tokens
        while len(self._costs) <= depth:
            j = len(self._costs)
            self._costs.append(recompute_us(self.fit, (j + 1) * n) - recompute_us(self.fit, j * n))
        return self._costs[depth]

    def arrival(self, group: int, hashes: list[int], now: int) -> None:
        """`PrefixKvManager.on_arrival`: the gap since the group's last request ended trains its
        EMA; every block of the prompt that was ever cached is accessed."""
        last = self.group_finish_us.get(group)
        if last is not None:
            self.estimator.observe(self._group_entry(group, now), now - last)
        for h in hashes:
            entry = self.entries.get(h)
            if entry is not None:
                self.policy.on_access(entry, now)

    def registered(self, h: int, parent: int | None, depth: int, group: int, now: int) -> None:
        """A block was computed and hashed: cached, referenced once by its request."""
        entry = self.entries.get(h)
        if entry is None:
            entry = self.entries[h] = self._entry(group, now, self.recompute_us(depth))
        else:  # cached again after eviction: the same entry, used now
            entry.session_id, entry.last_used_us = group, now
        p = None if parent is None else self.blocks.get(parent)
        if parent is not None and p is None:
            raise HookError(f"block {h}: its parent {parent} is not cached")
        b = self.blocks[h] = Block(h, p, entry)
        if p is not None:
            p.children[h] = b

    def pinned(self, h: int) -> None:
        b = self.blocks.get(h)
        if b is None:
            raise HookError(f"block {h} referenced but not in the mirror")
        b.refcount += 1
        self.idle.pop(h, None)

    def released(self, h: int, group: int, now: int) -> None:
        """`PrefixKvManager.finish` for one block: used until now, idle when nobody holds it."""
        b = self.blocks.get(h)
        if b is None:
            raise HookError(f"block {h} released but not in the mirror")
        e = b.entry
        e.last_used_us, e.session_id = now, group
        e.num_uses += 1
        b.refcount -= 1
        if b.refcount == 0:
            self.idle[h] = b
            self.policy.on_release(e, now)

    def _prepare(self, b: Block) -> Any:
        e = b.entry
        s = self.group_entries.get(e.session_id)
        e.gap_ema_us = s.gap_ema_us if s is not None else -1.0
        e.restore_us = e.recompute_us  # no CPU tier for cached blocks in this engine
        return e

    def forest(self) -> tuple[list[Block], list[list[int]], list[int]]:
        """Candidates (every idle block whose cached subtree is idle), chains of their positions
        root first, each chain's parent chain (-1: none): `PrefixTree.forest`'s construction."""
        blocks: list[Block] = []
        chains: list[list[int]] = []
        parents: list[int] = []
        done_children: dict[int, list[int]] = {}
        work = [b for b in self.idle.values() if not b.children]
        for tail in work:  # grows while branch blocks complete
            run = [tail]
            p = tail.parent
            while p is not None and p.refcount == 0 and len(p.children) == 1:
                run.append(p)
                p = p.parent
            g = len(chains)
            chains.append(list(range(len(blocks), len(blocks) + len(run))))
            blocks.extend(reversed(run))
            parents.append(-1)
            for kid in done_children.pop(tail.hash_id, []):
                parents[kid] = g
            if p is not None and p.refcount == 0:
                kids = done_children.setdefault(p.hash_id, [])
                kids.append(g)
                if len(kids) == len(p.children):
                    work.append(p)
        return blocks, chains, parents

    def choose(self, num_blocks: int, now: int) -> list[int]:
        """One decision (`PrefixKvManager._choose`'s forest path): the hashes of the blocks to
        reuse, each a chain tail when it goes, removed from the mirror."""
        blocks, chains, parents = self.forest()
        entries = [self._prepare(b) for b in blocks]
        victims = self.policy.select_victims(
            entries, num_blocks * self.block_bytes, now, chains, parents
        )
        by_id = {b.entry.entry_id: b for b in blocks}
        cut: list[int] = []
        pending = [by_id[v.entry_id] for v in victims]
        while pending:  # the policy's order, each block once the blocks extending it are cut
            ready = next((b for b in pending if not b.children), None)
            if ready is None:
                raise HookError(f"policy {self.policy.name!r} cut blocks that are not tails")
            pending.remove(ready)
            self.policy.on_evict(ready.entry, now)
            del self.blocks[ready.hash_id]
            del self.idle[ready.hash_id]
            if ready.parent is not None:
                del ready.parent.children[ready.hash_id]
            cut.append(ready.hash_id)
        return cut


class PolicyHook:
    """One policy for every run of one engine; `attach` after each prefix-cache reset."""

    def __init__(self, policy: str, group_of: Group | None = None) -> None:
        self.policy = policy
        self.group_of: Group = group_of or (lambda rid: rid)
        self.clock = Clock()
        self.counters = Counters()
        self.mirror: Mirror | None = None
        self.arrivals: collections.deque[tuple[int, str, list[int]]] = collections.deque()
        self._group = ""  # the request whose blocks are being released or completed
        self._bm: Any = None
        if policy != ENGINE_ORDER:
            Mirror(policy, 1, 1)  # an unknown name fails here, before any engine is built

    def stats(self) -> dict[str, Any]:
        return {"policy": self.policy, **self.counters.values}

    def attach(self, mgr: Any) -> None:
        """Wrap the live block manager (and the cache's and manager's entry points) of `mgr`;
        every run starts from an empty mirror and a fresh policy, as a fresh simulation does."""
        cache = mgr.batch_processor.cache
        bm = cache._block_manager
        if getattr(bm, "_cp_policy_hook", None) is not None:
            raise HookError("this block manager is already hooked")
        bm._cp_policy_hook = self
        self._bm = bm
        self.counters = Counters()
        self.arrivals.clear()
        self.mirror = None
        if self.policy != ENGINE_ORDER:
            kv_token = cache.num_key_value_heads * cache.head_dim * cache.dtype.itemsize * 2
            kv_token *= len(cache.key_cache)
            self.mirror = Mirror(self.policy, bm.block_size, kv_token * bm.block_size)
        if not getattr(mgr, "_cp_hook_arrivals", False):
            _wrap_add_request(mgr, lambda: mgr._cp_policy_hook)
            mgr._cp_hook_arrivals = True
        mgr._cp_policy_hook = self
        if not getattr(cache, "_cp_hooked", False):
            _wrap_cache(cache)
            cache._cp_hooked = True
        _wrap_block_manager(bm, self)

    # -- engine-thread entry points ---------------------------------------------------------
    def drain(self) -> None:
        """Arrivals the client thread queued, applied in the engine thread in arrival order."""
        m = self.mirror
        while self.arrivals:
            t, rid, hashes = self.arrivals.popleft()
            if m is not None:
                m.arrival(m.group(self.group_of(rid)), hashes, t)

    def prompt_hashes(self, prompt: list[int]) -> list[int]:
        """The engine's hashes of a prompt's full blocks (`search_prefix_match`'s chain)."""
        bm, n, out, h = self._bm, self._bm.block_size, [], None
        for b in range(len(prompt) // n):
            h = bm.compute_hash(h, prompt[b * n : (b + 1) * n], 0)
            out.append(h)
        return out

    def group_id(self) -> int:
        assert self.mirror is not None
        return self.mirror.group(self.group_of(self._group))


def _wrap_add_request(mgr: Any, hook_of: Callable[[], PolicyHook]) -> None:
    orig = mgr.add_request

    def add_request(input_ids: list[int], request_id: str | None = None, **kw: Any) -> Any:
        hook = hook_of()
        if request_id is not None:  # queued for the engine thread (no engine state read here)
            hook.arrivals.append((hook.clock.raw_us(), request_id, hook.prompt_hashes(input_ids)))
        return orig(input_ids=input_ids, request_id=request_id, **kw)

    mgr.add_request = add_request


def _wrap_cache(cache: Any) -> None:
    """Who is releasing or completing blocks, and every first prefix lookup (the cache's block
    manager is replaced at each reset: the hook is read from it at each call)."""

    def hook() -> PolicyHook | None:
        return getattr(cache._block_manager, "_cp_policy_hook", None)

    orig_free, orig_mark, orig_search = (
        cache.free_blocks,
        cache.mark_shareable_blocks_as_complete,
        cache.search_prefix_match,
    )

    def free_blocks(request_id: str) -> None:
        h = hook()
        if h is None:
            return orig_free(request_id)
        h.drain()
        h._group = request_id
        orig_free(request_id)
        if h.mirror is not None:
            h.mirror.group_finish_us[h.group_id()] = h.clock.tick()

    def mark_shareable_blocks_as_complete(state: Any, num_complete_blocks: int) -> None:
        h = hook()
        if h is not None:
            h._group = state.request_id
        return orig_mark(state, num_complete_blocks)

    def search_prefix_match(request_id: str, prompt_ids: list[int]) -> int:
        h = hook()
        if h is None:
            return orig_search(request_id, prompt_ids)
        h.drain()
        hit = orig_search(request_id, prompt_ids)
        h.counters.lookup(request_id, h.prompt_hashes(prompt_ids), hit // cache.block_size)
        return hit

    cache.free_blocks = free_blocks
    cache.mark_shareable_blocks_as_complete = mark_shareable_blocks_as_complete
    cache.search_prefix_match = search_prefix_match


def _wrap_block_manager(bm: Any, hook: PolicyHook) -> None:
    """Mirror every reference change and registration; reroute the reuse of cached blocks."""
    orig_inc, orig_dec = bm.increase_ref_count, bm.decrease_ref_count
    orig_mark, orig_enough = bm.mark_shareable_blocks_as_complete, bm.has_enough_free_blocks
    blocks, counters = bm._id_to_block, hook.counters

    def increase_ref_count(block_id: int) -> None:
        orig_inc(block_id)
        if hook.mirror is not None:
            hook.mirror.pinned(blocks[block_id].hash)

    def decrease_ref_count(block_id: int) -> None:
        block = blocks[block_id]
        complete, h = block.is_complete, block.hash
        orig_dec(block_id)
        if complete and hook.mirror is not None:
            hook.mirror.released(h, hook.group_id(), hook.clock.tick())

    def mark_shareable_blocks_as_complete(
        num_complete_blocks: int, allocated_blocks: list[int], prompt_ids: list[int]
    ) -> None:
        first = len(allocated_blocks)
        while first > 0 and not blocks[allocated_blocks[first - 1]].is_complete:
            first -= 1
        orig_mark(num_complete_blocks, allocated_blocks, prompt_ids)
        for i in range(first, len(allocated_blocks)):
            block = blocks.get(allocated_blocks[i])
            if block is None or not block.is_complete:
                break
            h = block.hash
            if bm._hash_to_id.get(h) != block.id or h in counters.parent:
                continue  # a duplicate: the existing block was referenced instead
            parent = blocks[allocated_blocks[i - 1]].hash if i > 0 else None
            counters.registered(h, parent)
            if hook.mirror is not None:
                hook.mirror.registered(h, parent, i, hook.group_id(), hook.clock.tick())

    def has_enough_free_blocks(n_blocks: int) -> bool:
        hook.drain()
        k = n_blocks - len(bm._uninit_block_ids)
        if k <= 0 or len(bm._init_block_ids) < k:
            return orig_enough(n_blocks)
        v = counters.values
        v["max_idle_blocks"] = max(v["max_idle_blocks"], len(bm._init_block_ids))
        t = time.perf_counter()
        if hook.mirror is None:  # the engine's popitem order, observed
            order = itertools.islice(reversed(bm._init_block_ids), k)
            victims = [blocks[b].hash for b in order]
            ok = orig_enough(n_blocks)
        else:
            if len(hook.mirror.idle) != len(bm._init_block_ids):
                raise HookError(
                    f"{len(hook.mirror.idle)} idle blocks in the mirror, "
                    f"{len(bm._init_block_ids)} in the engine"
                )
            victims = hook.mirror.choose(k, hook.clock.tick())
            if len(victims) < k:
                raise HookError(f"policy {hook.policy!r} freed {len(victims)} of {k} blocks")
            for h in victims:
                block_id = bm._hash_to_id.pop(h)
                del bm._init_block_ids[block_id]
                bm._uninit_block_ids.append(block_id)
            ok = True
        for h in victims:
            counters.evicted(h)
        v["decisions"] += 1
        v["decision_us"] += int((time.perf_counter() - t) * 1e6)
        return ok

    bm.increase_ref_count = increase_ref_count
    bm.decrease_ref_count = decrease_ref_count
    bm.mark_shareable_blocks_as_complete = mark_shareable_blocks_as_complete
    bm.has_enough_free_blocks = has_enough_free_blocks
