"""LRU: the session whose KV was used least recently is evicted first (vLLM's default order)."""

from __future__ import annotations

from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register


@register("lru")
class LruPolicy(RankingPolicy):
    name = "lru"
    key_scope = KeyScope.ENTRY

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (entry.last_used_us, entry.entry_id)
