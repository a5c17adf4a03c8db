"""A tiny mixed-spike run compared with committed golden per-request results.

An intended behaviour change regenerates the file: `python -m tests.scenario.test_golden`.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from cachepilot_sim.config import policy_config
from cachepilot_sim.sim import build
from tests.conftest import make_sim_config, make_workload

GOLDEN = Path(__file__).parents[1] / "data" / "golden_tiny_requests.csv"
COLUMNS = [
    "request",
    "session",
    "turn",
    "workload_class",
    "arrival_us",
    "first_token_us",
    "finish_us",
    "kv_source",
    "reload_us",
    "preemptions",
]


def tiny_run(policy: str) -> pl.DataFrame:
    cfg = make_sim_config(policy=policy_config(policy), workload=make_workload(num_requests=60))
    return build(cfg).run().requests.select(COLUMNS).with_columns(pl.lit(policy).alias("policy"))


def golden_frame() -> pl.DataFrame:
    return pl.concat([tiny_run(p) for p in ("perc", "lru", "priority")])


def test_tiny_runs_match_golden_results() -> None:
    expected = pl.read_csv(GOLDEN, schema=golden_frame().schema)
    assert_frame_equal(golden_frame(), expected)


if __name__ == "__main__":
    golden_frame().write_csv(GOLDEN)
    print(f"wrote {GOLDEN}")
