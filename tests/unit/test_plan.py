"""The capacity planner (cachepilot_sim/plan, `cachepilot-sim plan`): monotone search over replica
counts, the same answer on rerun, the Pareto front, refusals and bad plans."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachepilot_sim.plan import Cell, Evaluation, load_plan, pareto_front
from cachepilot_sim.plan import search as search_mod
from cachepilot_sim.plan.config import PlanConfig
from cachepilot_sim.tools import plan as plan_tool

SAMPLE = "samples:azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
PLAN_YAML = """\
name: tiny
simulation:
  - +experiment=azure_conv
  - replay.path={sample}
  - replay.limit=120
  - replay.time_scale=0.05
sla: {{ttft_p99_s: 2.0, tpot_p99_ms: 50.0, goodput_fraction: 0.95}}
space:
  gpus: [h200, l40s]
  routers: [least_outstanding]
  max_replicas: 4
jobs: 1
"""


def write_plan(tmp_path: Path, text: str = PLAN_YAML) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text.format(sample=SAMPLE))
    return path


def make_eval(cell: Cell, scale: int, meets: bool) -> Evaluation:
    misses = {} if meets else {"ttft_p99_s": {"value": 3.0, "limit": 2.0}}
    return Evaluation(cell, scale, scale, 1.0, 10.0, 1.0, 10, 0, misses)


@pytest.mark.parametrize("needed", [1, 2, 5, 13, 16, 17])
def test_binary_search_finds_the_fewest_replicas_in_log_steps(
    monkeypatch: pytest.MonkeyPatch, needed: int
) -> None:
    seen: list[int] = []

    def fake(plan: PlanConfig, cell: Cell, scale: int) -> Evaluation:
        seen.append(scale)
        return make_eval(cell, scale, scale >= needed)

    monkeypatch.setattr(search_mod, "evaluate", fake)
    plan = PlanConfig()
    cell = search_mod.cells_of(plan)[0]
    result = search_mod.search_cell(plan, cell)
    assert result.best_scale == (needed if needed <= 16 else 0)
    assert len(seen) <= 1 + math.ceil(math.log2(16))  # not the 16 of a full scan
    misses = [s for s in seen if s < needed]
    assert all(s >= needed for s in seen if s not in misses)


@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=30))
def test_the_pareto_front_holds_exactly_the_undominated_rows(
    points: list[tuple[int, int]],
) -> None:
    rows = [
        {"usd_per_hour": float(c), "ttft_p99_s": float(t), "config": f"c{i}"}
        for i, (c, t) in enumerate(points)
    ]
    front = pareto_front(rows)

    def dominated(r: dict) -> bool:
        return any(
            (o["usd_per_hour"], o["ttft_p99_s"]) <= (r["usd_per_hour"], r["ttft_p99_s"])
            and (o["usd_per_hour"], o["ttft_p99_s"]) != (r["usd_per_hour"], r["ttft_p99_s"])
            and o["usd_per_hour"] <= r["usd_per_hour"]
            and o["ttft_p99_s"] <= r["ttft_p99_s"]
            for o in rows
        )

    assert all(not dominated(r) for r in front)
    for r in rows:
        if not dominated(r):  # an undominated point is on the front (or ties one there)
            assert any(
                (f["usd_per_hour"], f["ttft_p99_s"]) == (r["usd_per_hour"], r["ttft_p99_s"])
                for f in front
            )


def test_the_plan_answers_and_gives_the_same_answer_on_rerun(tmp_path: Path) -> None:
    path = write_plan(tmp_path)
    assert plan_tool.main(["--config", str(path), "--out", str(tmp_path / "a")]) == 0
    assert plan_tool.main(["--config", str(path), "--out", str(tmp_path / "b")]) == 0
    first = (tmp_path / "a" / "plan.json").read_bytes()
    assert first == (tmp_path / "b" / "plan.json").read_bytes()
    answer = json.loads(first)
    best = answer["cheapest"]
    assert best is not None and best["ttft_p99_s"] <= 2.0 and best["goodput_fraction"] >= 0.95
    # cheapest = smallest cost among every configuration that met the SLA
    assert best["usd_per_hour"] == min(r["usd_per_hour"] for r in answer["feasible"])
    assert answer["pareto"][0] == best
    for r in answer["rejected"]:
        assert r["why"] and r["usd_per_hour"] > 0
    assert answer["num_simulated"] < answer["grid_size"]
    assert any("l40s: derived, not measured" in h for h in answer["hardware"])
    md = (tmp_path / "a" / "plan.md").read_text()
    assert "Pareto front" in md and (tmp_path / "a" / "pareto.png").stat().st_size > 0
    # every engine x GPU simulated names its trust, on the plan's first lines
    assert len(answer["trust"]) == 2 and all("unvalidated" in t for t in answer["trust"])
    assert any(
        "hardware l40s (the H200 calibration scaled by datasheet" in t for t in answer["trust"]
    )
    assert "Trust: engine default (roofline step cost), hardware h200" in md.split("## ")[0]
    # the question first: a slice replayed faster is said to be not the trace as recorded
    head = md.split("## ")[0]
    assert "does not answer the trace as recorded" in head.splitlines()[2]
    assert "first 120 requests" in head and "20x faster" in head and "Ranked on: cost" in head
    assert answer["best"] == best and answer["objective"] == "cost"


def test_the_plan_ranks_on_the_objective_asked(tmp_path: Path) -> None:
    path = write_plan(tmp_path)
    out = tmp_path / "fast"
    assert plan_tool.main(["--config", str(path), "--out", str(out), "objective=ttft_p99"]) == 0
    answer = json.loads((out / "plan.json").read_text())
    assert answer["best"]["ttft_p99_s"] == min(r["ttft_p99_s"] for r in answer["feasible"])
    assert "Best on ttft_p99" in (out / "plan.md").read_text()


def test_a_model_that_does_not_fit_is_refused_naming_the_key(tmp_path: Path) -> None:
    text = PLAN_YAML.replace("  - replay.limit=120", "  - replay.limit=50\n  - model=llama3_70b")
    path = write_plan(tmp_path, text)
    out = tmp_path / "out"
    # every cell refused: bad input, one line, nothing written
    assert plan_tool.main(["--config", str(path), "--out", str(out), "space.gpus=[l40s]"]) == 2
    assert not out.exists()
    # 70.6 GB of weights per L40S at tp=2 do not fit its 48 GB; at tp=4 they do: one refused cell
    code = plan_tool.main(
        ["--config", str(path), "--out", str(out), "space.gpus=[l40s]", "space.tp=[2,4]"]
    )
    assert code == 0
    answer = json.loads((out / "plan.json").read_text())
    [refused] = answer["refused"]
    assert "l40s tp2" in refused["config"] and "'vram_gb' = 48.0" in refused["why"]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("space.gpus=[h300]", "space.gpus"),
        ("space.policies=[nope]", "space.policies"),
        ("space.pd_splits=[2-1]", "space.pd_splits"),
        ("sla.goodput_fraction=1.5", "sla.goodput_fraction"),
        ("space.max_replicas=0", "space.max_replicas"),
        ("nonsense=1", "nonsense"),
        ("objective=e2e_p99", "objective"),
    ],
)
def test_a_bad_plan_is_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, named: str
) -> None:
    out = tmp_path / "out"
    assert plan_tool.main(["--config", str(write_plan(tmp_path)), "--out", str(out), override]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_gpu_without_a_price_is_refused_naming_it(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  h200: {usd_per_gpu_hour: 3.0, source: x, date: '2025'}\n")
    plan = load_plan(write_plan(tmp_path), [f"prices={prices}"])
    from cachepilot_sim.config import ConfigError
    from cachepilot_sim.plan.config import load_prices

    with pytest.raises(ConfigError, match=r"prices\.l40s"):
        load_prices(plan)
