"""The one definition of the event trace: one row per simulator event, ordered by (t_us, seq).

Writers pass `schema=TRACE_SCHEMA`; Parquet export, notebooks and docs read column meaning from
here. Kinds and columns are only ever appended, so older traces keep their encoding.
"""

from __future__ import annotations

import polars as pl

COMPONENTS = ("client", "scheduler", "batcher", "kv", "pcie", "sim")
EVENT_KINDS = (
    "arrive",  # a request reached the scheduler
    "admit",  # the batcher took it into the running batch
    "hit",  # its session's KV was on the GPU
    "reload_start",  # its session's KV started coming back from the CPU store
    "reload_done",
    "recompute",  # its session's earlier context had been dropped and is prefilled again
    "first_token",
    "finish",
    "reject",  # value = reason code (see REJECT_REASONS)
    "evict_offload",  # an idle session's KV chosen as victim and sent to the CPU store
    "offload_done",
    "evict_drop",  # an idle session's KV chosen as victim and discarded
    "preempt",  # a running request lost its KV (recompute preemption)
    "iteration",  # sampled engine iteration: blocks = sequences in batch, bytes = KV bytes in use
    # Appended kinds (new kinds go at the end so existing traces keep their physical encoding):
    "session_start",  # a new session got a front-end slot; value = us it waited for one
    "run_end",  # the last row of a complete run: t_us = simulated duration
    "reuse_gap",  # a session came back: value = true idle gap (us), score = the gap predicted
    #               by the reuse estimator before this observation (us; lambda = 1 / score)
    "swap_out",  # a preempted request's KV copied to the engine's CPU swap space (value = us)
    "swap_in",  # a swapped-out request's KV copied back as it resumes (value = us)
)
TIERS = ("gpu", "cpu", "none", "flight")
REJECT_REASONS = ("exceeds_kv_capacity", "queue_timeout", "admission")

TRACE_SCHEMA = pl.Schema(
    {  # type: ignore[arg-type]
        "t_us": pl.Int64,  # simulated time, integer microseconds
        "seq": pl.Int64,  # global event counter: orders rows that share t_us
        "component": pl.Enum(COMPONENTS),
        "kind": pl.Enum(EVENT_KINDS),
        "session": pl.Int64,  # -1 when not about one session
        "request": pl.Int64,  # -1 when not about one request
        "model": pl.Int32,
        "blocks": pl.Int64,  # KV blocks concerned (iteration: sequences in the batch)
        "bytes": pl.Int64,  # bytes concerned (iteration: KV pool bytes used + in flight)
        "tier": pl.Enum(TIERS),
        "score": pl.Float64,  # evictions: the policy's key head; reuse_gap: predicted gap; else NaN
        "value": pl.Int64,  # kind-specific: duration in us, or reason code for reject
        # Appended columns (issue 6): what derived per-request results and run metrics need.
        "class_index": pl.Int32,  # workload class (arrive, session_start); -1 otherwise
        "cost_us": pl.Float64,  # modelled cost: recompute/preempt paid, eviction expected; else NaN
    }
)
