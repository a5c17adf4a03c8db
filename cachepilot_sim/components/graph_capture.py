"""Lazy CUDA-graph capture (transformers 5.17 continuous batching, `use_cuda_graph` without a
pre-capture): the first launch of a padded step shape on an IO buffer set captures a graph, and
that step stalls.

What the engine keys a graph on (`ContinuousBatchingIOs._get_graph_key`, varlen path): the padded
query count (`pad_to_interval(q, q_padding_interval_size, max_batch_tokens)`), the padded KV read
(`pad_to_interval(kv_read, kv_padding_interval_size, num_pages)`, where kv_read is the tokens
already cached for the batch's requests, and 0 pads to one interval) and the longest sequence
`max_seqlen_k` (past + query tokens) padded to a power of two of at least 1024, capped at
`num_pages` (`get_model_kwargs`). Graphs live in a plain dict per IO buffer set (no eviction):
once per shape and set for the engine's lifetime. Async batching keeps two sets and swaps them
after every step (`retrieve_device_outputs`), so step s launches on set s mod
`graph_captures_per_shape`. The decode fast path (block table, key = padded query count alone)
needs `flash_attn`, absent on the profiled device: not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachepilot_sim.config import GraphMode, SimConfig

# transformers pads max_seqlen_k to a power of two of at least this (`pad_to_pow2(..., 1024)`).
SEQLEN_K_MIN_PAD_TOKENS = 1024

GraphKey = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class GraphPadding:
    """The engine's padding of a step's launch shape (tokens)."""

    q_pad_tokens: int  # q_padding_interval_size
    max_batch_tokens: int  # the query buffer: padding never exceeds it
    kv_pad_tokens: int  # kv_padding_interval_size; 0: unpadded (every KV read its own shape)
    num_pages: int  # the KV pool in tokens (num_blocks x block_size): padding never exceeds it


def _pad(size: int, interval: int, cap: int) -> int:
    """transformers' `pad_to_interval`: the smallest multiple >= size (0 pads to one), capped."""
    return min(-(-size // interval) * interval if size > 0 else interval, cap)


def pad_seqlen_k(size: int, cap: int) -> int:
    """transformers' `pad_to_pow2(size, cap, SEQLEN_K_MIN_PAD_TOKENS)`: the longest sequence of a
    graph key."""
    value = max(size, SEQLEN_K_MIN_PAD_TOKENS)
    return min(1 << (value - 1).bit_length(), cap)


def graph_key(pad: GraphPadding, q_tokens: int, kv_read_tokens: int, max_seqlen_k: int) -> GraphKey:
    """The padded (queries, KV read, longest sequence) a step launches: its graph's key."""
    kv = kv_read_tokens
    if pad.kv_pad_tokens:
        kv = _pad(kv_read_tokens, pad.kv_pad_tokens, pad.num_pages)
    return (
        _pad(q_tokens, pad.q_pad_tokens, pad.max_batch_tokens),
        kv,
        pad_seqlen_k(max_seqlen_k, pad.num_pages),
    )


class GraphCaptures:
    """The graphs an engine has captured, per IO buffer set; what a step's captures cost.

    `stalls` prices steps without changing anything (a decode run may be cut short by a wake-up);
    `launch` books the steps that ran. The captured set is only tested for membership."""

    def __init__(self, padding: GraphPadding, capture_us: int, num_buffer_sets: int) -> None:
        self.padding = padding
        # What a capture adds to its step: the capture itself, beyond the step's own kernels
        # (a capture step takes its usual time plus this, whatever its shape).
        self.capture_us = capture_us
        self.num_buffer_sets = num_buffer_sets
        self._captured: set[tuple[int, GraphKey]] = set()
        self.num_steps = 0  # steps launched so far: the next one runs on set num_steps mod sets
        self.num_captures = 0
        self.stall_us = 0  # total capture stall so far

    def _new(self, keys: list[GraphKey]) -> list[bool]:
        """Whether each of the next len(keys) steps captures (a repeat inside `keys` does not)."""
        sets, start = self.num_buffer_sets, self.num_steps
        seen: set[tuple[int, GraphKey]] = set()
        out = []
        for j, key in enumerate(keys):
            slot = ((start + j) % sets, key)
            new = slot not in self._captured and slot not in seen
            seen.add(slot)
            out.append(new)
        return out

    def stalls(self, keys: list[GraphKey]) -> list[int]:
        """Capture stall (µs) of each of the next len(keys) steps, launched in this order."""
        return [self.capture_us if new else 0 for new in self._new(keys)]

    def launch(self, keys: list[GraphKey]) -> int:
        """The next len(keys) steps ran with these keys: their graphs exist now. Returns their
        total capture stall (µs)."""
        sets, start = self.num_buffer_sets, self.num_steps
        captures = stall = 0
        for j, (key, new) in enumerate(zip(keys, self._new(keys), strict=True)):
            if new:
                self._captured.add(((start + j) % sets, key))
                captures += 1
                stall += self.capture_us
        self.num_steps += len(keys)
        self.num_captures += captures
        self.stall_us += stall
        return stall


def make_graph_captures(cfg: SimConfig, pool_tokens: int) -> GraphCaptures | None:
    """The lazy captures of the engine profile (`engine.graph_mode` LAZY) over a KV pool of
    `pool_tokens` tokens; None for an engine without lazy captures (no stall ever)."""
    e, b = cfg.engine, cfg.batcher
    if e.graph_mode != GraphMode.LAZY:
        return None
    budget = max(b.throughput_token_budget, b.latency_token_budget)
    padding = GraphPadding(e.q_pad_tokens, budget, e.kv_pad_tokens, pool_tokens)
    return GraphCaptures(padding, e.graph_capture_us, e.graph_captures_per_shape)
