"""A rerun into a folder that already holds results replaces them only once it has completed
(issue 15): a rerun that passes the preflight and then fails (an error, a stop by SIGINT or
SIGTERM, a kill) leaves every file of the earlier run byte for byte, `.hydra/` included, and
nothing a reader could take for results; a complete rerun leaves nothing of the earlier one; a
swap cut short at any step is finished or undone by the next run (outdir.heal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.__main__ import main
from cachepilot_sim.experiment import outdir, runner
from cachepilot_sim.experiment.runset import find_runs
from cachepilot_sim.tools.figures import find_traces, load_runs
from tests.badinput.test_signals import _workers

FIRST = ["workload.num_requests=40", "seeds=2", "jobs=1"]  # cells perc_seed0, perc_seed1
SECOND = ["workload.num_requests=30", "seeds=1", "jobs=1"]  # one cell, other overrides
FAILING = ["workload.num_requests=30", "seeds=2", "jobs=1"]  # its second cell is made to fail
LONG = ["workload.num_requests=4000", "seeds=2", "jobs=2", "trace.chunk_rows=20000"]


def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """Run the entry point in-process; its exit status (0 when it returned) and stderr."""
    monkeypatch.setattr(sys, "argv", ["cachepilot-sim", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("CACHEPILOT_TRACEBACK", raising=False)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    code: Any = 0
    try:
        main()
    except SystemExit as stop:
        code = stop.code
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return code, capsys.readouterr().err


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden folders too) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def first_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    out = tmp_path / "run"
    code, err = _main(monkeypatch, capsys, *FIRST, f"hydra.run.dir={out}")
    assert code == 0, err
    assert (out / "trace" / "perc_seed1" / "meta.json").is_file()
    return out


def _fail_second_cell(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """The rerun's first cell runs (its trace and requests are written), the second raises."""
    real = runner.run_cell

    def run_cell(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("index", 0) >= 1:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_cell", run_cell)


def _fail_report(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """Every cell and metrics.json are written, then the report fails."""

    def write_report(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(runner, "write_report", write_report)


FAILURES = {
    "a cell raises": (_fail_second_cell, ValueError("value breaks the simulation"), 2),
    "the report raises": (_fail_report, OSError(28, "No space left on device"), 2),
    "a cell is stopped (SIGINT)": (_fail_second_cell, KeyboardInterrupt(), 130),
    "the report is stopped (SIGTERM)": (_fail_report, KeyboardInterrupt("stopped by SIGTERM"), 143),
}


def _assert_only_first_run(out: Path, before: dict[str, bytes]) -> None:
    assert _snapshot(out) == before  # same files, byte for byte: nothing lost, nothing added
    runs = find_runs(out)
    assert [r.dir for r in runs] == [out] and len(runs[0].cells) == 2
    assert sorted(p.name for p in find_traces(out)) == ["perc_seed0", "perc_seed1"]
    traces, requests, _ = load_runs(out)
    assert len(traces) == 2 and requests["seed"].unique().sort().to_list() == [0, 1]


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failed_rerun_leaves_the_earlier_results_whole(
    first_run: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failure: str,
) -> None:
    before = _snapshot(first_run)
    inject, error, status = FAILURES[failure]
    inject(monkeypatch, error)
    code, err = _main(monkeypatch, capsys, *FAILING, f"hydra.run.dir={first_run}")
    assert code == status, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    _assert_only_first_run(first_run, before)


def test_a_failed_run_into_a_new_folder_leaves_no_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new"
    _fail_second_cell(monkeypatch, ValueError("value breaks the simulation"))
    code, err = _main(monkeypatch, capsys, *FIRST, f"hydra.run.dir={out}")
    assert code == 2, err
    left = {p.split("/")[0] for p in _snapshot(out)}
    assert left <= {".hydra", "__main__.log"}  # what Hydra wrote before the run: no results
    assert find_runs(out) == [] and find_traces(out) == []


def test_a_complete_rerun_leaves_nothing_of_the_earlier_one(
    first_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The rerun has one cell and no report: no trace part, request file or report of run 1 is
    left, and the folder holds exactly what the same run writes into a new folder."""
    fresh = tmp_path / "fresh"
    argv = [*SECOND, "write_report=false"]
    for out in (first_run, fresh):
        code, err = _main(monkeypatch, capsys, *argv, f"hydra.run.dir={out}")
        assert code == 0, err
    assert sorted(_snapshot(first_run)) == sorted(_snapshot(fresh))
    assert (first_run / "metrics.json").read_bytes() == (fresh / "metrics.json").read_bytes()
    hydra = first_run / ".hydra" / "overrides.yaml"
    assert hydra.read_bytes() == (fresh / ".hydra" / "overrides.yaml").read_bytes()
    assert [p.name for p in find_traces(first_run)] == ["perc_seed0"]


def _start(out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cachepilot_sim", *LONG, f"hydra.run.dir={out}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop_mid_run(out: Path, signum: int) -> tuple[int, str]:
    """Start a long run into `out`, signal it while its workers simulate; status and stderr."""
    proc = _start(out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_workers(proc.pid)) < 3:
        time.sleep(0.2)
    time.sleep(1.5)  # the workers are simulating (and writing trace parts into the staging)
    assert len(_workers(proc.pid)) >= 2, "the run did not start its workers"
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.exclusive
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_a_rerun_stopped_by_a_signal_leaves_the_earlier_results_whole(
    first_run: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    signum: int,
    status: int,
) -> None:
    """SIGTERM: the folder is as before at once. SIGKILL cannot be handled: the readers skip what
    the killed run left (its staging folder), and the next run into the folder undoes it, here
    a run that then fails, so the folder must again be exactly the first run's."""
    before = _snapshot(first_run)
    code, err = _stop_mid_run(first_run, signum)
    assert code == status, err[-2000:]
    time.sleep(2.0)  # the killed run's workers notice within 0.5 s
    if signum == signal.SIGKILL:
        assert (first_run / outdir.STAGING).is_dir()  # the kill hit before the commit
        runs = find_runs(first_run)
        assert [r.dir for r in runs] == [first_run] and len(find_traces(first_run)) == 2
        _fail_second_cell(monkeypatch, ValueError("value breaks the simulation"))
        code, err = _main(monkeypatch, capsys, *FAILING, f"hydra.run.dir={first_run}")
        assert code == 2, err
    _assert_only_first_run(first_run, before)


def _swap_folder(root: Path) -> tuple[Path, dict[str, bytes], dict[str, bytes]]:
    """A folder with an earlier run's outputs (and a file of the user's) and a complete staging
    folder; its files before the swap, and the files it must hold after it."""
    out = root / "run"
    old = {
        "metrics.json": b"old",
        "report.md": b"old report",
        "run.json": b"old run",
        "requests/perc_seed0.parquet": b"old r0",
        "requests/perc_seed1.parquet": b"old r1",
        "trace/perc_seed0/meta.json": b"old m0",
        "trace/perc_seed0/part-00000.parquet": b"old p0",
        "trace/perc_seed1/meta.json": b"old m1",
        "trace/perc_seed1/part-00000.parquet": b"old p1",
        "trace/notes.txt": b"the user's",
    }
    new = {
        "metrics.json": b"new",
        "run.json": b"new run",
        "requests/lru_seed0.parquet": b"new r0",
        "trace/lru_seed0/meta.json": b"new m0",
        "trace/lru_seed0/part-00000.parquet": b"new p0",
        "trace/lru_seed0/part-00001.parquet": b"new p1",
    }
    for name, data in old.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    for name, data in new.items():
        (out / outdir.STAGING / name).parent.mkdir(parents=True, exist_ok=True)
        (out / outdir.STAGING / name).write_bytes(data)
    return out, old, new | {"trace/notes.txt": b"the user's"}


MOVES = 9 + 6  # the earlier run's 9 files to the trash, then the 6 staged files in


@pytest.mark.parametrize("crash_after", range(MOVES + 1))
def test_a_swap_cut_short_at_any_step_is_finished_or_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_after: int
) -> None:
    out, old, new = _swap_folder(tmp_path)
    real, done = os.replace, [0]

    def replace(src: Any, dst: Any) -> None:
        if done[0] == crash_after:
            raise OSError(5, "the machine went down")
        done[0] += 1
        real(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(outdir.os, "replace", replace)
        if crash_after < MOVES:
            with pytest.raises(OSError):
                outdir.commit(out)
        else:
            outdir.commit(out)
    assert not any(outdir.hidden(p, out) for p in find_traces(out))  # readers skip both folders
    rolled_forward = outdir.heal(out)
    assert _snapshot(out) == (new if crash_after >= 9 else old)
    assert rolled_forward == (crash_after >= 9)
    assert not (out / outdir.STAGING).exists() and not (out / outdir.TRASH).exists()
