"""profile_dataset: a dataset name never becomes a path out of `--out`; bad arguments and files
exit 2 with one line naming them, and nothing is written (issue 15)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachepilot_sim.tools.profile_dataset import main

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets" / "alpaca_tiny.jsonl"

BAD_NAMES = ["../escape", "../../x", "/abs", "a/b", "..", ".", "a\\b", "-x", "x" * 101, "a b"]


def _exit(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_dataset_name_that_is_a_path_is_refused(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert _exit(["--path", str(DATA), "--out", str(out), f"--name={name}"]) == 2
    assert "--name" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


BAD_ARGS = [
    ["--pth", "x"],
    [],
    ["--path"],
    ["--path", "{data}", "--max-records", "x"],
    ["--path", "{data}", "--max-records", "1.5"],
    ["--path", "{data}", "--format", "yaml"],
    ["--path", "{data}", "--tokenizer", "nonesuch"],
    ["--path", "{tmp}/nope.json"],
    ["--path", "{tmp}"],
    ["--path", "{data}", "--out", "{tmp}/file"],
    ["--path", "{data}", "--out", "{tmp}/file/sub"],
    ["noequals"],
]


@pytest.mark.parametrize("argv", BAD_ARGS)
def test_bad_arguments_exit_2_with_one_line_and_write_nothing(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    args = [a.replace("{data}", str(DATA)).replace("{tmp}", str(tmp_path)) for a in argv]
    assert _exit(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
