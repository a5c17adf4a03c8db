"""Static priority: the lowest workload-class priority is evicted first, LRU within a priority."""

from __future__ import annotations

from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register


@register("priority")
class PriorityPolicy(RankingPolicy):
    name = "priority"
    key_scope = KeyScope.ENTRY

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (entry.priority, entry.last_used_us, entry.entry_id)
