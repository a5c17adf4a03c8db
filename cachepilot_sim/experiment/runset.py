"""The runs under a folder (one run, a sweep, or a parent of several) and what sets them apart.

Each run folder holds `metrics.json`; its configuration is Hydra's composed `.hydra/config.yaml`
or, for a run started from Python, `run_meta.json`'s `config_yaml`; when some run has neither,
every run is compared by its `.hydra/overrides.yaml`. The keys whose values differ
between runs name the configurations; seeds of one configuration may be pooled, two
configurations never are (`check_no_pooling` refuses, naming the keys that differ).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from cachepilot_sim.experiment.intervals import nonnegative_interval
from cachepilot_sim.experiment.outdir import hidden
from cachepilot_sim.experiment.report import mean_ci
from cachepilot_sim.inputs import InputError

# Keys that never change what a run simulates (or that the cells carry themselves: the seed, the
# compared policies). `policy.*` is handled apart: see differing_keys.
NOT_CONFIG = frozenset(
    {
        "seed",
        "seeds",
        "jobs",
        "compare_policies",
        "write_requests",
        "write_report",
        "offline_bound",
        "objective",
    }
)
NOT_CONFIG_PREFIXES = ("telemetry.", "trace.", "hydra.")
# Metrics of the headline figure and the sweep report: (column, label, higher is better).
HEADLINE = (
    ("realized_restore_s", "realized restore, s", False),
    ("ttft_p99_ms", "TTFT p99, ms", False),
    ("goodput_req_s", "goodput, req/s", True),
)
CONFIG = "config"  # column: the configuration's label (`key=value, ...`, one per configuration)


class RunSetError(InputError):
    """Runs that cannot be read, or a grouping that would pool different configurations."""


@dataclass
class Run:
    """One run folder: its path relative to the root, flattened config, cells and run_meta."""

    dir: Path
    name: str
    config: dict[str, Any]
    cells: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] | None = None
    trust: str = ""  # metrics.json's trust label ("" for a run made before runs carried one)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> `a.b.c` keys; lists become JSON text (one scalar per key)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out |= flatten(value, f"{prefix}{key}.")
        return out
    value = json.dumps(node) if isinstance(node, list) else node
    return {prefix.rstrip("."): value}


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(), parse_constant=lambda _: None)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunSetError(f"{path}: unreadable ({err})") from err


def read_config(run_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The run's flattened config: `.hydra/config.yaml`, else run_meta.json's config_yaml."""
    path = run_dir / ".hydra" / "config.yaml"
    text = path.read_text() if path.is_file() else meta.get("config_yaml")
    if text is None:
        return {}
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RunSetError(f"{run_dir}: config unreadable ({err})") from err
    if not isinstance(loaded, dict):
        raise RunSetError(f"{run_dir}: config is not a mapping")
    return flatten(loaded)


