# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A run at a glance
#
# Loads every trace of one run (or sweep) folder and shows: VRAM by tier over time with evictions
# marked, TTFT and TPOT CDFs per policy, realized restore cost by workload class, and the reuse
# estimator's predicted idle gaps (1/λ) against the true ones.
#
# Set `CACHEPILOT_RUN_DIR` to a run folder (`outputs/<date>/<time>` of
# `python -m cachepilot_sim`); without it the notebook simulates a tiny run first. The figures are
# the ones `python -m cachepilot_sim.tools.plot <dir>` writes (drawn by `tools/figures.py`); the
# tables come from the documented polars queries in `cachepilot_sim/trace/derive.py`.

# %%
import os
import tempfile
from pathlib import Path

import polars as pl

from cachepilot_sim.tools.figures import (
    load_runs,
    plot_gap_estimates,
    plot_latency_cdfs,
    plot_restore_by_class,
    plot_vram,
)

run_dir = os.environ.get("CACHEPILOT_RUN_DIR")
if run_dir is None:
    from cachepilot_sim.tools.examples import tiny_run

    run_dir = tiny_run(Path(tempfile.mkdtemp(prefix="cachepilot_nb_")), num_requests=80)
run_dir = Path(run_dir)
traces, requests, gaps = load_runs(run_dir)
print(f"{len(traces)} traces, {requests.height} requests under {run_dir}")

# %% [markdown]
# ## VRAM by tier over time
# `gpu` is the KV pool in use (sampled engine iterations), `cpu` the CPU store, `flight` bytes
# being copied; red ticks are evictions.

# %%
_ = plot_vram(traces)

# %% [markdown]
# ## Latency CDFs per policy

# %%
_ = plot_latency_cdfs(requests)

# %% [markdown]
# ## Restore cost by workload class
# Realized reload + recompute seconds per class, from per-request results derived from the trace.

# %%
per_class = (
    requests.group_by("policy", "workload_class")
    .agg(
        ((pl.col("reload_us") + pl.col("recompute_us")).sum() / 1e6).alias("restore_s"),
        pl.len().alias("requests"),
    )
    .sort("workload_class", "policy")
)
print(per_class)

# %%
_ = plot_restore_by_class(requests)

# %% [markdown]
# ## The reuse estimator: predicted against true idle gaps
# Each point is a session coming back: x = its true idle gap, y = the gap the estimator predicted
# (1/λ) before seeing it. PERC ranks by P(resume within δ) = 1 − exp(−δλ).

# %%
_ = plot_gap_estimates(gaps)

# %%
gaps.group_by("policy").agg(
    pl.len().alias("returns"),
    (pl.col("predicted gap s") / pl.col("true gap s"))
    .log()
    .abs()
    .median()
    .exp()
    .alias("median ratio (either way)"),
)
