"""Lazy CUDA-graph capture (engine.graph_mode LAZY) against its opposite (PRECAPTURED, NONE): the
graph key transformers 5.17 uses, one capture per shape and IO buffer set, the stall it adds."""

from __future__ import annotations

import pytest

from cachepilot_sim.components.graph_capture import GraphCaptures, GraphPadding, graph_key
from tests.engine_runs import ground_truth, run_hf_cb

PAD = GraphPadding(q_pad_tokens=256, max_batch_tokens=2048, kv_pad_tokens=16384, num_pages=40960)
CAPTURE_US = 100_000
LAZY = (
    "engine.graph_mode=LAZY",
    f"engine.graph_capture_us={CAPTURE_US}",
    "engine.kv_pad_tokens=16384",
    "engine.graph_captures_per_shape=1",  # one IO buffer set (the profile's async has two)
)


@pytest.mark.parametrize(
    ("q", "kv", "seqlen", "key"),
    [
        (300, 0, 300, (512, 16384, 1024)),  # KV read 0 pads to one interval
        (1, 16384, 1025, (256, 16384, 2048)),
        (2048, 16385, 4096, (2048, 32768, 4096)),
        (2100, 50000, 70000, (2048, 40960, 40960)),  # capped at the batch and the pool
    ],
)
def test_the_graph_key_is_transformers_padded_shape(
    q: int, kv: int, seqlen: int, key: tuple[int, int, int]
) -> None:
    assert graph_key(PAD, q, kv, seqlen) == key


def test_a_new_shape_stalls_once_and_the_same_shape_never_again() -> None:
    graphs = GraphCaptures(PAD, CAPTURE_US, num_buffer_sets=1)
    a, b = graph_key(PAD, 300, 0, 300), graph_key(PAD, 1, 300, 301)
    assert graphs.stalls([a, a, b, a, b]) == [CAPTURE_US, 0, CAPTURE_US, 0, 0]
    assert graphs.num_captures == 0  # pricing books nothing
    assert graphs.launch([a]) == CAPTURE_US
    assert graphs.launch([a, a]) == 0
    assert graphs.launch([b, a, b]) == CAPTURE_US
    assert (graphs.num_captures, graphs.stall_us, graphs.num_steps) == (2, 2 * CAPTURE_US, 6)


def test_each_io_buffer_set_captures_a_shape_once() -> None:
    """Async batching swaps its two IO buffer sets after every step, each with its own graphs."""
    graphs = GraphCaptures(PAD, CAPTURE_US, num_buffer_sets=2)
    a, b = graph_key(PAD, 300, 0, 300), graph_key(PAD, 1, 300, 301)
    # a on set 0, then b on sets 1 and 0, then nothing new
    assert graphs.launch([a, b, b, b, b]) == 3 * CAPTURE_US
    assert graphs.launch([a]) == CAPTURE_US  # step 5 runs on set 1, which never ran a
    assert graphs.launch([b, a]) == 0
    assert graphs.num_captures == 4


def _one_request(*overrides: str) -> dict:
    gt = ground_truth([300], [50], [0])
    sim, result = run_hf_cb(gt, *overrides)
    req = result.requests.row(0, named=True)
    return {**result.metrics, **req, "gaps": sim.batcher.stats.itl_gaps}


@pytest.mark.parametrize(("sets", "captures"), [(1, 2), (2, 3)])
def test_lazy_capture_stalls_the_steps_that_launch_a_new_shape(sets: int, captures: int) -> None:
    """One request: its prefill (512 queries) and its decodes (256) are two shapes."""
    lazy = _one_request(*LAZY, f"engine.graph_captures_per_shape={sets}")
    pre = _one_request(
        *LAZY, f"engine.graph_captures_per_shape={sets}", "engine.graph_mode=PRECAPTURED"
    )
    assert (lazy["graph_captures"], pre["graph_captures"]) == (captures, 0)
    assert lazy["graph_capture_s"] == pytest.approx(captures * CAPTURE_US / 1e6)
    assert pre["graph_capture_s"] == 0
    # one request alone: the stalls are the only difference
    assert lazy["first_token_us"] - pre["first_token_us"] == CAPTURE_US
    assert lazy["finish_us"] - pre["finish_us"] == captures * CAPTURE_US
    assert sum(n for gap, n in lazy["gaps"].items() if gap >= CAPTURE_US) == captures - 1


def test_precaptured_and_eager_graphs_change_nothing() -> None:
    plain = _one_request()
    for mode in ("PRECAPTURED", "NONE"):
        other = _one_request(f"engine.graph_mode={mode}", f"engine.graph_capture_us={CAPTURE_US}")
        assert other["finish_us"] == plain["finish_us"] and other["graph_captures"] == 0


def test_a_later_request_of_the_same_shapes_stalls_nowhere_and_a_new_shape_stalls_once() -> None:
    same = ground_truth([300, 400], [50, 50], [0, 5_000_000])  # sent after r000 finished
    new = ground_truth([300, 700], [50, 50], [0, 5_000_000])  # its prefill pads to 768
    assert run_hf_cb(same, *LAZY)[1].metrics["graph_captures"] == 2
    assert run_hf_cb(new, *LAZY)[1].metrics["graph_captures"] == 3


def test_the_longest_sequence_crossing_a_power_of_two_is_a_new_shape_mid_decode() -> None:
    # 1000 + decodes cross 1024 (max_seqlen_k pads to 2048 from there): three shapes
    sim, result = run_hf_cb(ground_truth([1000], [100], [0]), *LAZY)
    assert result.metrics["graph_captures"] == 3
    stalled = [gap for gap in sim.batcher.stats.itl_gaps if gap >= CAPTURE_US]
    assert len(stalled) == 2  # the first decode step and the one crossing 1024


def test_an_unpadded_kv_read_is_a_new_shape_every_step() -> None:
    sim, result = run_hf_cb(ground_truth([300], [50], [0]), *LAZY, "engine.kv_pad_tokens=0")
    assert result.metrics["graph_captures"] == result.metrics["iterations"] == 50


def test_lazy_capture_runs_are_deterministic() -> None:
    gt = ground_truth([300 + 97 * i for i in range(12)], [80] * 12, [i * 30_000 for i in range(12)])
    a = run_hf_cb(gt, *LAZY, "engine.graph_captures_per_shape=2")[1]
    b = run_hf_cb(gt, *LAZY, "engine.graph_captures_per_shape=2")[1]
    assert a.requests.equals(b.requests) and a.metrics == b.metrics
    assert a.metrics["graph_captures"] > 4