def read_run(run_dir: Path, root: Path) -> Run:
    """One run folder (it holds metrics.json)."""
    report = _load_json(run_dir / "metrics.json")
    cells = report.get("cells") if isinstance(report, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise RunSetError(f"{run_dir / 'metrics.json'}: key 'cells' missing or not a list")
    meta_path = run_dir / "run_meta.json"
    meta = _load_json(meta_path) if meta_path.is_file() else {}
    name = str(run_dir.relative_to(root)) if run_dir != root else "."
    trust = report.get("trust") if isinstance(report, dict) else None
    label = str(trust.get("label", "")) if isinstance(trust, dict) else ""
    config = read_config(run_dir, meta)
    return Run(run_dir, name, config, cells, meta, read_overrides(run_dir), label)


def find_runs(root: Path) -> list[Run]:
    """Every run folder at or under `root` (path order); a trace folder gives its run."""
    root = Path(root)
    if not (root / "metrics.json").is_file() and (root / "meta.json").is_file():
        root = root.parent.parent  # `<run>/trace/<policy>_seed<k>/`
    found = {p.parent for p in root.rglob("metrics.json") if not hidden(p, root)}
    dirs = sorted(found - {root})  # not a run's staging or trash folder (outdir.py)
    if (root / "metrics.json").is_file():
        dirs = [root, *dirs]
    runs = [read_run(d, root) for d in dirs]
    if any(not r.config for r in runs) and all(r.overrides is not None for r in runs):
        for r in runs:  # compare by what was overridden: the only config that every run has
            r.config = dict(r.overrides or {})
    return runs


def read_overrides(run_dir: Path) -> dict[str, Any] | None:
    """Hydra's `.hydra/overrides.yaml` as {key: typed value} (Hydra's override grammar), or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    try:
        items = yaml.safe_load(path.read_text()) or []
        parsed = OverridesParser.create().parse_overrides([str(i) for i in items])
    except (yaml.YAMLError, HydraException, TypeError) as err:
        raise RunSetError(f"{path}: cannot read the job's overrides ({err})") from err
    return {o.key_or_group: _scalar(o.value()) for o in parsed if not o.is_delete()}


def differing_keys(runs: Sequence[Run]) -> list[str]:
    """Config keys whose values differ between runs (a missing key counts as a value).

    Seeds, output switches and the policy name are not keys: cells carry policy and seed. A
    `policy.<param>` counts only when it differs between runs of the same policy name (a sweep
    over policies gives each its own defaults; those are the policy, not a configuration).
    """
    if len(runs) < 2:
        return []
    if any(not r.config for r in runs):
        bare = next(r for r in runs if not r.config)
        raise RunSetError(
            f"{bare.dir}: no .hydra/config.yaml, run_meta.json or overrides.yaml to compare runs by"
        )
    keys = list(dict.fromkeys(k for r in runs for k in r.config))
    missing = object()

    def varies(key: str, group: Sequence[Run]) -> bool:
        values = {json.dumps(r.config.get(key, missing), default=str) for r in group}
        return len(values) > 1

    out = []
    for key in keys:
        if key in NOT_CONFIG or key.startswith(NOT_CONFIG_PREFIXES) or key == "policy.name":
            continue
        if key.startswith("policy."):
            by_name: dict[Any, list[Run]] = {}
            for r in runs:
                by_name.setdefault(r.config.get("policy.name"), []).append(r)
            if any(varies(key, g) for g in by_name.values()):
                out.append(key)
        elif varies(key, runs):
            out.append(key)
    return out


def config_label(values: dict[str, Any]) -> str:
    """`key=value, ...` of one configuration; `one configuration` when nothing differs."""
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "one configuration"


def wrapped(label: str, width: int = 56) -> str:
    """A configuration label broken into lines at commas, for a panel title."""
    return textwrap.fill(label, width, break_long_words=False)


def run_labels(runs: Sequence[Run], keys: Sequence[str]) -> dict[str, str]:
    """Run name -> the label of its configuration."""
    return {r.name: config_label({k: r.config.get(k) for k in keys}) for r in runs}


def cells_frame(runs: Sequence[Run], keys: Sequence[str]) -> pl.DataFrame:
    """One row per (run, policy, seed): `job`, the differing keys, `config`, then the cell's
    metrics, with `ttft_p99_ms` added; refuses the same (config, policy, seed) twice."""
    labels = run_labels(runs, keys)
    rows = []
    for run in runs:
        for cell in run.cells:
            row = {"job": run.name, **{k: _scalar(run.config.get(k)) for k in keys}}
            row |= {CONFIG: labels[run.name]} | {k: _scalar(v) for k, v in cell.items()}
            if isinstance(cell.get("ttft_p99_s"), int | float):
                row["ttft_p99_ms"] = cell["ttft_p99_s"] * 1e3
            rows.append(row)
    if not rows:
        raise RunSetError("no run cells: every metrics.json found has an empty 'cells'")
    frame = pl.DataFrame(rows, infer_schema_length=None, strict=False)
    check_no_pooling(frame, [CONFIG, "policy"], keys)
    return frame


def _scalar(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, int | float | str) else str(value)


def check_no_pooling(frame: pl.DataFrame, group: Sequence[str], candidates: Sequence[str]) -> None:
    """Refuse a grouping under which two rows share a seed: they would be averaged as seeds.

    The error names the `candidates` columns that differ inside such a group (different
    configurations), or the `job` folders when nothing differs (the same run twice).
    """
    by = [*group, "seed"]
    dup = frame.group_by(by).len().filter(pl.col("len") > 1)
    if dup.height == 0:
        return
    rows = frame.join(dup.head(1).drop("len"), on=by, how="semi")
    differ = [c for c in candidates if c in rows.columns and rows[c].n_unique() > 1]
    if differ:
        raise RunSetError(
            f"refusing to pool different configurations as seeds: {', '.join(differ)} differ "
            "within one group; facet or hue by them, or select one value with --where"
        )
    jobs = sorted(set(rows["job"].to_list())) if "job" in rows.columns else []
    raise RunSetError(
        f"the same configuration and seed appears twice ({', '.join(jobs) or 'same folder'}): "
        "plot one of them"
    )


def group_stats(frame: pl.DataFrame, group: Sequence[str], metrics: Sequence[str]) -> pl.DataFrame:
    """Per group: `n` (seeds pooled) and, per metric, `<m>_mean`, `<m>_ci` (half-width of the
    95 % t interval over seeds, scipy; 0 for one seed; the figures' whiskers) and `<m>_low`,
    `<m>_high` (the percentile bootstrap interval of a non-negative metric, intervals.py: NaN
    under three seeds). Groups keep first-seen order."""
    rows = []
    for key, part in frame.group_by(list(group), maintain_order=True):
        row: dict[str, Any] = dict(zip(group, key, strict=True)) | {"n": part.height}
        for m in metrics:
            values = part[m].drop_nulls().cast(pl.Float64).to_numpy()
            mean, half = mean_ci(values) if values.size else (math.nan, math.nan)
            span = nonnegative_interval(values)  # the report's tables: never below 0
            row |= {f"{m}_mean": mean, f"{m}_ci": half, f"{m}_low": span.low,
                    f"{m}_high": span.high}  # fmt: skip
        rows.append(row)
    return pl.DataFrame(rows, strict=False)


def paired_vs_lru(frame: pl.DataFrame, metric: str = "realized_restore_s") -> pl.DataFrame:
    """Per (config, policy): mean and 95 % t interval over seeds of metric / LRU's metric on the
    same configuration and seed (`ratio_n` seeds where LRU's value is non-zero)."""
    lru = frame.filter(pl.col("policy") == "lru").select(
        CONFIG, "seed", pl.col(metric).alias("_lru")
    )
    joined = frame.join(lru, on=[CONFIG, "seed"], how="left").with_columns(
        pl.when(pl.col("_lru") > 0).then(pl.col(metric) / pl.col("_lru")).alias("ratio")
    )
    rows = []
    for (config, policy), part in joined.group_by(CONFIG, "policy", maintain_order=True):
        ratios = part["ratio"].drop_nulls().to_numpy()
        mean, half = mean_ci(ratios) if ratios.size else (math.nan, math.nan)
        span = nonnegative_interval(ratios)
        rows.append(
            {
                CONFIG: config,
                "policy": policy,
                "ratio_mean": mean,
                "ratio_ci": half,
                "ratio_low": span.low,
                "ratio_high": span.high,
                "ratio_n": int(ratios.size),
            }
        )
    floats = {k: pl.Float64 for k in ("ratio_mean", "ratio_ci", "ratio_low", "ratio_high")}
    return pl.DataFrame(rows, schema_overrides=floats)
