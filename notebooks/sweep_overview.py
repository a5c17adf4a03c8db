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
# # A sweep at a glance
#
# Gathers every job of a sweep folder (`python -m cachepilot_sim --multirun ...`) into one table,
# lists the jobs that failed and why, and plots metrics against the swept parameter with the
# spread over seeds. Set `CACHEPILOT_SWEEP_DIR`; without it a tiny sweep is run first.

# %%
import os
import tempfile
from pathlib import Path

import polars as pl

from cachepilot_sim.tools.collect import collect, default_param
from cachepilot_sim.tools.examples import tiny_sweep
from cachepilot_sim.tools.sweep_figures import fig_metric_vs_param

sweep_dir = os.environ.get("CACHEPILOT_SWEEP_DIR")
if sweep_dir is None:
    sweep_dir = tiny_sweep(Path(tempfile.mkdtemp(prefix="cachepilot_sweep_")) / "sweep")
sweep_dir = Path(sweep_dir)
result = collect(sweep_dir, Path(tempfile.mkdtemp(prefix="cachepilot_collect_")))
table = result["table"]
print(f"{len(result['jobs'])} jobs, {table.height} rows under {sweep_dir}")

# %% [markdown]
# ## Jobs that did not complete

# %%
print(pl.DataFrame(result["failed"]) if result["failed"] else "every job completed")

# %% [markdown]
# ## Mean and spread over seeds

# %%
param = default_param(table, result["params"]) or "seed"
print(f"swept: {result['params']}; plotting against {param}")
print(
    table.group_by("policy", param)
    .agg(
        pl.len().alias("seeds"),
        pl.col("realized_restore_s").mean().alias("restore_s_mean"),
        pl.col("realized_restore_s").std().alias("restore_s_sd"),
        pl.col("ttft_p95_s").mean().alias("ttft_p95_s_mean"),
    )
    .sort("policy", param)
)

# %%
_ = fig_metric_vs_param(table, "realized_restore_s", param)

# %%
_ = fig_metric_vs_param(table, "ttft_p95_s", param)
