"""A Llama-3-8B-shaped decoder in plain torch with random bf16 weights, for timing prefill and
decode steps on the GPU: 32 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, vocab
128256, RMSNorm, rotary embeddings, SDPA attention. Only the shapes and the work matter here; no
weights are loaded. Decode reads a preallocated per-layer KV cache in place (no concatenation), as
a paged serving engine does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cachepilot_sim.cost.kv_bytes import kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class LlamaShape:
    num_layers: int = 32
    hidden: int = 4096
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 128256

    @property
    def num_params(self) -> int:
        qkv = self.hidden * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        per_layer = qkv + self.num_heads * self.head_dim * self.hidden
        per_layer += 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.num_layers * per_layer + 2 * self.vocab * self.hidden + self.hidden

    @property
    def weight_bytes(self) -> int:
        return 2 * self.num_params

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self, 2)  # bf16 KV


class LlamaTimingModel:
    """Random-weight model (CUDA by default); prefill() and decode() run one forward each."""

    def __init__(
        self, shape: LlamaShape = LlamaShape(), seed: int = 0, device: str = "cuda"
    ) -> None:
        import torch

        self.torch, self.s, self.dev = torch, shape, device
        gen = torch.Generator(device=device).manual_seed(seed)

        def w(*size: int) -> Any:
            t = torch.randn(*size, device=device, dtype=torch.bfloat16, generator=gen)
            return t.mul_(1.0 / math.sqrt(size[-1]))

        qkv_out = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
        self.embed = w(shape.vocab, shape.hidden)
        self.lm_head = w(shape.vocab, shape.hidden)
        self.layers = [
            (
                w(qkv_out, shape.hidden),
                w(shape.hidden, shape.num_heads * shape.head_dim),
                w(2 * shape.intermediate, shape.hidden),
                w(shape.hidden, shape.intermediate),
            )
            for _ in range(shape.num_layers)
        ]
        self.norm_w = torch.ones(shape.hidden, device=device, dtype=torch.bfloat16)

    def _rope(self, x: Any, positions: Any) -> Any:
        torch, d = self.torch, self.s.head_dim
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=self.dev, dtype=torch.float32) / d))
        ang = (positions.float()[:, None] * inv[None, :])[:, None, :]  # [tokens, 1, d/2]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _mlp(self, h: Any, w_gate_up: Any, w_down: Any) -> Any:
        F = self.torch.nn.functional
        gu = F.rms_norm(h, (self.s.hidden,), self.norm_w) @ w_gate_up.T
        g, u = gu.chunk(2, dim=-1)
        return h + (F.silu(g) * u) @ w_down.T

    def _qkv(
        self, h: Any, w_qkv: Any, positions: Any, batch: int, num_tokens: int
    ) -> tuple[Any, Any, Any]:
        s, F = self.s, self.torch.nn.functional
        qkv = F.rms_norm(h, (s.hidden,), self.norm_w) @ w_qkv.T
        q, k, v = qkv.split(
            [s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim],
            dim=-1,
        )
        q = self._rope(q.view(batch, num_tokens, s.num_heads, s.head_dim), positions)
        k = self._rope(k.view(batch, num_tokens, s.num_kv_heads, s.head_dim), positions)
        return q, k, v.view(batch, num_tokens, s.num_kv_heads, s.head_dim)

    def prefill(self, token_ids: Any) -> Any:
        """One sequence of n tokens, causal attention, logits of the last token only."""
        torch, s, F = self.torch, self.s, self.torch.nn.functional
        n = token_ids.numel()
        positions = torch.arange(n, device=self.dev)
        h = self.embed[token_ids].view(1, n, s.hidden)
        for w_qkv, w_o, w_gate_up, w_down in self.layers:
            q, k, v = self._qkv(h, w_qkv, positions, 1, n)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=True,
            )
            h = h + a.transpose(1, 2).reshape(1, n, -1) @ w_o.T
            h = self._mlp(h, w_gate_up, w_down)
        return F.rms_norm(h[:, -1], (s.hidden,), self.norm_w) @ self.lm_head.T

    def make_kv_cache(self, batch: int, context_tokens: int) -> list[tuple[Any, Any]]:
        """Random per-layer K and V [batch, kv_heads, context + 1, head_dim] (last slot: new).

        Pick context + 1 as a multiple of SPLIT_TOKENS so decode can split it (2**k - 1)."""
        s, torch = self.s, self.torch
        shape = (batch, s.num_kv_heads, context_tokens + 1, s.head_dim)
        return [
            (
                torch.randn(shape, device=self.dev, dtype=torch.bfloat16),
                torch.randn(shape, device=self.dev, dtype=torch.bfloat16),
            )
            for _ in range(s.num_layers)
        ]

    def decode(self, token_ids: Any, cache: list[tuple[Any, Any]]) -> Any:
        """One new token per sequence against the cache; GQA as 4 query rows per KV head."""
        s, F = self.s, self.torch.nn.functional
        batch = token_ids.numel()
        ctx = cache[0][0].shape[2] - 1
        positions = self.torch.full((1,), ctx, device=self.dev)
        group = s.num_heads // s.num_kv_heads
        h = self.embed[token_ids].view(batch, 1, s.hidden)
        for (w_qkv, w_o, w_gate_up, w_down), (k_cache, v_cache) in zip(
            self.layers, cache, strict=True
        ):
            q, k, v = self._qkv(h, w_qkv, positions, batch, 1)
            k_cache[:, :, ctx] = k[:, 0]
            v_cache[:, :, ctx] = v[:, 0]
            a = self.decode_attention(
                q.view(batch, s.num_kv_heads, group, s.head_dim), k_cache, v_cache
            )
            h = h + a.reshape(batch, 1, -1) @ w_o.T
            h = self._mlp(h, w_gate_up, w_down)
        return F.rms_norm(h[:, 0], (s.hidden,), self.norm_w) @ self.lm_head.T

    def decode_attention(self, q: Any, k_cache: Any, v_cache: Any) -> Any:
        """Split-KV decode attention (as flash-decoding): q [B, kv_heads, group, d] against caches
        [B, kv_heads, T, d]. The context is cut into chunks that run as separate programs, so a
        batch of one still fills the GPU (plain SDPA ran 8 CTAs at batch 1 and read a 32k context
        at ~0.3 TB/s on the H200); chunk results merge by their log-sum-exp. Needs no copy of the
        cache: [B, kv_heads, T, d] is viewed as [B * kv_heads * splits, 1, T / splits, d]."""
        torch = self.torch
        b, hk, g, d = q.shape
        t = k_cache.shape[2]
        splits = num_splits(b * hk, t)
        n = b * hk * splits
        k = k_cache.view(n, 1, t // splits, d)
        v = v_cache.view(n, 1, t // splits, d)
        qs = q.reshape(b * hk, 1, g, d).expand(b * hk, splits, g, d).reshape(n, 1, g, d)
        out, lse = self._attend(qs, k, v)
        w = torch.softmax(lse.float().view(b * hk, splits, g), dim=1)
        merged = (out.float().view(b * hk, splits, g, d) * w[..., None]).sum(dim=1)
        return merged.to(q.dtype).view(b, hk, g, d)

    def _attend(self, q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        """(attention output, log-sum-exp of the scores) per query row."""
        torch = self.torch
        if q.is_cuda:
            r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)
            return r[0], r[1]
        scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        return (torch.softmax(scores, -1) @ v.float()).to(q.dtype), torch.logsumexp(scores, -1)


SPLIT_TOKENS = 256  # smallest context chunk one decode program reads
TARGET_PROGRAMS = 264  # two waves over the H200's 132 SMs


def num_splits(num_rows: int, context_tokens: int) -> int:
    """Largest split count that divides the context into chunks of >= SPLIT_TOKENS tokens (a
    multiple of SPLIT_TOKENS) and keeps num_rows * splits <= TARGET_PROGRAMS, at least 1."""
    if context_tokens % SPLIT_TOKENS:
        return 1
    chunks = context_tokens // SPLIT_TOKENS
    want = max(1, TARGET_PROGRAMS // max(num_rows, 1))
    return max(s for s in range(1, min(chunks, want) + 1) if chunks % s == 0)
