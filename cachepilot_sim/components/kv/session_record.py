"""The session manager's record of one session's KV (`session.py`): its tier, blocks and the
request parked on a copy in flight."""

from __future__ import annotations

from cachepilot_sim.components.kv.protocol import Tier
from cachepilot_sim.components.request import Request
from cachepilot_sim.policies import CacheEntry


class SessionKV:
    """The manager's record of one session's KV."""

    __slots__ = (
        "entry",
        "tier",
        "num_blocks",
        "block_bytes",
        "cpu_block_bytes",
        "active",
        "waiting",
        "cpu_seq",
        "cpu_since_us",
        "closed",
    )

    def __init__(self, entry: CacheEntry, block_bytes: int, cpu_block_bytes: int) -> None:
        self.entry = entry
        self.tier = Tier.NONE
        self.num_blocks = 0
        self.block_bytes = block_bytes
        self.cpu_block_bytes = cpu_block_bytes
        self.active = False  # attached to a running request (never evictable then)
        self.waiting: Request | None = None  # request parked until an in-flight copy lands
        self.cpu_seq = -1  # order of arrival in the CPU store (its drop order)
        self.cpu_since_us = 0
        self.closed = False  # the session sends no more turns (`close_session`)

    @property
    def num_bytes(self) -> int:
        """GPU bytes of the session's blocks."""
        return self.num_blocks * self.block_bytes

    @property
    def cpu_bytes(self) -> int:
        """Bytes the KV takes in the CPU store and on the wire."""
        return self.num_blocks * self.cpu_block_bytes
