"""The room rule: how many free bytes an admission must see before it runs.

New prefills leave `kv.watermark_fraction` of the pool free for the decode growth of running
requests. The watermark is waived when it can never be met (need + watermark exceeds the pool) and
when it would block the only possible progress: nothing runs, nothing is in flight, and even
evicting every idle byte would not reach it. Then no request could ever grow into the watermark and
no event would ever free memory, so holding it back would stall the engine for good.

With `engine.atomic_admission` an admission that could not reach its target even by evicting
every idle byte evicts nothing (transformers and vLLM check that an allocation will succeed before
they reclaim cached blocks); otherwise eviction starts for a request that still has to wait.
"""

from __future__ import annotations

from collections.abc import Callable

from cachepilot_sim.components.vram_pool import VramPool


class RoomRule:
    """need + watermark -> target, and the one place that decides when the watermark is waived."""

    __slots__ = ("atomic", "pool", "watermark_bytes")

    def __init__(self, pool: VramPool, watermark_fraction: float, atomic: bool = False) -> None:
        self.pool = pool
        self.watermark_bytes = int(watermark_fraction * pool.capacity_bytes)
        self.atomic = atomic

    def target(self, need_bytes: int, engine_idle: bool, evictable: Callable[[], int]) -> int:
        """Free bytes to reach before admitting a request that needs `need_bytes`.

        `engine_idle`: nothing runs and no copy is in flight. `evictable()` (called only then):
        idle bytes that eviction may free for this request.
        """
        target = need_bytes + self.watermark_bytes
        if target > self.pool.capacity_bytes:
            return need_bytes
        if engine_idle and target > self.pool.free_bytes + evictable():
            return need_bytes
        return target

    def shortfall(self, target_bytes: int, pending_free_bytes: int, evictable_bytes: int) -> int:
        """Bytes still to evict for `target_bytes` free, counting offloads that will land; 0 when
        admission is atomic and even `evictable_bytes` more would not be enough."""
        short = target_bytes - self.pool.free_bytes - pending_free_bytes
        return 0 if self.atomic and short > evictable_bytes else short

    def watermark_shortfall(self, pending_free_bytes: int) -> int:
        """Bytes to evict after an iteration so that the watermark is free again soon."""
        return self.watermark_bytes - self.pool.free_bytes - pending_free_bytes
