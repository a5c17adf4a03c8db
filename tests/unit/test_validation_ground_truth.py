"""Ground-truth folders: the committed H200 captures load and agree with themselves; metrics are
exact on a hand-made run; every kind of bad or partial ground truth stops with one line naming
the file and the column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from cachepilot_sim.validation.ground_truth import GroundTruthError, find_runs, load_ground_truth
from cachepilot_sim.validation.gt_stats import request_latencies, summarize

ROOT = Path(__file__).resolve().parents[2]
CAPTURED = ROOT / "experiments" / "validation" / "hf_cb" / "2026-12-01"
WORKLOADS = (
    "closed_b16", "closed_b64", "poisson_r3", "poisson_r6", "poisson_r9", "multiturn", "burst_4x",
    "azure_conv_sample", "pressure_queue", "pressure_soft_reset", "pressure_cpu_swap",
    "pressure_preempt",
)  # fmt: skip


def make_requests(**overrides: Any) -> dict[str, list[Any]]:
    """Three finished requests; request b continues request a's session after 5 ms of thought."""
    cols: dict[str, list[Any]] = {
        "request_id": ["a", "b", "c"],
        "session_id": ["s", "s", None],
        "parent_id": [None, "a", None],
        "send_us": [0, 1_305_000, 500_000],
        "prompt_tokens": [100, 300, 50],
        "output_tokens": [3, 2, 1],
        "first_token_us": [100_000, 1_400_000, 700_000],
        "end_us": [1_300_000, 1_600_000, 700_000],
        "token_us": [[100_000, 700_000, 1_300_000], [1_400_000, 1_600_000], [700_000]],
        "status": ["finished", "finished", "finished"],
        "num_soft_resets": [0, 1, 0],
    }
    cols.update(overrides)
    return cols


def make_folder(tmp_path: Path, steps: dict[str, list[Any]] | None = None,
                engine: Any = None, **overrides: Any) -> Path:  # fmt: skip
    folder = tmp_path / "wl" / "run1"
    folder.mkdir(parents=True)
    pl.DataFrame(make_requests(**overrides)).write_parquet(folder / "requests.parquet")
    if steps is not None:
        pl.DataFrame(steps).write_parquet(folder / "steps.parquet")
    engine = {"engine": "hand-made", "block_size": 16} if engine is None else engine
    (folder / "engine.json").write_text(json.dumps(engine))
    return folder


def test_every_committed_capture_loads_with_all_requests_finished_to_length() -> None:
    runs = find_runs(CAPTURED)
    assert {r.parent.name for r in runs} == set(WORKLOADS)
    assert all({r.name for r in runs if r.parent.name == w} == {"run1", "run2"} for w in WORKLOADS)
    for run in runs:
        gt = load_ground_truth(run)
        req = gt.requests
        assert gt.finished.height == req.height, run
        assert (req["output_tokens"] == req["max_new_tokens"]).all(), run
        assert gt.steps is not None and gt.steps["graph_captures"].sum() == 0, run
        assert gt.engine["engine"] == "transformers-continuous-batching"
        assert gt.engine["block_size"] == 256 and gt.engine["use_cuda_graph"] == [True, True]


def test_committed_run_pairs_replay_the_same_request_list() -> None:
    for wl in WORKLOADS:
        one, two = (load_ground_truth(CAPTURED / wl / r).requests for r in ("run1", "run2"))
        cols = ["request_id", "parent_id", "prompt_tokens", "max_new_tokens", "think_time_us"]
        assert one.select(cols).equals(two.select(cols)), wl


def test_committed_pressure_runs_preempt_and_multiturn_hits_the_prefix_cache() -> None:
    swaps = summarize(load_ground_truth(CAPTURED / "pressure_cpu_swap" / "run1"))
    resets = summarize(load_ground_truth(CAPTURED / "pressure_soft_reset" / "run1"))
    assert swaps["num_cpu_swaps"] >= 1 and swaps["num_soft_resets"] == 0
    assert resets["num_soft_resets"] >= 1 and resets["num_cpu_swaps"] == 0
    mt = load_ground_truth(CAPTURED / "multiturn" / "run1").requests
    later = mt.filter(pl.col("turn") > 0)
    # first turns never hit; later turns mostly do (the engine evicts the most recently freed
    # cached blocks first, so some turns lose their parent's blocks before they arrive)
    assert (mt.filter(pl.col("turn") == 0)["prefix_hit_tokens"] == 0).all()
    assert (later["prefix_hit_tokens"] > 0).mean() > 0.5  # type: ignore[operator]
    assert (later["send_us"] >= later.join(mt, left_on="parent_id", right_on="request_id")
            ["end_us_right"]).all()  # fmt: skip


