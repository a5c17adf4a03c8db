"""A sweep that lists a value twice (issue 30) would run one job twice into one folder and pool
it as two samples: refused in one line naming the override, before any job or folder exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cachepilot_sim.experiment.lifecycle import refuse_repeated_sweep_values


@pytest.mark.parametrize(
    ("override", "value"),
    [("policy=lru,lru", "lru"), ("seed=1,2,1", "1"), ("vram_gb=16,24,16", "16"),
     ("policy=perc,lru,perc", "perc")],
)  # fmt: skip
def test_a_repeated_sweep_value_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], override: str, value: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        refuse_repeated_sweep_values(["workload.num_requests=20", override])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert override.split("=")[0] in err and f"lists {value} twice" in err


def test_distinct_sweep_values_pass() -> None:
    refuse_repeated_sweep_values(["policy=lru,perc", "seed=range(0,3)", "vram_gb=16"])


def test_the_command_refuses_before_the_sweep_folder_exists(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    proc = subprocess.run(
        [sys.executable, "-m", "cachepilot_sim", "--multirun", "policy=lru,lru", "seeds=1",
         "workload.num_requests=20", f"hydra.sweep.dir={sweep}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "lists lru twice" in proc.stderr
    assert not sweep.exists()
