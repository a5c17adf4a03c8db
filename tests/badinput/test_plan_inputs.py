"""The planner's inputs (issue 30): a plan or price file that is not UTF-8, not YAML, empty, or
holds a key twice; an infinite, missing or absurd price; a search space listing a choice twice;
a launcher whose optional extra is missing; an output path that is a file: each is one line
naming the file or key, exit 2, before any simulation, and an earlier plan in --out is kept.
YAML 1.1 reads an unquoted `1:1` as 61: the planner keeps the text written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cachepilot_sim.config import ConfigError
from cachepilot_sim.plan import load_plan
from cachepilot_sim.plan.config import load_prices
from cachepilot_sim.tools import plan as plan_tool
from tests.badinput.refusal import assert_refused

SAMPLE = "samples:azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
PLAN_YAML = f"""\
name: tiny
simulation:
  - +experiment=azure_conv
  - replay.path={SAMPLE}
  - replay.limit=60
  - replay.time_scale=0.05
sla: {{ttft_p99_s: 2.0, tpot_p99_ms: 50.0, goodput_fraction: 0.95}}
space:
  gpus: [h200]
  max_replicas: 2
jobs: 1
"""


def _plan(tmp_path: Path, text: str | bytes = PLAN_YAML) -> Path:
    path = tmp_path / "plan.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


FILES: list[tuple[str, str | bytes, str]] = [
    ("not UTF-8", b"name: caf\xe9\n", "not UTF-8"),
    ("unclosed bracket", "space: {gpus: [h200\n", "invalid YAML"),
    ("bad indentation", "name: x\n  space: 1\n", "invalid YAML"),
    ("tab indentation", "space:\n\tgpus: [h200]\n", "invalid YAML"),
    ("duplicated key", "name: a\nname: b\n", "duplicate key"),
    ("empty file", "", "empty"),
    ("a list", "- a\n- b\n", "not a mapping"),
    ("a scalar", "42\n", "not a mapping"),
    (
        "base-60 float refused with its text",
        PLAN_YAML.replace("ttft_p99_s: 2.0", "ttft_p99_s: 1:30"),
        "1:30",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("case", "text", "named"), FILES, ids=[f[0] for f in FILES])
def test_unreadable_plan_file_is_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, text: str | bytes, named: str
) -> None:
    out = tmp_path / "out"
    argv = ["--config", str(_plan(tmp_path, text)), "--out", str(out)]
    line = assert_refused(plan_tool.main, argv, capsys, "plan.yaml", named)
    assert "5400" not in line and "90.0" not in line  # never the YAML 1.1 reading
    assert not out.exists()


def test_base_60_ratio_is_kept_as_written_in_file_and_override(tmp_path: Path) -> None:
    text = PLAN_YAML.replace("  max_replicas: 2", "  max_replicas: 2\n  pd_splits: [1:1, 1:2]")
    assert load_plan(_plan(tmp_path, text), []).space.pd_splits == ["1:1", "1:2"]
    plan = load_plan(_plan(tmp_path), ["space.pd_splits=[1:3,colocated]"])
    assert plan.space.pd_splits == ["1:3", "colocated"]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("space.gpus=[h200,h200]", "space.gpus"),
        ("space.tp=[1,1]", "space.tp"),
        ("space.offload_gb=[64,64.0]", "space.offload_gb"),
        ("space.policies=[perc,lru,perc]", "space.policies"),
        ("space.pd_splits=[1:1,1:1]", "space.pd_splits"),
        ("space.pd_splits=[61]", "space.pd_splits"),
        ("space", "expected key=value"),
        ("=3", "expected key=value"),
        ("space.gpus=[h200", "invalid YAML"),
    ],
)
def test_duplicate_choice_or_bad_override_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, named: str
) -> None:
    out = tmp_path / "out"
    argv = ["--config", str(_plan(tmp_path)), "--out", str(out), override]
    assert_refused(plan_tool.main, argv, capsys, named)
    assert not out.exists()


PRICES: list[tuple[str, str, str]] = [
    ("infinite", "usd_per_gpu_hour: .inf", "usd_per_gpu_hour"),
    ("NaN", "usd_per_gpu_hour: .nan", "usd_per_gpu_hour"),
    ("missing", "usd_per_gpu_hour_typo: 3.0", "usd_per_gpu_hour"),
    ("null", "usd_per_gpu_hour: null", "usd_per_gpu_hour"),
    ("a string", "usd_per_gpu_hour: '3.0'", "usd_per_gpu_hour"),
    ("zero", "usd_per_gpu_hour: 0", "usd_per_gpu_hour"),
    ("absurd", "usd_per_gpu_hour: 1.0e+300", "usd_per_gpu_hour"),
    ("huge integer", f"usd_per_gpu_hour: {2**2000}", "usd_per_gpu_hour"),
]


@pytest.mark.parametrize(("case", "price", "named"), PRICES, ids=[p[0] for p in PRICES])
def test_price_that_is_not_a_finite_positive_number_is_refused(
    tmp_path: Path, case: str, price: str, named: str
) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"prices:\n  h200: {{{price}, source: x, date: '2025'}}\n")
    plan = load_plan(_plan(tmp_path), [f"prices={prices}"])
    with pytest.raises(ConfigError, match=rf"prices\.h200\.{named}"):
        load_prices(plan)


def test_price_file_not_utf8_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_bytes(b"prices:\n  h200: {usd_per_gpu_hour: 3, source: \xff, date: '2025'}\n")
    argv = ["--config", str(_plan(tmp_path)), "--out", str(tmp_path / "o"), f"prices={prices}"]
    assert_refused(plan_tool.main, argv, capsys, "prices.yaml", "not UTF-8")


def test_missing_ray_extra_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # an installation without the extra
    out = tmp_path / "out"
    argv = ["--config", str(_plan(tmp_path)), "--out", str(out), "launcher=RAY"]
    assert_refused(plan_tool.main, argv, capsys, "'launcher'", "Ray is not installed")
    assert not out.exists()


@pytest.mark.parametrize("state", ["a file", "under a file"])
def test_output_path_that_is_a_file_is_refused_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str
) -> None:
    blocker = tmp_path / "out"
    blocker.write_text("keep")
    out = blocker if state == "a file" else blocker / "plan"
    argv = ["--config", str(_plan(tmp_path)), "--out", str(out)]
    assert_refused(plan_tool.main, argv, capsys, str(out))
    assert blocker.read_text() == "keep"


def test_earlier_plan_survives_a_refused_rerun_and_a_leftover_folder_is_healed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    path = _plan(tmp_path)
    assert plan_tool.main(["--config", str(path), "--out", str(out)]) == 0
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(earlier) == {"plan.json", "plan.md", "pareto.png"}
    # a rerun whose every configuration is refused (a model larger than the GPU): exit 2, kept
    argv = ["--config", str(path), "--out", str(out), "simulation=[model=llama3_70b]"]
    assert plan_tool.main(argv) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier
    # a killed writer's staging folder is healed; a complete rerun replaces the plan
    (out / ".staging").mkdir()
    (out / ".staging" / "plan.json").write_text("half")
    (out / "notes.txt").write_text("mine")
    assert plan_tool.main(["--config", str(path), "--out", str(out), "name=again"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "pareto.png", "plan.json",
                                                     "plan.md"]  # fmt: skip
    assert b'"again"' in (out / "plan.json").read_bytes()
