"""The engine's counters over a run (iterations, busy time, tokens, KV occupancy): the batcher
fills them, the simulation reports them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class EngineStats:
    """Engine counters over the run: iterations, busy time, tokens, KV occupancy."""

    iterations: int = 0
    busy_us: int = 0
    tokens_prefilled: int = 0
    tokens_decoded: int = 0
    kv_byte_us: float = 0.0  # integral of (used + in flight) KV bytes over time
    kv_peak_bytes: int = 0
    # Inter-token latency, exact: every output token after a request's first, by its gap since
    # that request's previous token (us -> tokens). Steps follow each other without a pause while
    # a sequence runs, so a decoding token's gap is its step's duration.
    itl_gaps: dict[int, int] = field(default_factory=dict)
    # Requests preempted while decoding -> when their last token came (a long gap follows).
    last_token_us: dict[object, int] = field(default_factory=dict, repr=False)

    def add_gaps(self, gap_us: int, num_tokens: int) -> None:
        """`num_tokens` tokens, each `gap_us` after its request's previous token."""
        if num_tokens > 0:
            self.itl_gaps[gap_us] = self.itl_gaps.get(gap_us, 0) + num_tokens

    def add_run(self, ends_us: np.ndarray, num_seqs: int) -> int:
        """A decode run whose step j ended `ends_us[j]` after it started: each step gives every
        one of `num_seqs` sequences a token. Returns the number of steps."""
        previous = 0
        for end in ends_us.tolist():
            self.add_gaps(end - previous, num_seqs)
            previous = end
        return len(ends_us)

    def preempted(self, req: object, now_us: int, decoding: bool) -> None:
        """`req` lost its KV at a step boundary; while decoding, its last token came now."""
        if decoding:
            self.last_token_us[req] = now_us

    def resumed(self, requests: list, now_us: int) -> None:
        """The first tokens of `requests` after their preemption (those preempted while they
        decoded; one preempted mid-prefill is resumed from its earlier preemption's time)."""
        for req in requests:
            self.add_gaps(now_us - self.last_token_us.pop(req), 1)
