"""Gather a sweep's jobs into one table: `cachepilot-sim collect <sweep dir>`.

One row per (job, policy, seed) cell of every complete job, with the job's overrides as columns
(typed by Hydra's override parser; a cell's own `policy` and `seed` win over an override of the same
name), written to `collected.parquet` and `collected.csv`, plus `jobs.csv` (every job and its
status) and a plot of a chosen metric against a chosen parameter with the 95 % t interval over
seeds, one panel per value of every other swept key (configurations are never pooled). Failed
and incomplete jobs are listed with their reasons; a job whose metrics.json cannot be read is
reported as such, naming the file, and the others are still collected. Outputs are written to
temporary names and renamed, so an interrupted collect never damages an earlier table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from cachepilot_sim.experiment.runset import RunSetError
from cachepilot_sim.experiment.sweep import job_dirs, read_job
from cachepilot_sim.inputs import InputError
from cachepilot_sim.tools.sweep_figures import metric_vs_param

TABLE = "collected"


class CollectError(InputError):
    """A sweep folder that cannot be collected; the message names the file and the problem."""


def parse_override(text: str) -> tuple[str, Any] | None:
    """`key=value` -> (key, typed value) by Hydra's own override grammar; None for deletions
    (`~key`). Lists and dicts become JSON text (one scalar per table cell)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        override = OverridesParser.create().parse_overrides([text])[0]
    except HydraException as err:
        raise CollectError(f"override {text!r}: {err}") from err
    if override.is_delete():
        return None
    value = override.value()
    if isinstance(value, list | dict):
        value = json.dumps(value)
    return override.key_or_group, value


