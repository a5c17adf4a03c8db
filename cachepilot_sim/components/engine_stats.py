"""The engine's counters over a run (iterations, busy time, tokens, KV occupancy): the batcher
fills them, the simulation reports them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FOLD_RUNS = 4096  # decode runs held before they are counted into the gap table


@dataclass
class EngineStats:
    """Engine counters over the run: iterations, busy time, tokens, KV occupancy."""

    iterations: int = 0
    busy_us: int = 0
    tokens_prefilled: int = 0
    tokens_decoded: int = 0
    kv_byte_us: float = 0.0  # integral of (used + in flight) KV bytes over time
    kv_peak_bytes: int = 0
    # Stalls of the compute stream added to steps (engine profile; 0 under the defaults).
    graph_captures: int = 0  # lazy CUDA-graph captures (engine.graph_mode LAZY)
    graph_capture_us: int = 0  # their stall
    cpu_swaps: int = 0  # preemptions copied to the CPU swap space (engine.cpu_swap_blocks)
    swap_copy_us: int = 0  # the swap copies' stall, out and back
    # Requests preempted while decoding -> when their last token came (a long gap follows).
    last_token_us: dict[object, int] = field(default_factory=dict, repr=False)
    # Inter-token gaps counted so far (us -> tokens) and decode runs not yet folded into them.
    _gaps: dict[int, int] = field(default_factory=dict, repr=False)
    _run_ends: list[int] = field(default_factory=list, repr=False)  # every run's, one after another
    _run_lengths: list[int] = field(default_factory=list, repr=False)
    _run_seqs: list[int] = field(default_factory=list, repr=False)

    @property
    def itl_gaps(self) -> dict[int, int]:
        """Inter-token latency, exact: every output token after a request's first, by its gap
        since that request's previous token (us -> tokens). Steps follow each other without a
        pause while a sequence runs, so a decoding token's gap is its step's duration."""
        self._fold()
        return self._gaps

    def add_gaps(self, gap_us: int, num_tokens: int) -> None:
        """`num_tokens` tokens, each `gap_us` after its request's previous token."""
        if num_tokens > 0:
            self._gaps[gap_us] = self._gaps.get(gap_us, 0) + num_tokens

    def add_run(self, ends_us: list[int], num_seqs: int) -> int:
        """A decode run whose step j ended `ends_us[j]` after it started: each step gives every
        one of `num_seqs` sequences a token. Returns the number of steps. Runs are kept and
        counted in batches (one vectorized pass per FOLD_RUNS runs, not a loop per step)."""
        self._run_ends += ends_us
        self._run_lengths.append(len(ends_us))
        self._run_seqs.append(num_seqs)
        if len(self._run_seqs) >= FOLD_RUNS:
            self._fold()
        return len(ends_us)

    def _fold(self) -> None:
        if not self._run_seqs:
            return
        ends = np.array(self._run_ends, dtype=np.int64)
        lengths = np.array(self._run_lengths, dtype=np.int64)
        previous = np.empty_like(ends)
        previous[1:] = ends[:-1]
        previous[np.cumsum(lengths) - lengths] = 0  # each run's first step starts at 0
        tokens = np.repeat(np.array(self._run_seqs, dtype=np.int64), lengths)
        counts = np.bincount(ends - previous, weights=tokens)
        for gap in np.flatnonzero(counts).tolist():
            self.add_gaps(gap, int(counts[gap]))
        self._run_ends.clear()
        self._run_lengths.clear()
        self._run_seqs.clear()

    def preempted(self, req: object, now_us: int, decoding: bool) -> None:
        """`req` lost its KV at a step boundary; while decoding, its last token came now."""
        if decoding:
            self.last_token_us[req] = now_us

    def resumed(self, first: list[int], generated: np.ndarray, slot_req: list, now_us: int) -> None:
        """Columns `first` made a first token this step; those with tokens from before a
        preemption (`generated` > 0) waited since then (one preempted again mid-prefill, since
        its earlier preemption)."""
        for i in first:
            if generated[i] > 0:
                self.add_gaps(now_us - self.last_token_us.pop(slot_req[i]), 1)
