"""A transformers capture's graph and swap behaviour, from its engine.json and steps.parquet.

`graph_and_swap_overrides` turns the keys the capture script writes (`use_cuda_graph`,
`precaptured_graphs`, `use_async_batching`,
`graph_captures_during_run`, `num_cpu_blocks`, `cpu_offload_space_gib`, `block_size`,
`kv_bytes_per_token`) into `engine.*` overrides; `estimate_graph_capture_us` measures one lazy
capture's stall from the steps that captured (components/graph_capture.py, cpu_swap.py).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from cachepilot_sim.components.graph_capture import pad_seqlen_k

GIB = 1 << 30


def _graphs_on(engine_json: dict[str, Any]) -> bool | None:
    """Whether the varlen path replays CUDA graphs (`cuda_graph_booleans[0]`; the decode fast
    path, the second, needs flash_attn); None when engine.json does not say."""
    flags = engine_json.get("use_cuda_graph")
    if isinstance(flags, list | tuple):
        return bool(flags[0]) if flags else None
    return None if flags is None else bool(flags)


def _swap_blocks(engine_json: dict[str, Any], block_tokens: int) -> int:
    """The CPU swap pool in blocks of `block_tokens`: `num_cpu_blocks` as the engine sized it,
    else `cpu_offload_space_gib` over the bytes of one engine block (the engine's formula,
    without its clamp to a share of free RAM)."""
    size = engine_json.get("block_size")
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"engine.json block_size must be a positive int, got {size!r}")
    blocks = engine_json.get("num_cpu_blocks")
    if blocks is None:
        gib = engine_json.get("cpu_offload_space_gib") or 0.0
        per_token = engine_json.get("kv_bytes_per_token")
        if not gib:
            blocks = 0
        elif isinstance(per_token, int) and per_token > 0:
            blocks = int(gib * GIB) // (per_token * size)
        else:
            raise ValueError("engine.json has cpu_offload_space_gib but no kv_bytes_per_token")
    if not isinstance(blocks, int) or blocks < 0:
        raise ValueError(f"engine.json num_cpu_blocks must be an int >= 0, got {blocks!r}")
    return blocks * size // block_tokens


def graph_and_swap_overrides(engine_json: dict[str, Any], block_tokens: int) -> list[str]:
    """Hydra overrides of `engine.graph_mode`, `graph_captures_per_shape`,
    `graph_capture_us` and `cpu_swap_blocks` (in blocks of `block_tokens`) for a capture.

    Graphs on and pre-captured (`precaptured_graphs` > 0): PRECAPTURED, no stall (shapes the
    pre-capture skipped or did not sweep are not modelled: `graph_captures_during_run` lists any
    that were captured while serving). Graphs on without it: LAZY, one capture per shape and IO
    buffer set (two under async batching), each adding the profile's `graph_capture_us` to its
    step: a cost of the engine on its GPU, fitted by `fit_capture_stall` on other runs'
    captures, never read from the run being replayed. Graphs
    off: NONE. Enum values are given by name (OmegaConf reads `LAZY`, not `lazy`). The query
    padding is validation/engine_settings.py's (the step cost decides whether it can follow)."""
    out: list[str] = []
    graphs = _graphs_on(engine_json)
    if graphs is not None:
        if not graphs:
            out.append("engine.graph_mode=NONE")
        else:
            pre = engine_json.get("precaptured_graphs") or 0
            out.append(f"engine.graph_mode={'PRECAPTURED' if pre > 0 else 'LAZY'}")
            async_io = engine_json.get("use_async_batching")
            if async_io is not None:
                out.append(f"engine.graph_captures_per_shape={2 if async_io else 1}")
    if "num_cpu_blocks" in engine_json or "cpu_offload_space_gib" in engine_json:
        out.append(f"engine.cpu_swap_blocks={_swap_blocks(engine_json, block_tokens)}")
    return out


def fit_capture_stall(runs: list[tuple[pl.DataFrame, int | None]]) -> int:
    """What one lazy capture adds to its step (µs), from several captures' steps.parquet (each
    with its engine's `num_pages`): the median over the runs of `estimate_graph_capture_us`. The
    engine's own capture time (`graph_captures_during_run` dur_us) includes the step's kernels,
    which the step cost already prices: it grows with the step (50 ms at 64 queries, 130 ms at
    2,112 on the H100), while the excess over the same shape without a capture does not."""
    values = [v for steps, pages in runs if (v := estimate_graph_capture_us(steps, pages))]
    if not values:
        raise ValueError("no capture step has a same-shape step without a capture")
    return _median_int(sorted(values))


def _median_int(values: list[int]) -> int:
    """The median of sorted ints, rounded to a whole microsecond."""
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    return round((values[mid - 1] + values[mid]) / 2)


def estimate_graph_capture_us(steps: pl.DataFrame, num_pages: int | None = None) -> int | None:
    """One lazy capture's stall (µs) from a capture's steps.parquet: per step that captured
    (`graph_captures` > 0), its time (`end_us - start_us`) over the median time of the steps of
    the same padded shape that did not capture, divided by its captures; the median over those
    steps. The shape is the graph key: `q_tokens_padded`, `kv_read_padded` and `max_seqlen_k`
    padded to a power of two of at least 1024 (capped at `num_pages` when given). None when no
    capture step has a same-shape step without a capture."""
    cap = num_pages if num_pages is not None else 1 << 62
    df = steps.with_columns(
        step_us=pl.col("end_us") - pl.col("start_us"),
        seqlen_pad=pl.col("max_seqlen_k").map_elements(
            lambda s: pad_seqlen_k(int(s), cap), return_dtype=pl.Int64
        ),
    )
    shape = ["q_tokens_padded", "kv_read_padded", "seqlen_pad"]
    base = (
        df.filter(pl.col("graph_captures") == 0)
        .group_by(shape)
        .agg(base_us=pl.col("step_us").median())
    )
    excess = (
        df.filter(pl.col("graph_captures") > 0)
        .join(base, on=shape, how="inner")
        .select(((pl.col("step_us") - pl.col("base_us")) / pl.col("graph_captures")).alias("x"))
    )
    if excess.height == 0:
        return None
    return round(float(excess["x"].median()))  # type: ignore[arg-type]
