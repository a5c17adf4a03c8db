"""`validate --compare-policies` (validation/policy_effects.py): predicted vs measured differences
between policies, on ground-truth folders made from the committed multiturn capture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from cachepilot_sim.tools.validate import main, sim_config
from cachepilot_sim.validation.engine_settings import EngineSettingsError, resolve
from cachepilot_sim.validation.ground_truth import GroundTruth, load_ground_truth
from cachepilot_sim.validation.policy_effects import (
    METRICS,
    collect,
    compare_policies,
    recompute_tokens,
)

ROOT = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-01"
MULTITURN = ROOT / "multiturn"


def add_run(
    root: Path, policy: str, run: int, source: Path, ttft_shift_us: int = 0, **engine: object
) -> Path:
    """`root/<policy>/multiturn/run<run>`: a copy of `source` whose engine.json names `policy`
    (and `engine`'s keys), every token `ttft_shift_us` later (TTFT and E2E grow by it)."""
    dest = root / policy / "multiturn" / f"run{run}"
    shutil.copytree(source, dest)
    meta = json.loads((dest / "engine.json").read_text())
    meta.update(policy=policy, **engine)
    (dest / "engine.json").write_text(json.dumps(meta))
    if ttft_shift_us:
        req = pl.read_parquet(dest / "requests.parquet")
        req = req.with_columns(
            pl.col("first_token_us") + ttft_shift_us,
            pl.col("end_us") + ttft_shift_us,
            pl.col("token_us").list.eval(pl.element() + ttft_shift_us),
        )
        req.write_parquet(dest / "requests.parquet")
    return dest


@pytest.fixture(scope="module")
def two_policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mru: the capture's two runs; lru: the same runs with every token 400 ms later."""
    root = tmp_path_factory.mktemp("policies")
    for run in (1, 2):
        add_run(root, "mru", run, MULTITURN / f"run{run}")
        add_run(root, "lru", run, MULTITURN / f"run{run}", ttft_shift_us=400_000)
    return root


def ttft_mean_ms(gt: GroundTruth) -> float:
    df = gt.requests.filter(pl.col("status") == "finished")
    return float(((df["first_token_us"] - df["send_us"]) / 1e3).mean())  # type: ignore[arg-type]


def test_measured_difference_is_the_runs_mean_and_spread_the_larger_run_change(
    two_policies: Path,
) -> None:
    result = compare_policies(two_policies, "hf_cb", sim_config)
    row = next(p for p in result["pairs"] if p["metric"] == "ttft_mean")
    assert (row["a"], row["b"], row["workload"]) == ("mru", "lru", "multiturn")
    runs = [load_ground_truth(MULTITURN / f"run{k}") for k in (1, 2)]
    mru = [ttft_mean_ms(gt) for gt in runs]
    lru = [m + 400.0 for m in mru]
    expect = (sum(lru) / 2 - sum(mru) / 2) / (sum(mru) / 2)
    assert row["measured"] == pytest.approx(expect, rel=1e-6)
    spread = max(abs(mru[1] - mru[0]) / mru[0], abs(lru[1] - lru[0]) / lru[0])
    assert row["spread"] == pytest.approx(spread, rel=1e-6)
    # Same request list, cache big enough for both: the replay predicts almost no difference,
    # so a measured +400 ms is far outside 3 points and the sign cannot agree with ~0 both ways.
    assert abs(row["predicted"]) < 0.03 and row["measured"] > 0.5
    assert row["within_3pp"] is False
    hits = next(p for p in result["pairs"] if p["metric"] == "prefix_hit_tokens")
    assert hits["measured"] == 0.0  # shifted timings, the same hits
    assert {p["metric"] for p in result["pairs"]} == set(METRICS)


def test_every_number_names_the_engine_and_hardware_profile(two_policies: Path) -> None:
    result = compare_policies(two_policies, "hf_cb", sim_config)
    assert result["engine"] == "hf_cb"
    for row in result["pairs"]:
        assert "engine hf_cb" in row["predicted_by"] and "hardware h200" in row["predicted_by"]
        assert row["measured_on"] == "NVIDIA H200"
    for own in result["policies"]:
        assert own["replayed_as"] == own["policy"]  # each capture replayed with its own policy
        assert set(own["errors"]) == set(METRICS)


def test_json_has_the_issue_schema(two_policies: Path, tmp_path: Path) -> None:
    out = tmp_path / "effects.json"
    main(["--compare-policies", str(two_policies), "--json", str(out)])
    data = json.loads(out.read_text())
    assert isinstance(data["engine"], str) and data["pairs"]
    for row in data["pairs"]:
        for key in ("workload", "a", "b", "metric"):
            assert isinstance(row[key], str)
        for key in ("measured", "predicted", "spread"):
            assert row[key] is None or isinstance(row[key], float)


def test_one_run_only_reports_the_spread_as_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    add_run(tmp_path, "mru", 1, MULTITURN / "run1")
    add_run(tmp_path, "lfu", 1, MULTITURN / "run1", ttft_shift_us=10_000)
    main(["--compare-policies", str(tmp_path)])
    table = capsys.readouterr().out
    assert "| `multiturn` | mru -> lfu | ttft_mean |" in table
    line = next(x for x in table.splitlines() if "| ttft_mean |" in x)
    assert line.split("|")[6].strip() == "unknown"
    result = compare_policies(tmp_path, "hf_cb", sim_config)
    assert all(p["spread"] is None and p["within_spread"] is None for p in result["pairs"])


def one_line_error(root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["--compare-policies", str(root)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    return err


def test_a_policy_the_simulator_does_not_know_is_one_line_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    add_run(tmp_path, "mru", 1, MULTITURN / "run1")
    add_run(tmp_path, "belady2", 1, MULTITURN / "run1")
    err = one_line_error(tmp_path, capsys)
    assert "belady2/multiturn/run1/engine.json" in err and "'policy'" in err
    assert "not a policy the simulator knows" in err and "lru" in err


def test_captures_of_different_workloads_under_one_name_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    add_run(tmp_path, "mru", 1, MULTITURN / "run1")
    add_run(tmp_path, "lru", 1, ROOT / "closed_b16/run1", workload="multiturn")
    err = one_line_error(tmp_path, capsys)
    assert "workload 'multiturn'" in err and "captures of different workloads" in err


def test_a_run_without_a_policy_key_or_a_pair_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(MULTITURN / "run1", tmp_path / "plain" / "run1")
    err = one_line_error(tmp_path, capsys)
    assert "plain/run1/engine.json" in err and "'policy'" in err
    shutil.rmtree(tmp_path / "plain")
    add_run(tmp_path, "mru", 1, MULTITURN / "run1")
    assert "one policy only" in one_line_error(tmp_path, capsys)
    shutil.rmtree(tmp_path / "mru")
    add_run(tmp_path, "lfu", 1, MULTITURN / "run1")
    add_run(tmp_path, "perc", 1, MULTITURN / "run1")
    assert "no baseline policy (mru or lru)" in one_line_error(tmp_path, capsys)


def test_runs_are_ordered_by_folder_not_by_engine_json_run(two_policies: Path) -> None:
    caps = collect(two_policies)["multiturn"]
    assert [p.name for p in caps["mru"].paths] == ["run1", "run2"]


def conversation(send1_us: int, hit1: int) -> GroundTruth:
    """A 600-token prompt answered with 100 tokens (ends at 1 s), then its next turn."""
    frame = pl.DataFrame(
        {
            "request_id": ["t0", "t1"],
            "parent_id": [None, "t0"],
            "think_time_us": [0, 0],
            "send_us": [0, send1_us],
            "prompt_tokens": [600, 750],
            "output_tokens": [100, 10],
            "first_token_us": [10, send1_us + 10],
            "end_us": [1_000_000, send1_us + 50_000],
            "status": ["finished", "finished"],
            "prefix_hit_tokens": [0, hit1],
        }
    )
    return GroundTruth(Path("synthetic"), frame, None, {})


def test_recompute_counts_held_leading_blocks_a_request_missed() -> None:
    gt = conversation(2_000_000, 0)
    assert recompute_tokens(gt, gt.requests, 256) == 512  # both blocks of turn 0 were held
    gt = conversation(2_000_000, 512)
    assert recompute_tokens(gt, gt.requests, 256) == 0  # it hit them
    gt = conversation(2_000_000, 256)
    assert recompute_tokens(gt, gt.requests, 256) == 256
    gt = conversation(500_000, 0)
    assert recompute_tokens(gt, gt.requests, 256) == 0  # sent before turn 0 ended: nothing held


def test_engine_json_policy_is_replayed_as_that_policy() -> None:
    engine = load_ground_truth(MULTITURN / "run1").engine
    cfg = sim_config("hf_cb", [])
    got = resolve(MULTITURN / "run1", {**engine, "policy": "lfu"}, cfg)
    assert "policy=lfu" in got.overrides
    own = resolve(
        MULTITURN / "run1",
        {**engine, "policy": "none", "policy_hook": {"inner_evictions": 3}},
        cfg,
    )
    assert not any(o.startswith("policy=") for o in own.overrides)
    assert any("evicted 3 inner blocks" in n for n in own.notes)
    with pytest.raises(EngineSettingsError, match="'policy' = 7"):
        resolve(MULTITURN / "run1", {**engine, "policy": 7}, cfg)
    with pytest.raises(EngineSettingsError, match="not a policy the simulator knows"):
        resolve(MULTITURN / "run1", {**engine, "policy": "nope"}, cfg)


SMOKE = Path(__file__).resolve().parents[1] / "data/hf_cb_policy_smoke"


@pytest.mark.parametrize("policy", ["mru", "lru"])
def test_recompute_rule_matches_the_engines_own_count_on_a_real_capture(policy: str) -> None:
    gt = load_ground_truth(SMOKE / policy / "ab_sessions/run1")
    traffic = gt.engine["kv_traffic"]
    assert traffic["recomputed_prefix_tokens"] > 0  # blocks were lost and computed again
    block = gt.engine["block_size"]
    assert recompute_tokens(gt, gt.requests, block) == traffic["recomputed_prefix_tokens"]
    assert int(gt.requests["prefix_hit_tokens"].sum()) == traffic["prefix_hit_tokens"]
