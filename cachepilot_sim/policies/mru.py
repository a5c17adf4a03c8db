"""MRU: the most recently released KV is evicted first.

transformers' continuous batching (5.17) keeps freed, complete blocks in an insertion-ordered dict
and, when fresh blocks run out, reuses them with `dict.popitem()`: the block freed last goes first
(`BlockManager.has_enough_free_blocks`). The `engine=hf_cb` profile picks this policy so that a
multi-turn conversation loses its parent's blocks as that engine does.
"""

from __future__ import annotations

from cachepilot_sim.policies.base import CacheEntry, KeyScope, RankingPolicy, register


@register("mru")
class MruPolicy(RankingPolicy):
    name = "mru"
    # The key reads the entry's last use and id: set when it goes idle, fixed while it is idle.
    key_scope = KeyScope.ENTRY

    def key(self, entry: CacheEntry, now_us: int) -> tuple[float | int, ...]:
        return (-entry.last_used_us, -entry.entry_id)
