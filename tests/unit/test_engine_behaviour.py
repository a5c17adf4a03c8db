"""A transformers capture's engine.json and steps.parquet read into the graph and swap settings."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation.engine_behaviour import (
    estimate_graph_capture_us,
    fit_capture_stall,
    graph_and_swap_overrides,
)

HF_CB = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb"
CPU_SWAP = HF_CB / "2026-12-01/pressure_cpu_swap/run1"
EAGER = HF_CB / "2026-12-01-config-choice/explore_eager/run1"


def _engine(folder: Path) -> dict:
    return json.loads((folder / "engine.json").read_text())


def test_a_precaptured_async_capture_with_cpu_swap_space() -> None:
    assert graph_and_swap_overrides(_engine(CPU_SWAP), 256) == [
        "engine.graph_mode=PRECAPTURED",
        "engine.graph_captures_per_shape=2",
        "engine.cpu_swap_blocks=32",
    ]


def test_an_eager_capture_without_swap_space() -> None:
    assert graph_and_swap_overrides(_engine(EAGER), 256) == [
        "engine.graph_mode=NONE",
        "engine.cpu_swap_blocks=0",
    ]


def test_lazy_graphs_take_the_profile_s_stall_never_the_run_s_own() -> None:
    engine = _engine(CPU_SWAP) | {
        "precaptured_graphs": 0,
        "use_async_batching": False,
        "graph_captures_during_run": [{"dur_us": d, "pair": 0} for d in (140_000, 120_000)],
    }
    out = graph_and_swap_overrides(engine, 256)
    assert out[:2] == ["engine.graph_mode=LAZY", "engine.graph_captures_per_shape=1"]
    assert not any(o.startswith("engine.graph_capture_us") for o in out)


def test_the_capture_stall_is_the_median_excess_over_runs() -> None:
    def run(excess: int) -> tuple[pl.DataFrame, int | None]:
        shape = {"q_tokens_padded": [64] * 3, "kv_read_padded": [16384] * 3}
        return pl.DataFrame(
            shape | {"max_seqlen_k": [900] * 3, "start_us": [0, 0, 0],
                     "end_us": [13_000, 13_000 + excess, 13_000], "graph_captures": [0, 1, 0]}
        ), None  # fmt: skip

    assert fit_capture_stall([run(40_000), run(44_000), run(90_000)]) == 44_000
    with pytest.raises(ValueError, match="same-shape"):
        fit_capture_stall([(run(1)[0].filter(pl.col("graph_captures") == 1), None)])


def test_swap_space_is_counted_in_the_profile_s_blocks() -> None:
    base = {"block_size": 256, "kv_bytes_per_token": 131_072}
    assert graph_and_swap_overrides(base | {"num_cpu_blocks": 32}, 128) == [
        "engine.cpu_swap_blocks=64"
    ]
    # without the engine's own count: the space over one 256-token block (32 MiB)
    assert graph_and_swap_overrides(base | {"cpu_offload_space_gib": 1.0}, 256) == [
        "engine.cpu_swap_blocks=32"
    ]
    with pytest.raises(ValueError, match="block_size"):
        graph_and_swap_overrides({"num_cpu_blocks": 32}, 256)


@pytest.mark.parametrize("folder", [CPU_SWAP, EAGER])
def test_the_overrides_compose_with_the_engine_profile(folder: Path) -> None:
    run_cfg = sim_config("hf_cb", graph_and_swap_overrides(_engine(folder), 256))
    engine = run_cfg.sim_for(run_cfg.policy.name, 0).engine
    assert engine.cpu_swap_blocks == (32 if folder == CPU_SWAP else 0)


def _steps(rows: list[tuple[int, int, int, int, int]]) -> pl.DataFrame:
    """(q padded, KV read padded, max_seqlen_k, captures, step µs), steps one after another."""
    start = [0]
    for r in rows[:-1]:
        start.append(start[-1] + r[4])
    return pl.DataFrame(
        {
            "q_tokens_padded": [r[0] for r in rows],
            "kv_read_padded": [r[1] for r in rows],
            "max_seqlen_k": [r[2] for r in rows],
            "graph_captures": [r[3] for r in rows],
            "start_us": start,
            "end_us": [s + r[4] for s, r in zip(start, rows, strict=True)],
        }
    )


def test_the_capture_stall_is_the_median_excess_over_same_shape_steps() -> None:
    steps = _steps(
        [
            (256, 16384, 900, 1, 142_000),  # captures; 900 and 1000 both pad to 1024
            (256, 16384, 1000, 0, 11_000),
            (256, 16384, 1000, 0, 12_000),
            (256, 16384, 1000, 0, 13_000),
            (512, 16384, 1000, 2, 290_000),  # two captures: (290 - 30) / 2 = 130 ms each
            (512, 16384, 1000, 0, 30_000),
            (256, 16384, 1025, 1, 999_000),  # pads to 2048: no plain step of its shape
            (256, 16384, 2000, 1, 500_000),  # the same shape, captured on the other set
        ]
    )
    assert estimate_graph_capture_us(steps) == 130_000
    assert estimate_graph_capture_us(steps.filter(pl.col("q_tokens_padded") == 256)) == 130_000
    # capped at a 1024-token pool (num_pages), the last two are of the first shape: excesses of
    # 130, 130, 987 and 488 ms
    assert estimate_graph_capture_us(steps, num_pages=1024) == (130_000 + 488_000) // 2


def test_no_estimate_without_a_capture_step() -> None:
    assert estimate_graph_capture_us(pl.read_parquet(CPU_SWAP / "steps.parquet")) is None