def test_summary_metrics_are_exact_on_a_hand_made_run(tmp_path: Path) -> None:
    gt = load_ground_truth(make_folder(tmp_path))
    s = summarize(gt)
    assert gt.workload == "wl"
    assert (s["requests"], s["finished"], s["failed"], s["missing"]) == (3, 3, 0, 0)
    assert s["ttft_ms_mean"] == pytest.approx((100 + 95 + 200) / 3)
    assert s["tpot_ms_mean"] == pytest.approx((600 + 200) / 2)  # c has one token: no TPOT
    assert s["itl_ms_mean"] == pytest.approx((600 + 600 + 200) / 3)
    assert s["e2e_ms_p50"] == pytest.approx(295)
    assert s["ttft_ms_p99"] == pytest.approx(100 + 0.98 * 100)  # linear interpolation
    assert s["throughput_tok_s"] == pytest.approx(6 / 1.6)
    assert s["num_soft_resets"] == 1 and s["num_cpu_swaps"] is None and "steps" not in s
    lat = request_latencies(gt)
    assert lat["tpot_us"].to_list() == [600_000, 200_000, None]


def test_partial_ground_truth_counts_unfinished_requests_but_measures_finished_ones(
    tmp_path: Path,
) -> None:
    folder = make_folder(
        tmp_path,
        status=["finished", "missing", "failed"],
        first_token_us=[100_000, None, None],
        end_us=[1_300_000, None, None],
        token_us=[[100_000, 700_000, 1_300_000], None, None],
        output_tokens=[3, 0, 0],
    )
    s = summarize(load_ground_truth(folder))
    assert (s["finished"], s["missing"], s["failed"], s["ttft_ms_mean"]) == (1, 1, 1, 100)


def test_steps_parquet_is_optional_but_checked_when_present(tmp_path: Path) -> None:
    steps = {"start_us": [0, 10], "end_us": [10, 25], "num_requests": [1, 2],
             "prefill_tokens": [100, 0], "decode_tokens": [0, 2]}  # fmt: skip
    s = summarize(load_ground_truth(make_folder(tmp_path, steps=steps)))
    assert s["steps"] == 2 and s["step_ms_mean"] == pytest.approx(0.0125)
    bad = make_folder(tmp_path / "x", steps={**steps, "decode_tokens": [0, -1]})
    with pytest.raises(GroundTruthError, match=r"steps\.parquet: column 'decode_tokens'"):
        load_ground_truth(bad)


@pytest.mark.parametrize(
    ("overrides", "column", "reason"),
    [
        ({"send_us": [0.0, 1.3, 0.5]}, "send_us", "expected integer"),
        ({"request_id": ["a", "a", "c"]}, "request_id", "duplicated"),
        ({"status": ["finished", "done", "finished"]}, "status", "is not one of"),
        ({"send_us": [-1, 1_305_000, 500_000]}, "send_us", "is negative"),
        ({"first_token_us": [100_000, 1_200_000, 700_000]}, "first_token_us", "before send_us"),
        ({"end_us": [1_300_000, 1_300_000, 700_000], "token_us": [None, None, None]}, "end_us",
         "before first_token_us"),
        ({"first_token_us": [None, 1_400_000, 700_000]}, "first_token_us", "is null"),
        ({"output_tokens": [4, 2, 1]}, "token_us", "length other than output_tokens"),
        ({"token_us": [[100_000, 700_000, 1_200_000], [1_400_000, 1_600_000], [700_000]]},
         "token_us", "does not end at end_us"),
        ({"parent_id": [None, "zz", None]}, "parent_id", "not in the file"),
        ({"prompt_tokens": ["100", "300", "50"]}, "prompt_tokens", "expected integer"),
    ],
)  # fmt: skip
def test_bad_requests_column_is_named_with_its_file(
    tmp_path: Path, overrides: dict[str, Any], column: str, reason: str
) -> None:
    folder = make_folder(tmp_path, **overrides)
    with pytest.raises(GroundTruthError) as err:
        load_ground_truth(folder)
    msg = str(err.value)
    assert str(folder / "requests.parquet") in msg and f"'{column}'" in msg and reason in msg
    assert "\n" not in msg


def test_missing_required_column_is_named(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    df = pl.read_parquet(folder / "requests.parquet").drop("end_us")
    df.write_parquet(folder / "requests.parquet")
    with pytest.raises(GroundTruthError, match=r"requests\.parquet: missing column 'end_us'"):
        load_ground_truth(folder)


def test_no_finished_request_is_partial_ground_truth(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, status=["failed", "failed", "missing"])
    with pytest.raises(GroundTruthError, match="column 'status' has no finished request"):
        load_ground_truth(folder)


@pytest.mark.parametrize(
    ("engine", "reason"),
    [("[1, 2]", "expected a JSON object"), ('{"block_size": 16}', "key 'engine'"),
     ("{not json", "cannot read as JSON")],
)  # fmt: skip
def test_bad_engine_json_is_named(tmp_path: Path, engine: str, reason: str) -> None:
    folder = make_folder(tmp_path)
    (folder / "engine.json").write_text(engine)
    with pytest.raises(GroundTruthError, match=rf"engine\.json: .*{reason}"):
        load_ground_truth(folder)


def test_missing_or_corrupt_files_are_named(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    (folder / "engine.json").unlink()
    with pytest.raises(GroundTruthError, match=r"engine\.json: file not found"):
        load_ground_truth(folder)
    (folder / "requests.parquet").write_text("not parquet")
    with pytest.raises(GroundTruthError, match=r"requests\.parquet: cannot read as Parquet"):
        load_ground_truth(folder)
    with pytest.raises(GroundTruthError, match="not a folder"):
        load_ground_truth(tmp_path / "nowhere")
