"""The Llama-shaped timing model used by calibration: its split-KV decode attention computes the
same attention as an unsplit one, and the split rule divides the context evenly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (dev extra)")

from cachepilot_sim.kernels.llama_shape import (  # noqa: E402
    SPLIT_TOKENS,
    LlamaShape,
    LlamaTimingModel,
    num_splits,
)

TINY = LlamaShape(
    num_layers=2, hidden=64, num_heads=8, num_kv_heads=2, head_dim=8, intermediate=128, vocab=100
)


@pytest.mark.parametrize(("rows", "context"), [(1, 8192), (16, 2048), (300, 512), (2, 1000)])
def test_split_count_divides_context_into_whole_chunks(rows: int, context: int) -> None:
    s = num_splits(rows, context)
    assert s >= 1 and context % s == 0
    assert s == 1 or (context // s) % SPLIT_TOKENS == 0


def test_split_kv_decode_attention_equals_unsplit_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    model = LlamaTimingModel(TINY, device="cpu")
    q = torch.randn(2, 2, 4, 8, generator=gen)
    k = torch.randn(2, 2, 2048, 8, generator=gen)
    v = torch.randn(2, 2, 2048, 8, generator=gen)
    got = model.decode_attention(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert num_splits(4, 2048) > 1
    assert torch.allclose(got, want, atol=1e-5)


def test_llama_shape_counts_llama3_8b_parameters_and_kv_bytes() -> None:
    shape = LlamaShape()
    assert 8.0e9 < shape.num_params < 8.1e9
    assert shape.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2


def test_tiny_model_runs_prefill_and_decode_on_cpu() -> None:
    model = LlamaTimingModel(TINY, device="cpu")
    assert model.prefill(torch.randint(0, 100, (17,))).shape == (1, 100)
    cache = model.make_kv_cache(3, 511)
    assert model.decode(torch.randint(0, 100, (3,)), cache).shape == (3, 100)