def _read_overrides(job_dir: Path) -> list[str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    try:
        items = yaml.safe_load(path.read_text()) or []
    except (OSError, yaml.YAMLError) as err:
        raise CollectError(f"{path}: cannot read the job's overrides ({err})") from err
    if not isinstance(items, list):
        raise CollectError(f"{path}: expected a list of overrides, got {type(items).__name__}")
    return [str(i) for i in items]


def _read_cells(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "metrics.json"
    try:
        # Runs before metrics.json became strict JSON wrote bare NaN for "no value": read as null.
        report = json.loads(path.read_text(), parse_constant=lambda _: None)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CollectError(f"{path}: unreadable ({err})") from err
    cells = report.get("cells") if isinstance(report, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise CollectError(f"{path}: key 'cells' missing or not a list of objects")
    for num, cell in enumerate(cells):
        for key, value in cell.items():
            # A metric is a number (or null); only the cell's policy name is text. A string or a
            # list in a metric column would turn the whole column into text in the table.
            ok = isinstance(value, str) if key == "policy" else _is_number(value)
            if not ok:
                raise CollectError(
                    f"{path}: cells[{num}].{key} = {json.dumps(value)[:40]} is not a "
                    f"{'name' if key == 'policy' else 'number or null'}"
                )
    return cells


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and math.isfinite(value))


def collect_rows(sweep_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(cell rows of complete jobs, one status row per job, override keys in first-seen order)."""
    rows: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    keys: dict[str, None] = {}
    for job_dir in job_dirs(sweep_dir):
        name = str(job_dir.relative_to(sweep_dir))
        record = read_job(job_dir) or {}
        status, error = record.get("status", "incomplete"), record.get("error", "")
        try:
            overrides = _read_overrides(job_dir)
            if status == "complete":
                cells = _read_cells(job_dir)
                params = dict(p for o in overrides if (p := parse_override(o)) is not None)
                keys |= dict.fromkeys(params)
                for cell in cells:
                    rows.append({"job": name} | params | cell)
        except CollectError as err:
            status, error = "unreadable", str(err)
        if status not in ("complete", "failed", "unreadable"):
            error = error or f"no finished job.json (status {status})"
            status = "incomplete"
        jobs.append({"job": name, "status": status, "error": error})
    return rows, jobs, list(keys)


def _column_values(values: list[Any]) -> list[Any]:
    """One polars-friendly type per column: ints and floats mix to float, others to str."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int, bool} or kinds <= {float} or not kinds:
        return values
    if kinds <= {int, float}:
        return [None if v is None else float(v) for v in values]
    return [None if v is None else str(v) for v in values]


def to_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    data = {c: _column_values([r.get(c) for r in rows]) for c in columns}
    return pl.DataFrame(data, strict=False)


def _write_atomic(path: Path, write: Callable[[Path], Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def default_param(frame: pl.DataFrame, overrides: list[str]) -> str | None:
    """The first swept numeric parameter (more than one value), other than the seed."""
    for name in overrides:
        if name in ("seed", "policy", "job") or name not in frame.columns:
            continue
        if frame[name].dtype.is_numeric() and frame[name].n_unique() > 1:
            return name
    return None


def swept_keys(
    frame: pl.DataFrame, overrides: list[str], exclude: tuple[str, ...] = ()
) -> list[str]:
    """Overrides that take more than one value in the table (configurations, not seeds): the
    plot gives each its own panel instead of pooling them as seeds."""
    skip = {"seed", "seeds", "policy", "job", *exclude}
    return [
        k for k in overrides if k not in skip and k in frame.columns and frame[k].n_unique() > 1
    ]


def collect(
    sweep_dir: Path,
    out_dir: Path | None = None,
    metric: str = "realized_restore_s",
    param: str | None = None,
    fmt: str = "png",
) -> dict[str, Any]:
    """Write the table, the job list and the plot. Returns `jobs` and `failed` (dicts of job,
    status, error) and, when a job completed, `table`, `parquet`, `params` (override keys) and
    `plot` (when a parameter to plot against was given or found)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise CollectError(f"{sweep_dir}: no such sweep folder")
    rows, jobs, swept = collect_rows(sweep_dir)
    if not jobs:
        raise CollectError(f"{sweep_dir}: no job folders (none holds .hydra/overrides.yaml)")
    out_dir = Path(out_dir or sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [j for j in jobs if j["status"] != "complete"]
    result: dict[str, Any] = {"jobs": jobs, "failed": failed}
    _write_atomic(out_dir / "jobs.csv", pl.DataFrame(jobs).write_csv)
    if not rows:
        return result
    frame = to_frame(rows)
    _write_atomic(out_dir / f"{TABLE}.parquet", frame.write_parquet)
    _write_atomic(out_dir / f"{TABLE}.csv", frame.write_csv)
    result |= {"table": frame, "parquet": out_dir / f"{TABLE}.parquet", "params": swept}
    param = param or default_param(frame, swept)
    if metric not in frame.columns:
        raise CollectError(f"metric '{metric}' not in the table; columns: {frame.columns}")
    if param is not None:
        if param not in frame.columns:
            raise CollectError(f"parameter '{param}' not in the table; overrides: {swept}")
        facets = swept_keys(frame, swept, exclude=(param,))
        try:
            result["plot"] = metric_vs_param(frame, metric, param, out_dir, fmt, facets=facets)
        except RunSetError as err:
            raise CollectError(str(err)) from err
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cachepilot_sim.tools.collect", description=__doc__)
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: sweep dir)")
    ap.add_argument("--metric", default="realized_restore_s")
    ap.add_argument("--param", default=None, help="x axis (default: first swept number)")
    ap.add_argument("--format", default="png", choices=["png", "svg"])
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed on servers and CI
    try:
        result = collect(args.sweep_dir, args.out, args.metric, args.param, args.format)
    except CollectError as err:
        print(f"cachepilot_sim.tools.collect: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # an unwritable --out: named, no traceback
        print(
            f"cachepilot_sim.tools.collect: {err.filename}: cannot write ({err.strerror})",
            file=sys.stderr,
        )
        return 2
    n_ok = sum(j["status"] == "complete" for j in result["jobs"])
    print(
        f"collected {n_ok} of {len(result['jobs'])} jobs"
        + (f" -> {result['parquet']}" if "parquet" in result else " (no complete job)")
    )
    if "plot" in result:
        print(f"plot: {result['plot']}")
    for job in result["failed"]:
        print(f"  {job['status'].upper()} {job['job']}: {job['error']}", file=sys.stderr)
    return 0 if "parquet" in result else 1


if __name__ == "__main__":
    sys.exit(main())
