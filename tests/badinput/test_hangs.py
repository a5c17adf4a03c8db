"""Inputs that hung an entry point are refused in one line (issue 30, the "3 hang" class): a FIFO
or a device (`/dev/zero`) where a file goes (a FIFO blocked polars' and numpy's readers past any
signal: `timeout` could not stop `fit-capture`), a plan whose space holds more cells than a
search can run, and counts that built their cells or replicas for minutes before printing."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.admission.mlp import Mlp, WeightsError
from cachepilot_sim.config import ConfigError
from cachepilot_sim.config.cluster import ClusterConfig
from cachepilot_sim.cost.gpu_profile import GpuProfileError, load_gpu_profile
from cachepilot_sim.inputs import InputError, read_json, read_text, read_yaml
from cachepilot_sim.plan.config import MAX_CELLS, SearchSpace
from cachepilot_sim.tools import fit_capture, fit_engine, plan, profile_dataset, validate
from cachepilot_sim.workloads.traces import TraceError, require_trace_file
from tests.badinput.refusal import assert_refused

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "experiments/validation/hf_cb/2026-12-01/closed_b16/run1"
SPECIAL = ("fifo", "device")
pytestmark = pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")


def _special(tmp_path: Path, kind: str, name: str = "input") -> Path:
    """A FIFO with no writer (reading it blocks) or a link to /dev/zero (reading never ends)."""
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


def _unblock(path: Path) -> None:
    """Open the FIFO for writing, so a reader stuck on it returns (the guard's way out)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _within(seconds: float, call: Callable[[], Any], fifo: Path | None = None) -> Any:
    """`call()`'s result or exception within `seconds`; a call still running then is a hang."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            _unblock(fifo)
        pytest.fail(f"hung: still running after {seconds} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def ground_truth(tmp_path: Path) -> Iterator[Path]:
    run = tmp_path / "gt" / "closed_b16" / "run1"
    run.mkdir(parents=True)
    for name in ("engine.json", "requests.parquet", "steps.parquet"):
        shutil.copy(RUN / name, run / name)
    yield run


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("reader", [read_text, read_json, read_yaml])
def test_the_strict_readers_refuse_a_fifo_or_device(
    tmp_path: Path, kind: str, reader: Callable[[Path], Any]
) -> None:
    path = _special(tmp_path, kind)
    with pytest.raises(InputError, match=r"not a regular file \(a FIFO, device or socket\)"):
        _within(20, lambda: reader(path), path)


@pytest.mark.parametrize("kind", SPECIAL)
def test_plan_refuses_a_plan_file_that_is_a_fifo_or_device(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _special(tmp_path, kind)
    argv = ["--config", str(path), "--out", str(tmp_path / "out")]
    _within(30, lambda: assert_refused(plan.main, argv, capsys, str(path), "not a regular"), path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", SPECIAL)
def test_fit_engine_refuses_a_steps_file_that_is_a_fifo_or_device(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _special(tmp_path, kind)
    call = lambda: assert_refused(fit_engine.main, [str(path)], capsys, str(path), "not a regular")  # noqa: E731
    _within(30, call, path)


@pytest.mark.parametrize("kind", SPECIAL)
def test_profile_dataset_refuses_a_dataset_that_is_a_fifo_or_device(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _special(tmp_path, kind)
    argv = ["--path", str(path), "--out", str(tmp_path / "out"), "--tokenizer", "estimate"]
    _within(30, lambda: assert_refused(profile_dataset.main, argv, capsys, str(path)), path)


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", ["engine.json", "requests.parquet", "steps.parquet"])
def test_validate_refuses_a_ground_truth_file_that_is_a_fifo_or_device(
    ground_truth: Path, kind: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (ground_truth / name).unlink()
    path = _special(ground_truth, kind, name)
    argv = [str(ground_truth.parents[1]), "--engine", "hf_cb"]
    call = lambda: assert_refused(validate.main, argv, capsys, str(path), "not a regular")  # noqa: E731
    _within(60, call, path)


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", ["engine.json", "steps.parquet"])
def test_fit_capture_refuses_a_run_file_that_is_a_fifo_or_device(
    ground_truth: Path, kind: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The case that hung past SIGTERM: polars blocked on a FIFO steps.parquet."""
    (ground_truth / name).unlink()
    path = _special(ground_truth, kind, name)
    with pytest.raises(SystemExit) as exit_:
        _within(30, lambda: fit_capture.main([str(ground_truth.parents[1])]), path)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(path) in err and "not a regular file" in err, err


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_run_refuses_a_trace_weights_or_gpu_profile_that_is_a_fifo_or_device(
    tmp_path: Path, kind: str
) -> None:
    path = _special(tmp_path, kind, "x.npz")
    with pytest.raises(TraceError, match="not a regular file"):
        _within(20, lambda: require_trace_file(path), path)
    with pytest.raises(WeightsError, match="not a regular file"):
        _within(20, lambda: Mlp.load(path, ["a"]), path)
    with pytest.raises(GpuProfileError, match="not a regular file"):
        _within(20, lambda: load_gpu_profile(path), path)


def test_a_plan_space_past_the_cell_bound_is_refused_before_any_cell_is_built() -> None:
    offloads = [float(i) for i in range(MAX_CELLS // 10 + 1)]
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"'space' = .*cells.*at most 10,000 cells") as err:
        SearchSpace(gpus=["h200", "l40s"], policies=["lru", "perc"], offload_gb=offloads,
                    pd_splits=["colocated", "1:1", "1:2"])  # fmt: skip
    assert time.monotonic() - start < 5
    assert "offload_gb" in str(err.value) and "\n" not in str(err.value)
    at_bound = [float(i) for i in range(MAX_CELLS)]
    assert SearchSpace(offload_gb=at_bound).offload_gb[-1] == MAX_CELLS - 1


@pytest.mark.parametrize(
    ("key", "value"), [("replicas", 10**6), ("prefill_replicas", 10**6), ("decode_replicas", 10**6)]
)
def test_a_cluster_of_a_million_replicas_is_refused_by_its_key(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=rf"'cluster\.{key}' = {value}"):
        ClusterConfig(**{key: value})


def test_a_billion_seeds_are_refused_by_the_key(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from cachepilot_sim.conf import CONF_DIR
    from cachepilot_sim.config import register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["seeds=1000000000"])
    with pytest.raises(ConfigError, match=r"'seeds' = 1000000000"):
        _within(20, lambda: to_config(cfg))
