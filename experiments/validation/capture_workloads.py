"""Request lists for the capture: closed, Poisson, burst, multi-turn, trace and micro-run batches.

A request with a parent is sent its think time after the parent's last token, with a prompt made of
the parent's prompt, the parent's reply and `prompt_tokens` new tokens; others at `send_s`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass
class Req:
    request_id: str
    prompt_tokens: int  # roots: whole prompt; children: tokens appended to parent prompt + reply
    max_new_tokens: int
    send_s: float | None = None  # roots: send time from the workload start
    session_id: str | None = None
    parent_id: str | None = None
    turn: int = 0
    think_s: float = 0.0
    prefix_of: str | None = (
        None  # shares this many leading tokens with request `prefix_of` (microbench)
    )
    prefix_tokens: int = 0


def lognormal_lengths(
    rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int
) -> np.ndarray:
    return np.clip(np.round(median * np.exp(sigma * rng.standard_normal(n))), lo, hi).astype(int)


MIXED = dict(
    prompt_median=512,
    prompt_sigma=0.8,
    prompt_lo=32,
    prompt_hi=2048,
    out_median=128,
    out_sigma=0.6,
    out_lo=16,
    out_hi=512,
)


def w_closed(name: str, n: int, prompt: int, out: int) -> list[Req]:
    return [Req(f"{name}-{i:04d}", prompt, out, send_s=0.0) for i in range(n)]


def w_poisson(
    name: str, n: int, rate: float, seed: int, lengths: dict = MIXED, t0: float = 0.0
) -> list[Req]:
    rng = np.random.default_rng(seed)
    times = t0 + np.cumsum(rng.exponential(1.0 / rate, n))
    p = lognormal_lengths(
        rng,
        n,
        lengths["prompt_median"],
        lengths["prompt_sigma"],
        lengths["prompt_lo"],
        lengths["prompt_hi"],
    )
    o = lognormal_lengths(
        rng, n, lengths["out_median"], lengths["out_sigma"], lengths["out_lo"], lengths["out_hi"]
    )
    return [
        Req(f"{name}-{i:04d}", int(p[i]), int(o[i]), send_s=float(times[i] - times[0]))
        for i in range(n)
    ]


def w_burst(
    name: str, base_rate: float, seed: int, phases: tuple = ((10.0, 1), (5.0, 4), (10.0, 1))
) -> list[Req]:
    """Poisson at base_rate, then 4x base_rate, then base_rate again (piecewise-constant rate)."""
    rng = np.random.default_rng(seed)
    times, t_start = [], 0.0
    for dur, mult in phases:
        t = t_start
        while True:
            t += rng.exponential(1.0 / (base_rate * mult))
            if t >= t_start + dur:
                break
            times.append(t)
        t_start += dur
    n = len(times)
    p = lognormal_lengths(
        rng,
        n,
        MIXED["prompt_median"],
        MIXED["prompt_sigma"],
        MIXED["prompt_lo"],
        MIXED["prompt_hi"],
    )
    o = lognormal_lengths(
        rng, n, MIXED["out_median"], MIXED["out_sigma"], MIXED["out_lo"], MIXED["out_hi"]
    )
    return [Req(f"{name}-{i:04d}", int(p[i]), int(o[i]), send_s=float(times[i])) for i in range(n)]


def w_multiturn(
    name: str, num_sessions: int, turns: int, session_rate: float, think_mean_s: float, seed: int
) -> list[Req]:
    """Sessions start Poisson; turn k>0 extends turn k-1's prompt + reply with new user tokens."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1.0 / session_rate, num_sessions))
    starts -= starts[0]
    reqs = []
    for s in range(num_sessions):
        sid = f"{name}-s{s:03d}"
        parent = None
        for k in range(turns):
            rid = f"{sid}-t{k}"
            new = int(rng.integers(384, 769)) if k == 0 else int(rng.integers(64, 257))
            out = int(rng.integers(64, 193))
            think = 0.0 if k == 0 else float(rng.exponential(think_mean_s))
            reqs.append(
                Req(
                    rid,
                    new,
                    out,
                    send_s=float(starts[s]) if k == 0 else None,
                    session_id=sid,
                    parent_id=parent,
                    turn=k,
                    think_s=think,
                )
            )
            parent = rid
    return reqs


