"""The engine's pinned CPU swap pool (transformers 5.17 `OffloadingManager`, `cpu_offload_space`).

A preempted request whose blocks fit in the free swap blocks is copied out (GPU -> CPU) instead of
soft reset; it waits in the queue holding its CPU blocks and is copied back when it is scheduled
again, re-processing only what it had not cached (one token for a decoding request). A victim
that does not fit is soft reset (re-prefilled from scratch): `_offload_to_cpu` takes victims
while `len(blocks) <= free pool blocks`, first fit. Both copies are enqueued on the compute stream
(`_stream_ctx`), non-blocking for the host, so the next forward pass waits for them: here a
stall added to the next step. The pool is static: nothing is allocated while serving.
"""

from __future__ import annotations

from cachepilot_sim.components.pcie_link import PcieLink


class CpuSwapSpace:
    """Free and held swap blocks; the copies go over the PCIe link, on the compute stream."""

    def __init__(self, link: PcieLink, capacity_blocks: int) -> None:
        self.link = link
        self.capacity_blocks = capacity_blocks
        self.free_blocks = capacity_blocks
        # request id -> (blocks, bytes, tokens cached) it holds here; only looked up, never
        # iterated in order
        self._held: dict[int, tuple[int, int, int]] = {}

    def swap_out(self, req_id: int, num_blocks: int, num_bytes: int, num_tokens: int) -> int | None:
        """Copy a victim's `num_blocks` (`num_bytes`, holding `num_tokens` tokens of KV) out if
        they fit: the time the next step waits for the copy (µs); None when they do not fit (the
        engine soft resets it)."""
        if num_blocks <= 0 or num_blocks > self.free_blocks:
            return None
        assert req_id not in self._held, "a request in the swap space was preempted again"
        self.free_blocks -= num_blocks
        self._held[req_id] = (num_blocks, num_bytes, num_tokens)
        return self.link.copy_on_stream("d2h", num_bytes)

    def holds(self, req_id: int) -> bool:
        """The request's KV sits in the swap space (it resumes without recompute)."""
        return req_id in self._held

    def swap_in(self, req_id: int) -> tuple[int, int, int, int]:
        """Copy the request's blocks back and free them here: (blocks, bytes, tokens of KV they
        hold, µs the next step waits for the copy)."""
        num_blocks, num_bytes, num_tokens = self._held.pop(req_id)
        self.free_blocks += num_blocks
        return num_blocks, num_bytes, num_tokens, self.link.copy_on_stream("h2d", num_bytes)

    def release(self, req_id: int) -> None:
        """The request gave up while swapped out: its blocks are free again, nothing is copied."""
        held = self._held.pop(req_id, None)
        if held is not None:
            self.free_blocks += held[0]

    def conserved(self) -> bool:
        """Free + held blocks == capacity."""
        held = sum(h[0] for h in self._held.values())
        return self.free_blocks + held == self.capacity_blocks and self.free_blocks >= 0
