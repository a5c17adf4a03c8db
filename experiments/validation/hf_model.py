"""Random-weight Llama-3-8B for the transformers continuous-batching engine, FA2-varlen attention.

The engine's default attention without the `flash_attn` package (`paged|sdpa`) builds a dense mask
over the whole batch; `paged|torch_flash_varlen` is the engine's own flash varlen path
(integrations/flash_paged.py) on PyTorch's built-in FlashAttention-2 varlen kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from capture_common import LLAMA3_8B

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
    max_position_embeddings=8192,
    rope_theta=500000.0,
)
# The name must contain "flash" (the engine then uses no mask, and turns graphs + async on) and
# must not match "flash.*2|3" (the engine would then look for flash_attn_with_kvcache, absent here).
FAST_ATTN = "paged|torch_flash_varlen"
TOKEN_LOW, TOKEN_HIGH = 1000, 120000


def torch_flash_varlen_paged(
    module: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: Any,
    cache: Any = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: Any = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: Any = 0,
    block_table: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Mirror of transformers/integrations/flash_paged.py (varlen branch): write the new K/V into
    the paged cache and read back each request's whole K/V through `cache.update`, then run causal
    varlen attention (bottom-right aligned, GQA) with torch.ops.aten._flash_attention_forward."""
    if isinstance(cu_seq_lens_k, dict):
        cu_seq_lens_k = cu_seq_lens_k["full_attention"]
        max_seqlen_k = max_seqlen_k["full_attention"]
    k, v = cache.update(
        key_states=k,
        value_states=v,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    out = torch.ops.aten._flash_attention_forward(
        q.transpose(1, 2).squeeze(0).contiguous(),
        k.contiguous(),
        v.contiguous(),
        cu_seq_lens_q.to(torch.int32),
        cu_seq_lens_k.to(torch.int32).clone(),
        max_seqlen_q,
        max_seqlen_k,
        0.0,
        True,
        False,
        scale=module.scaling,
    )
    return out[0], None


def check_fast_path(device: str) -> dict:
    """Max abs error of torch's FA2 varlen kernel vs per-sequence SDPA (random bf16, GQA, q < k)."""
    torch.manual_seed(0)
    heads, kv_heads, dim = 32, 8, 128
    q_lens, k_lens = [5, 64, 1, 200], [300, 64, 1000, 200]
    q = torch.randn(sum(q_lens), heads, dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(sum(k_lens), kv_heads, dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cq = torch.tensor(np.cumsum([0, *q_lens]), dtype=torch.int32, device=device)
    ck = torch.tensor(np.cumsum([0, *k_lens]), dtype=torch.int32, device=device)
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cq, ck, max(q_lens), max(k_lens), 0.0, True, False, scale=dim**-0.5
    )[0]
    err = 0.0
    for i, (lq, lk) in enumerate(zip(q_lens, k_lens, strict=True)):
        qi = q[cq[i] : cq[i + 1]].float().transpose(0, 1)
        ki = k[ck[i] : ck[i + 1]].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        vi = v[ck[i] : ck[i + 1]].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
        mask = torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=lk - lq)
        ref = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask)
        err = max(err, (out[cq[i] : cq[i + 1]].float() - ref.transpose(0, 1)).abs().max().item())
    return {"fa2_varlen_max_abs_err_vs_sdpa": err}


# --------------------------------------------------------------------------------------------- #
# Model and engine                                                                              #
# --------------------------------------------------------------------------------------------- #
def build_model(smoke: bool) -> Any:
    from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig

    AttentionInterface.register(FAST_ATTN, torch_flash_varlen_paged)
    shape = TINY if smoke else LLAMA3_8B
    cfg = LlamaConfig(**shape, attn_implementation="sdpa")
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    # Set directly: set_attn_implementation would try to load a hub kernel for a "flash" name.
    model.config._attn_implementation = "paged|sdpa" if smoke else FAST_ATTN
    return model