def w_azure(name: str, rows: list[list[float]], stretch: float) -> list[Req]:
    """Azure LLM 2023 conv rows (t_s, context, generated), already clipped; gaps times `stretch`."""
    t_first = rows[0][0]
    return [
        Req(f"{name}-{i:04d}", int(c), int(g), send_s=(t - t_first) * stretch)
        for i, (t, c, g) in enumerate(rows)
    ]


PRESSURE_LEN = dict(
    prompt_median=640,
    prompt_sigma=0.4,
    prompt_lo=256,
    prompt_hi=1024,
    out_median=200,
    out_sigma=0.4,
    out_lo=64,
    out_hi=384,
)


def rename(reqs: list[Req], name: str) -> list[Req]:
    return [
        Req(**{**asdict(r), "request_id": name + r.request_id[r.request_id.index("-") :]})
        for r in reqs
    ]


def microbench_plan() -> list[tuple[dict, list[Req]]]:
    """Closed batches for the per-step cost fit: prefill (batch x prompt, long prompts chunked by
    token budget) and decode (batch x context; the context is one shared prefix, computed once by a
    primer request, so each decode step reads batch x context tokens of KV)."""
    plan = []
    for b in (1, 4, 16):
        for p in (256, 1024, 2048):
            plan.append(
                (
                    {
                        "bench": "prefill",
                        "batch_size": b,
                        "cfg_prompt_tokens": p,
                        "context_tokens": 0,
                    },
                    [Req(f"mb-pf-b{b}-p{p}-{i:03d}", p, 2, send_s=0.0) for i in range(b)],
                )
            )
    for p in (4096, 8192):
        plan.append(
            (
                {
                    "bench": "prefill_chunked",
                    "batch_size": 1,
                    "cfg_prompt_tokens": p,
                    "context_tokens": 0,
                },
                [Req(f"mb-pfc-p{p}-000", p, 2, send_s=0.0)],
            )
        )
    for c in (512, 2048, 4096):
        for b in (1, 8, 32, 64, 128):
            primer = Req(f"mb-dec-b{b}-c{c}-primer", c, 1, send_s=0.0)
            batch = [
                Req(f"mb-dec-b{b}-c{c}-{i:03d}", 15, 32, parent_id=primer.request_id, think_s=0.0)
                for i in range(b)
            ]
            plan.append(
                (
                    {
                        "bench": "decode",
                        "batch_size": b,
                        "cfg_prompt_tokens": 16,
                        "context_tokens": c,
                    },
                    [primer, *batch],
                )
            )
    return plan


