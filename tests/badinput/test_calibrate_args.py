"""calibrate: without a GPU it says so and how to refit on CPU; a bad --refit file or an unwritable
--out is one line naming it; nothing is written (issue 15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachepilot_sim.tools import calibrate

RAW = Path(__file__).resolve().parents[2] / "experiments" / "calibration" / "2026-11-29_h200.json"


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


@pytest.mark.skipif(_has_gpu(), reason="measures on a GPU when one is present")
def test_measuring_without_a_gpu_says_how_to_refit(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert calibrate.main(["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--refit" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


BAD_RAW = {
    "empty": b"",
    "binary": b"\x00\xff\xfe\x01",
    "truncated": b'{"date": "2026-11-29", ',
    "list": b"[1, 2]",
    "number": b"3",
    "empty_object": b"{}",
    "wrong_types": json.dumps({"date": 1, "pcie": "fast"}).encode(),
    "nan": b'{"date": NaN}',
}


@pytest.mark.parametrize("case", sorted(BAD_RAW))
def test_refit_of_a_bad_file_is_one_line(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tmp_path / "raw.json"
    raw.write_bytes(BAD_RAW[case])
    assert calibrate.main(["--refit", str(raw), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(raw) in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_refit_of_a_missing_file_is_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert calibrate.main(["--refit", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


@pytest.mark.skipif(not RAW.is_file(), reason="the shipped raw file")
def test_refit_to_an_unwritable_out_is_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    (tmp_path / "file").write_text("x")
    assert calibrate.main(["--refit", str(RAW), "--out", str(tmp_path / "file" / "o")]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Traceback" not in err
