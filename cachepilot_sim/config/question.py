"""The question a run answered, in words, for the first lines of its answer: which traffic (trace,
the slice of it replayed, how much faster or slower than recorded), on what (model, memory, GPUs,
engine and hardware profile with its measured error), against which SLA, compared how (policies,
seeds, the metric ranked on). A run that replays a slice or a compressed clock says so here, so
the answer never reads as the trace as recorded when it is not.
"""

from __future__ import annotations

from pathlib import Path

from cachepilot_sim.config.run import RunConfig
from cachepilot_sim.config.workload import TraceFormat


def traffic(cfg: RunConfig) -> str:
    """The traffic simulated: the trace, its slice and time scale, or the synthetic workload."""
    rc = cfg.replay
    if rc.format == TraceFormat.NONE:
        w = cfg.workload
        return f"synthetic workload {w.name!r}, {w.num_requests:,} requests"
    part = f"the first {rc.limit:,} requests" if rc.limit else "every request"
    if rc.time_scale == 1:
        clock = "at its recorded times"
    elif rc.time_scale < 1:
        clock = (
            f"{1 / rc.time_scale:g}x faster than recorded (time_scale {rc.time_scale:g}: "
            "not the trace as recorded)"
        )
    else:
        clock = f"{rc.time_scale:g}x slower than recorded (time_scale {rc.time_scale:g})"
    sliced = "" if not rc.limit else " (a slice, not the whole trace)"
    return f"{rc.format!s} trace {Path(rc.path).name}: {part}{sliced}, replayed {clock}"


def sla(cfg: RunConfig) -> str:
    """The SLO terms goodput counts against."""
    if cfg.replay.format != TraceFormat.NONE:
        rc = cfg.replay
        return f"TTFT <= {rc.ttft_slo_ms:g} ms and TPOT <= {rc.tpot_slo_ms:g} ms per request"
    classes = getattr(cfg.workload, "classes", {}) or {}
    terms = [
        f"{name}: TTFT <= {c.ttft_slo_ms:g} ms, TPOT <= {c.tpot_slo_ms:g} ms"
        for name, c in classes.items()
    ]
    return "; ".join(terms) if terms else "each class's TTFT and TPOT SLOs"


def kv_memory(cfg: RunConfig) -> str:
    """What sizes the KV pool, in words: `vram_gb`, or the engine profile's own pool, which
    `vram_gb` does not size (engine.kv_pool_blocks)."""
    if blocks := cfg.engine.kv_pool_blocks:
        return f"the engine's KV pool of {blocks} x {cfg.kv.block_tokens}-token blocks"
    return f"{cfg.vram_gb:g} GB VRAM"


def serving_setup(cfg: RunConfig) -> str:
    """Model, memory and GPUs: one GPU, or the cluster's replicas and split."""
    gpu = cfg.gpu.name + (f" x tp{cfg.tp}" if cfg.tp > 1 else "")
    cluster = cfg.cluster
    if cluster.disaggregated:
        where = (
            f"a disaggregated cluster of {cluster.prefill_replicas} prefill + "
            f"{cluster.decode_replicas} decode replicas ({gpu} each, router {cfg.router.name})"
        )
    elif cluster.replicas > 1:
        where = f"a cluster of {cluster.replicas} replicas ({gpu} each, router {cfg.router.name})"
    else:
        where = f"one {gpu}"
    return f"{cfg.model.name} on {where}, {kv_memory(cfg)} per replica"


def question_lines(cfg: RunConfig, trust_label: str) -> list[str]:
    """The lines every run's answer opens with (terminal; summary.md and report.md through
    `markdown_lines`): traffic, serving setup, SLA, the engine's trust label, the comparison."""
    policies = cfg.policy_names()
    seeds = f"seeds {cfg.seed}..{cfg.seed + cfg.seeds - 1}" if cfg.seeds > 1 else f"seed {cfg.seed}"
    return [
        f"Simulated: {traffic(cfg)}.",
        f"Served by: {serving_setup(cfg)}.",
        f"SLA (goodput counts requests meeting it): {sla(cfg)}.",
        # "trust: " as the line has always begun (grep and log readers look for it).
        f"trust: {trust_label}",
        f"Compared: {len(policies)} polic{'y' if len(policies) == 1 else 'ies'} over {seeds}, "
        f"ranked on {cfg.objective}.",
    ]


def markdown_lines(lines: list[str]) -> list[str]:
    """`question_lines` for markdown: each its own paragraph, first letter capital."""
    out: list[str] = []
    for line in lines:
        out += [line[:1].upper() + line[1:], ""]
    return out
