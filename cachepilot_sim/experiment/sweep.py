"""Hydra multirun jobs that survive each other: per-job status files, crash isolation, resume.

Every job of a sweep writes `job.json` in its own folder (`hydra.sweep.subdir`, by default the job's
overrides, so a rerun with the same `hydra.sweep.dir` finds the same folders): `complete` with the
hash of its resolved config once `metrics.json` is written, or `failed` with the exception and its
traceback. A failing job never raises into the launcher, so the other jobs finish; a rerun skips
every job whose `job.json` says complete for the same config, and runs the others again. When the
sweep ends, `SweepReport` prints which jobs failed and why and exits non-zero.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cachepilot_sim.config import to_config
from cachepilot_sim.entry import SWEEP_PARENT_ENV, worker_setup
from cachepilot_sim.experiment.lifecycle import exit_with_parent
from cachepilot_sim.experiment.outdir import write_json

JOB_FILE = "job.json"
LAUNCH_DIR = ".jobs"  # one record per launched job (record_launch)
STATUS_FILE = "sweep_status.json"


def config_hash(cfg: DictConfig) -> str:
    """sha256 of the job's resolved task config (what decides its results)."""
    text = OmegaConf.to_yaml(cfg, resolve=True, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Strict JSON (null for NaN), temporary name then rename: see outdir.write_json."""
    write_json(path, payload)


def read_job(job_dir: Path) -> dict[str, Any] | None:
    """The job's status record, or None when it has none or it cannot be parsed."""
    try:
        record = json.loads((job_dir / JOB_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def is_complete(job_dir: Path, digest: str) -> bool:
    """True when the job finished for exactly this config and its metrics are on disk."""
    record = read_job(job_dir)
    return (
        record is not None
        and record.get("status") == "complete"
        and record.get("config_sha256") == digest
        and (job_dir / "metrics.json").is_file()
    )


def safe_dirname(name: str) -> str:
    """A job folder name from its overrides that stays one folder inside the sweep folder.

    `/` (and `%`, to keep names distinct) are percent-encoded, so `replay.path=../x` cannot move
    the job out of the sweep; names past 200 characters are cut and end with a digest of the whole.
    Registered as the `cp_safe_dirname` resolver that conf/config.yaml's `hydra.sweep.subdir` uses.
    """
    out = name.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C").replace("\0", "")
    if out in (".", ".."):
        out = out.replace(".", "%2E")
    if len(out) > 200:
        out = out[:180] + "~" + hashlib.sha256(name.encode()).hexdigest()[:12]
    return out


def record_launch(sweep_dir: Path, job_num: int, entry: dict[str, Any]) -> None:
    """The sweep's own record of a launched job (`.jobs/<num>.json`, always inside the sweep
    folder), so that the summary counts every job even when its folder is missing or elsewhere."""
    (sweep_dir / LAUNCH_DIR).mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep_dir / LAUNCH_DIR / f"{job_num}.json", {"job": job_num} | entry)


def run_job(
    cfg: DictConfig,
    out_dir: Path,
    overrides: list[str],
    job_num: int,
    sweep_dir: Path | None = None,
) -> str:
    """Run one sweep job in `out_dir`; returns its status: complete, skipped or failed.

    Exceptions are recorded in job.json and printed with the job's overrides, never raised. With
    `sweep_dir`, the job is also recorded there, and a job folder outside it is refused.
    """
    launcher = int(os.environ.get(SWEEP_PARENT_ENV) or 0)
    if launcher and os.getpid() != launcher:
        # A launcher worker (loky): it exits with the sweep, and a Ctrl-C or a closed terminal,
        # which reach the whole process group, stop the sweep, which stops its workers, rather
        # than raise in each worker (a traceback per worker on the terminal).
        worker_setup(launcher)
    else:
        exit_with_parent()  # the job runs in the launching process
    label = f"job {job_num} ({','.join(overrides) or 'no overrides'})"
    if sweep_dir is None:
        return _run_job(cfg, out_dir, overrides, job_num, label)
    inside = out_dir.resolve().is_relative_to(sweep_dir.resolve())
    entry = {"dir": str(out_dir), "overrides": overrides}
    record_launch(sweep_dir, job_num, entry | {"status": "running"})
    if not inside:
        status, error = "failed", f"job folder {out_dir} is outside the sweep folder {sweep_dir}"
        print(f"cachepilot_sim: {label} failed: {error}", file=sys.stderr)
    else:
        status, error = _run_job(cfg, out_dir, overrides, job_num, label), ""
    record_launch(sweep_dir, job_num, entry | {"status": status, "error": error})
    return status


def _run_job(cfg: DictConfig, out_dir: Path, overrides: list[str], job_num: int, label: str) -> str:
    from rich.console import Console

    from cachepilot_sim.experiment.runner import run_experiment

    digest = config_hash(cfg)
    if is_complete(out_dir, digest):
        print(f"cachepilot_sim: {label}: skipped, results complete in {out_dir}")
        return "skipped"
    record: dict[str, Any] = {"job": job_num, "overrides": overrides, "config_sha256": digest}
    write_json_atomic(out_dir / JOB_FILE, record | {"status": "running"})
    if cfg.get("jobs", 0) == 0:
        # The launcher already spreads jobs over the cores; a pool of cell workers inside a
        # launcher worker (loky) cannot start and would only oversubscribe the machine.
        cfg.jobs = 1
    try:
        # One line per job instead of each job's table: a sweep has hundreds (summary.md has it).
        report = run_experiment(to_config(cfg), out_dir, Console(quiet=True))
    except Exception as err:  # noqa: BLE001 - a job's failure must not take down the sweep
        reason = f"{type(err).__name__}: {err}"
        print(f"cachepilot_sim: {label} failed: {reason}", file=sys.stderr)
        write_json_atomic(
            out_dir / JOB_FILE,
            record | {"status": "failed", "error": reason, "traceback": traceback.format_exc()},
        )
        return "failed"
    write_json_atomic(out_dir / JOB_FILE, record | {"status": "complete"})
    restore = [round(c["realized_restore_s"], 3) for c in report["cells"]]
    print(f"cachepilot_sim: {label}: complete, realized restore s {restore}")
    return "complete"


def job_dirs(sweep_dir: Path) -> list[Path]:
    """Every job folder under a sweep folder (one holding Hydra's .hydra/overrides.yaml)."""
    found = {p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")}
    return sorted(d for d in found if d != sweep_dir or (d / JOB_FILE).exists())


def sweep_status(sweep_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Jobs of a sweep folder grouped by status (complete, failed, incomplete)."""
    out: dict[str, list[dict[str, Any]]] = {"complete": [], "failed": [], "incomplete": []}
    for job_dir in job_dirs(sweep_dir):
        record = read_job(job_dir) or {"status": "incomplete"}
        status = record.get("status")
        entry = {
            "dir": str(job_dir.relative_to(sweep_dir)),
            "overrides": record.get("overrides"),
            "error": record.get("error", ""),
        }
        if status == "complete" and (job_dir / "metrics.json").is_file():
            out["complete"].append(entry)
        elif status == "failed":
            out["failed"].append(entry)
        else:
            entry["error"] = entry["error"] or f"no finished job.json (status {status})"
            out["incomplete"].append(entry)
    _add_lost_jobs(sweep_dir, out)
    return out


def _add_lost_jobs(sweep_dir: Path, out: dict[str, list[dict[str, Any]]]) -> None:
    """Launched jobs (`.jobs/`) whose folder is not among the sweep's job folders: failed."""
    found = {str((sweep_dir / e["dir"]).resolve()) for group in out.values() for e in group}
    for path in sorted((sweep_dir / LAUNCH_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            job_dir = Path(record["dir"])
        except (OSError, ValueError, KeyError, TypeError):
            record, job_dir = {"error": f"{path}: unreadable launch record"}, path
        if str(job_dir.resolve()) in found:
            continue
        error = (
            record.get("error") or f"job folder {job_dir} missing (status {record.get('status')})"
        )
        out["failed"].append(
            {"dir": str(job_dir), "overrides": record.get("overrides"), "error": error}
        )


def _write_report(sweep_dir: Path) -> None:
    """The sweep's report.md/report.html (experiment/sweep_report.py); a failure to write it is
    one line on stderr and never hides the jobs' status."""
    from cachepilot_sim.experiment.sweep_report import write_sweep_report

    try:
        paths = write_sweep_report(sweep_dir)
    except Exception as err:  # noqa: BLE001 - the jobs' results and status matter more
        print(f"cachepilot_sim: sweep report not written: {err}", file=sys.stderr)
        return
    print(f"cachepilot_sim: sweep report {paths[0]}")


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra-core always ships it (>= 1.1)
    Callback = object  # type: ignore[misc,assignment]


class SweepReport(Callback):  # type: ignore[misc]
    """Hydra callback: at the end of a multirun, write sweep_status.json, list the failed jobs with
    their reasons, write the sweep report over the complete jobs, and exit with status 1 when any
    failed (the others' results stay)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        status = sweep_status(sweep_dir)
        write_json_atomic(sweep_dir / STATUS_FILE, status)
        bad = status["failed"] + status["incomplete"]
        print(
            f"cachepilot_sim: sweep {sweep_dir}: {len(status['complete'])} jobs complete, "
            f"{len(status['failed'])} failed, {len(status['incomplete'])} incomplete"
        )
        for job in bad:
            print(f"  FAILED {job['dir']}: {job['error']}", file=sys.stderr)
        if status["complete"]:
            _write_report(sweep_dir)
        if bad:
            raise SystemExit(1)