def microbench_mixed_plan(scale: int = 1) -> list[tuple[dict, list[Req]]]:
    """Decode batches whose contexts differ (the homogeneous `microbench_plan` cannot tell a cost
    of the longest sequence from one of the mean context). One primer of the longest context is
    computed first; at 1.5 s every decode request arrives at once, sharing the primer's first
    `context` tokens (whole blocks, a prefix hit) plus 16 tokens of its own, and decodes 32 tokens.
    `scale` divides every length (CPU smoke check)."""

    def spread(b: int, lo: int, hi: int) -> list[int]:  # evenly spaced, whole 256-token blocks
        return [int(round((lo + (hi - lo) * i / max(b - 1, 1)) / 256)) * 256 for i in range(b)]

    shapes: dict[str, list[tuple[int, list[int]]]] = {
        "mixed_half_512_4096": [(b, [512] * (b // 2) + [4096] * (b - b // 2)) for b in (8, 32, 64)],
        "mixed_uniform_256_6144": [(b, spread(b, 256, 6144)) for b in (8, 32, 64, 128)],
        "mixed_one_long_6144": [(b, [6144] + [256] * (b - 1)) for b in (8, 32, 64)],
        "mixed_quarter_4096_512": [
            (b, [4096] * (b // 4) + [512] * (b - b // 4)) for b in (32, 128)
        ],
    }
    plan = []
    for bench, cases in shapes.items():
        for b, ctxs in cases:
            ctxs = [max(c // scale, 1) for c in ctxs]
            top = max(ctxs)
            primer = Req(f"mb-{bench}-b{b}-primer", top, 1, send_s=0.0)
            batch = [
                Req(
                    f"mb-{bench}-b{b}-{i:03d}",
                    c + 16 // min(scale, 16),
                    32 // min(scale, 8),
                    send_s=1.5,
                    prefix_of=primer.request_id,
                    prefix_tokens=c,
                )
                for i, c in enumerate(ctxs)
            ]
            cfg = {
                "bench": bench,
                "batch_size": b,
                "cfg_prompt_tokens": 16,
                "context_tokens": int(round(sum(ctxs) / len(ctxs))),
            }
            plan.append((cfg, [primer, *batch]))
    return plan


def microbench_small_plan(scale: int = 1) -> list[tuple[dict, list[Req]]]:
    """Small prefills beside a running decode batch: the mixed steps of lightly loaded serving
    (a 100-900-token prompt, or the new part of a later turn after a prefix hit, sharing a step
    with 0-16 decoding sequences), which `microbench_plan` (prompts of 256-2048 tokens in batches)
    and `microbench_mixed_plan` (decode only) leave to extrapolation. One primer computes a shared
    prefix; at 0.3 s the decode batch arrives (the primer's first `context` tokens + 16 of its
    own, 96 tokens each); at 0.6, 0.8, 1.0 and 1.2 s one prefill each (2 tokens out), fresh or
    after a `hit`-token prefix hit on the primer. `scale` divides every length (CPU smoke)."""
    plan = []
    for hit in (0, 1024):
        for ctx in (512, 1536):
            for b in (0, 1, 8, 16):
                for p in (96, 320, 640):
                    tag = f"mb-small-h{hit}-c{ctx}-b{b}-p{p}"
                    primer = Req(f"{tag}-primer", max(ctx, hit) // scale + 16, 1, send_s=0.0)
                    batch = [
                        Req(
                            f"{tag}-d{i:02d}",
                            (ctx + 16) // scale,
                            96 // min(scale, 8),
                            send_s=0.3,
                            prefix_of=primer.request_id,
                            prefix_tokens=ctx // scale,
                        )
                        for i in range(b)
                    ]
                    prefills = [
                        Req(
                            f"{tag}-p{j}",
                            (hit + p) // scale,
                            2,
                            send_s=0.6 + 0.2 * j,
                            prefix_of=primer.request_id if hit else None,
                            prefix_tokens=hit // scale,
                        )
                        for j in range(4)
                    ]
                    cfg = {
                        "bench": f"small_prefill_hit{hit}",
                        "batch_size": b,
                        "cfg_prompt_tokens": p,
                        "context_tokens": ctx,
                    }
                    plan.append((cfg, [primer, *batch, *prefills]))
    return plan


def w_shared_prompt(
    name: str, n: int, rate: float, seed: int, system_tokens: int = 1024, lengths: dict = MIXED
) -> list[Req]:
    """Independent requests (no sessions) that all start with one system prompt of
    `system_tokens` tokens, then a user part of lognormal length: the most common prefix sharing
    in production, which only per-block hash ids can express."""
    reqs = w_poisson(name, n, rate, seed, lengths)
    first = reqs[0].request_id
    for r in reqs:
        r.prompt_tokens += system_tokens
        if r.request_id != first:
            r.prefix_of, r.prefix_tokens = first, system_tokens
    return reqs


def w_sessions_shared(
    name: str,
    num_sessions: int,
    turns: int,
    session_rate: float,
    think_mean_s: float,
    seed: int,
    system_tokens: int,
    scale: int = 1,
) -> list[Req]:
    """`w_multiturn` sessions whose first turn starts with one system prompt of `system_tokens`
    tokens (so every later turn does too): the policy A/B workload, where a cached block may be a
    session's own or the shared prompt. `scale` divides every length (CPU smoke)."""
    reqs = w_multiturn(name, num_sessions, turns, session_rate, think_mean_s, seed)
    first = reqs[0].request_id
    for r in reqs:
        r.prompt_tokens = max(r.prompt_tokens // scale, 2)
        r.max_new_tokens = max(r.max_new_tokens // scale, 2)
        if r.turn == 0:
            r.prompt_tokens += system_tokens // scale
            if r.request_id != first:
                r.prefix_of, r.prefix_tokens = first, system_tokens // scale
    return reqs


def azure_workload(path: Path, num: int = 80, rate: float = 2.4) -> tuple[list[Req], dict]:
    """The Azure conversation window (azure_conv_window.json at `path`): its first `num` rows,
    their gaps stretched to `rate` requests per second."""
    azure = json.loads(path.read_text())
    rows = azure["rows"][:num]
    window_rate = (len(rows) - 1) / (rows[-1][0] - rows[0][0])
    stretch = window_rate / rate
    meta = {
        "kind": "trace",
        **azure["meta"],
        "num": len(rows),
        "window_rate_rps": window_rate,
        "time_stretch": stretch,
        "target_rate_rps": rate,
    }
    return w_azure("azure_conv_sample", rows, stretch), meta


# The validation request lists by name (capture.py's main plan and its portable `shared` part;
# the vLLM capture replays the same ones): each builds (requests, metadata).
NAMED_WORKLOADS: dict[str, Callable[[], tuple[list[Req], dict]]] = {
    "closed_b16": lambda: (
        w_closed("closed_b16", 16, 1024, 128),
        {"kind": "closed", "batch": 16, "prompt": 1024, "output": 128},
    ),
    "closed_b64": lambda: (
        w_closed("closed_b64", 64, 512, 128),
        {"kind": "closed", "batch": 64, "prompt": 512, "output": 128},
    ),
    "poisson_r3": lambda: (
        w_poisson("poisson_r3", 75, 3.0, seed=31),
        {"kind": "poisson", "rate_rps": 3.0, **MIXED},
    ),
    "poisson_r6": lambda: (
        w_poisson("poisson_r6", 150, 6.0, seed=32),
        {"kind": "poisson", "rate_rps": 6.0, **MIXED},
    ),
    "poisson_r9": lambda: (
        w_poisson("poisson_r9", 220, 9.0, seed=33),
        {"kind": "poisson", "rate_rps": 9.0, **MIXED},
    ),
    "multiturn": lambda: (
        w_multiturn("multiturn", 24, 4, 1.5, 1.5, seed=41),
        {
            "kind": "multiturn",
            "sessions": 24,
            "turns": 4,
            "session_rate_rps": 1.5,
            "think_mean_s": 1.5,
            "first_prompt": [384, 768],
            "new_tokens_per_turn": [64, 256],
            "output": [64, 192],
        },
    ),
    "burst_4x": lambda: (
        w_burst("burst_4x", 2.5, seed=51),
        {
            "kind": "burst",
            "base_rate_rps": 2.5,
            "phases_s_mult": [[10, 1], [5, 4], [10, 1]],
            **MIXED,
        },
    ),
    "shared_prompt": lambda: (
        w_shared_prompt("shared_prompt", 120, 6.0, seed=71),
        {"kind": "shared_prompt", "rate_rps": 6.0, "system_tokens": 1024, **MIXED},
    ),
}
