"""Prefix-cache hits of a replay against the engine's: tokens each request found cached.

Both sides give `prefix_hit_tokens` per request, the prompt tokens served from the prefix cache
at its first admission (the engine's `position_offset` after its prefix match, which keeps one
token to compute; the simulator's prompt minus what that admission prefilled). A request's hits
depend on which blocks were shared and on what was evicted before it came, so agreement here
checks the sharing model that TTFT errors only hint at.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from cachepilot_sim.validation.ground_truth import REQUESTS_FILE, GroundTruth, GroundTruthError

COLUMN = "prefix_hit_tokens"


def compare_prefix_hits(sim: GroundTruth, real: GroundTruth) -> dict[str, Any]:
    """Hit tokens of the requests both sides admitted (non-null on both), matched by id:
    totals (`sim_hit_tokens`, `real_hit_tokens`), `hit_tokens_err` = (sim - real) / real (None
    when the engine hit nothing), per-request mean absolute error in tokens (`mae_tokens`) and
    the fraction of requests whose hits agree exactly (`exact_fraction`). A side without the
    column is a GroundTruthError naming its file."""
    for gt in (sim, real):
        if COLUMN not in gt.requests.columns:
            raise GroundTruthError(f"{gt.path / REQUESTS_FILE}: missing column '{COLUMN}' (int)")
    both = (
        real.requests.select("request_id", real=pl.col(COLUMN))
        .join(sim.requests.select("request_id", sim=pl.col(COLUMN)), on="request_id")
        .drop_nulls()
    )
    num = both.height
    real_total, sim_total = int(both["real"].sum()), int(both["sim"].sum())
    diff = (both["sim"] - both["real"]).abs()
    return {
        "requests": num,
        "sim_hit_tokens": sim_total,
        "real_hit_tokens": real_total,
        "hit_tokens_err": (sim_total - real_total) / real_total if real_total else None,
        "mae_tokens": float(diff.mean()) if num else None,  # type: ignore[arg-type]
        "exact_fraction": float((diff == 0).mean()) if num else None,  # type: ignore[arg-type]
        "requests_hit_real": int((both["real"] > 0).sum()),
        "requests_hit_sim": int((both["sim"] > 0).sum()),
    }
