"""The answer ranks policies on the objective asked, each with its paired difference to the
baseline and that difference's interval; it warns when nothing separates them, and a run whose
baseline never evicted anything runs the baseline alone and says why."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from rich.console import Console
from scipy import stats

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import POLICIES, Objective, register_configs, to_config
from cachepilot_sim.config.question import question_lines
from cachepilot_sim.experiment.answer import ranking_table
from cachepilot_sim.experiment.ranking import cannot_differ, rank, ranking_lines
from cachepilot_sim.experiment.runner import COPY_OF, run_experiment

register_configs()


def make_cells(
    ttft: dict[str, list[float]], kv_util: float = 0.5, evictions: int = 10
) -> tuple[list[dict], list[dict[str, float]]]:
    cells, serving = [], []
    for policy, values in ttft.items():
        for seed, v in enumerate(values):
            cells.append({"policy": policy, "seed": seed, "goodput_req_s": 10.0 - v / 100,
                          "realized_restore_s": v / 10, "evictions": evictions, "completed": 100,
                          "duration_s": 50.0, "vram_kv_util_mean": kv_util})  # fmt: skip
            serving.append({"ttft_p99_ms": v, "e2e_p99_ms": 2 * v})
    return cells, serving


def test_policies_are_ranked_on_the_objective_with_paired_differences() -> None:
    cells, serving = make_cells(
        {"lru": [100, 110, 120, 105], "perc": [130, 141, 150, 136], "fifo": [80, 91, 99, 84]}
    )
    r = rank(cells, serving, "lru", Objective.ttft_p99)
    assert [row.policy for row in r.rows] == ["fifo", "lru", "perc"]  # lower TTFT first
    perc = next(row for row in r.rows if row.policy == "perc")
    diffs = np.array([30.0, 31.0, 30.0, 31.0])
    low, high = stats.t.interval(0.95, 3, loc=diffs.mean(), scale=stats.sem(diffs))
    assert perc.diff.mean == pytest.approx(30.5)
    assert (perc.diff.low, perc.diff.high) == (pytest.approx(low), pytest.approx(high))
    assert perc.relative == pytest.approx(30.5 / np.mean([100, 110, 120, 105]))
    assert perc.differs() and not r.warnings
    good = rank(cells, serving, "lru", Objective.goodput)
    assert [row.policy for row in good.rows] == ["fifo", "lru", "perc"]  # higher goodput first
    cost = rank(cells, serving, "lru", Objective.cost, num_gpus=4)
    assert cost.rows[0].value.mean == pytest.approx(50.0 * 4 / 100)


def test_a_saturated_run_within_noise_is_called_so() -> None:
    cells, serving = make_cells(
        {"lru": [100, 110, 120, 105], "perc": [101, 109, 121, 104]}, kv_util=0.98
    )
    r = rank(cells, serving, "lru", Objective.ttft_p99)
    text = " ".join(r.warnings)
    assert "beyond seed noise" in text and "saturated" in text and "KV pool was 98%" in text
    for c in cells:
        c |= {"vram_kv_util_mean": 0.5, "gpu_busy_frac": 0.97}  # compute-bound instead
    busy = " ".join(rank(cells, serving, "lru", Objective.ttft_p99).warnings)
    assert "saturated: the GPU computed 97%" in busy and "KV pool" not in busy
    for c in cells:
        c["gpu_busy_frac"] = 0.5
    assert "saturated" not in " ".join(rank(cells, serving, "lru", Objective.ttft_p99).warnings)
    lines = ranking_lines(r)
    assert any(line.startswith("warning: saturated") for line in lines)


def test_two_seeds_say_in_words_that_no_interval_separates_them() -> None:
    cells, serving = make_cells({"lru": [100, 110], "perc": [100.2, 110.1]})
    r = rank(cells, serving, "lru", Objective.ttft_p99)
    assert "within 1%" in r.warnings[0] and "no interval separates them" in r.warnings[0]
    assert any("too small for an interval" in line for line in ranking_lines(r))
    assert all(math.isnan(row.diff.low) for row in r.rows)


def test_cannot_differ_only_when_the_baseline_evicted_nothing() -> None:
    cells, _ = make_cells({"lru": [100, 110, 120]}, evictions=0)
    for c in cells:
        c |= {"turns_hit": 0, "turns_reload": 0, "turns_recompute": 0}
    assert "no reuse" in cannot_differ(cells) and "evicted nothing" in cannot_differ(cells)
    cells[1]["evictions"] = 1
    assert cannot_differ(cells) == ""
    cells[1] |= {"evictions": 0, "prefix_cap_evictions": 3}
    assert cannot_differ(cells) == ""


def compose_run(*overrides: str):  # noqa: ANN201
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


AZURE_SAMPLE = (
    "+experiment=azure_conv",
    "replay.path=samples:azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    "replay.limit=60",
    "seeds=1",
    "write_report=false",
    "trace.enabled=false",
)


def test_a_trace_without_reuse_is_answered_once_and_says_why(tmp_path: Path) -> None:
    cfg = compose_run(*AZURE_SAMPLE, "compare_policies=[perc,lru,fifo]")
    buf = io.StringIO()
    report = run_experiment(cfg, tmp_path / "all", Console(file=buf, width=120))
    # perc and fifo were not simulated: their cells are lru's, marked as copies
    ran = [c for c in report["cells"] if COPY_OF not in c]
    assert [c["policy"] for c in ran] == ["lru"] and len(report["cells"]) == 3
    assert all(c[COPY_OF] == 1 for c in report["cells"] if c not in ran)
    assert report["ranking"]["baseline"] == "lru"
    ranking = report["ranking"]
    assert ranking["identical_by_construction"] == ["perc", "fifo"]
    screen = buf.getvalue()
    assert "Ran lru only" in screen and "identical by construction: perc, fifo" in screen
    # The claim holds: perc run alone gives lru's numbers.
    alone = run_experiment(compose_run(*AZURE_SAMPLE, "compare_policies=[perc]"), tmp_path / "p",
                           Console(file=io.StringIO()))  # fmt: skip
    keys = ("ttft_p99_s", "e2e_p99_s", "duration_s", "completed", "goodput_req_s")
    assert {k: alone["cells"][0][k] for k in keys} == {k: ran[0][k] for k in keys}


def test_the_objective_is_a_config_choice() -> None:
    assert compose_run("+experiment=smoke").objective == Objective.ttft_p99
    assert compose_run("+experiment=smoke", "objective=goodput").objective == Objective.goodput
    with pytest.raises(Exception, match="objective|Invalid value"):
        compose_run("+experiment=smoke", "objective=latency")


def test_a_policy_cell_in_brackets_is_printed_not_read_as_markup() -> None:
    cells, serving = make_cells({"lru": [100, 110, 120], "[x]": [90, 95, 99]})
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(ranking_table(rank(cells, serving, "lru", Objective.ttft_p99)))
    assert "[x]" in console.export_text()


def test_a_cluster_run_is_titled_as_a_cluster() -> None:
    from cachepilot_sim.experiment.runner import run_title

    cfg = compose_run("+experiment=smoke", "cluster=colocated", "cluster.replicas=2")
    title = run_title(cfg, [])
    assert "a cluster of 2 replicas" in title and "one " not in title
    assert "on one h200" in " ".join(question_lines(compose_run("+experiment=smoke"), "x"))


def test_the_first_lines_say_when_a_trace_is_not_replayed_as_recorded() -> None:
    cfg = compose_run(*AZURE_SAMPLE, "replay.time_scale=0.1")
    first = question_lines(cfg, "engine default")[0]
    assert "the first 60 requests (a slice, not the whole trace)" in first
    assert "10x faster than recorded" in first and "not the trace as recorded" in first
    whole = question_lines(compose_run(*AZURE_SAMPLE, "replay.limit=0"), "x")[0]
    assert "every request" in whole and "at its recorded times" in whole


def test_the_ranking_of_every_policy_fits_the_terminal_with_every_number() -> None:
    from cachepilot_sim.experiment.ranking import ranking_cells

    ttft = {
        p: [4_000.0 + 37 * i + s * 250 for s in range(3)] for i, p in enumerate(POLICIES.names())
    }
    cells, serving = make_cells(ttft)
    ranking = rank(cells, serving, "lru", Objective.ttft_p99)
    for width in (80, 120):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(ranking_table(ranking, width))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
        for row in ranking_cells(ranking)[1]:
            shown = row if width >= 120 else row[:2] + row[3:]  # 80: no CI of the value
            assert all(cell in text for cell in shown), row
