"""Ground truth from a real serving engine: the folder format, a strict loader and its metrics.

One folder holds one run of one workload (format in docs/validation.md):
`requests.parquet` (one row per request, integer microseconds from the run's start),
optional `steps.parquet` (one row per engine step) and `engine.json` (the engine's resolved
configuration). The loader checks every column it uses and raises `GroundTruthError` with a
one-line message naming the file and the column, so bad or partial ground truth never turns
into a silently wrong error table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from cachepilot_sim.inputs import InputError, read_json, refuse_special_file

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
ENGINE_FILE = "engine.json"
HASH_COLUMN = "block_hash_ids"

STATUSES = ("finished", "failed", "missing")
_INT = "integer"
_STR = "string"
_INT_LIST = "list of integers"
# column -> kind; required columns must exist, optional ones are checked when present
REQUIRED_REQUEST_COLUMNS = {
    "request_id": _STR,
    "send_us": _INT,
    "prompt_tokens": _INT,
    "output_tokens": _INT,
    "first_token_us": _INT,
    "end_us": _INT,
    "status": _STR,
}
OPTIONAL_REQUEST_COLUMNS = {
    "session_id": _STR,
    "parent_id": _STR,
    "turn": _INT,
    "think_time_us": _INT,
    "max_new_tokens": _INT,
    "token_us": _INT_LIST,
    "num_soft_resets": _INT,
    "num_cpu_swaps": _INT,
    "prefix_hit_tokens": _INT,
    HASH_COLUMN: _INT_LIST,
}
REQUIRED_STEP_COLUMNS = {
    "start_us": _INT,
    "end_us": _INT,
    "num_requests": _INT,
    "prefill_tokens": _INT,
    "decode_tokens": _INT,
}
INT64_MAX = 2**63 - 1
MAX_TIME_US = 2**61  # as the trace readers bound a time: sums of times stay in int64
MAX_TOKENS = 2**31 - 1  # as the trace readers bound a length


class GroundTruthError(InputError):
    """Ground truth that cannot be used; the one-line message names the file and the column."""


@dataclass(frozen=True)
class GroundTruth:
    """One validated run: requests (all rows, any status), steps (or None) and the engine config."""

    path: Path
    requests: pl.DataFrame
    steps: pl.DataFrame | None
    engine: dict[str, Any]
    # Inter-token gaps (us) when the requests carry no token times (a simulator's replay).
    itl_us: pl.Series | None = None

    @property
    def workload(self) -> str:
        """The workload name: the folder's name, or its parent's for `<workload>/run<k>`."""
        if self.path.name.startswith("run") and self.path.name[3:].isdigit():
            return self.path.parent.name
        return self.path.name

    @property
    def finished(self) -> pl.DataFrame:
        return self.requests.filter(pl.col("status") == "finished")


def _kind_ok(dtype: pl.DataType, kind: str) -> bool:
    if kind == _INT:
        return dtype.is_integer() or dtype == pl.Null
    if kind == _STR:
        return dtype in (pl.String, pl.Categorical, pl.Null)
    if kind == _INT_LIST:
        if dtype == pl.Null:  # an all-null column
            return True
        return isinstance(dtype, pl.List) and (dtype.inner.is_integer() or dtype.inner == pl.Null)
    raise AssertionError(kind)


def _read_parquet(path: Path) -> pl.DataFrame:
    refuse_special_file(path, "ground-truth table", GroundTruthError)
    if not path.is_file():
        raise GroundTruthError(f"{path}: file not found")
    try:
        return pl.read_parquet(path)
    except Exception as err:  # polars raises several types for corrupt or non-Parquet files
        raise GroundTruthError(f"{path}: cannot read as Parquet ({type(err).__name__})") from err


def _check_columns(
    path: Path, df: pl.DataFrame, required: dict[str, str], optional: dict[str, str]
) -> pl.DataFrame:
    for col, kind in required.items():
        if col not in df.columns:
            raise GroundTruthError(f"{path}: missing column '{col}' ({kind})")
    for col, kind in {**required, **optional}.items():
        if col in df.columns and not _kind_ok(df.schema[col], kind):
            raise GroundTruthError(
                f"{path}: column '{col}' has type {df.schema[col]}, expected {kind}"
            )
    for col, kind in {**required, **optional}.items():
        if col in df.columns and kind in (_INT, _INT_LIST):
            dtype = df.schema[col]
            inner = dtype.inner if isinstance(dtype, pl.List) else dtype
            values = df[col].explode() if isinstance(dtype, pl.List) else df[col]
            top = values.max() if inner == pl.UInt64 else None
            if isinstance(top, int) and top > INT64_MAX:
                raise GroundTruthError(
                    f"{path}: column '{col}' holds a value above 2^63 - 1 ({top}): not a "
                    "count, time or id the replay can hold"
                )
    casts = [
        pl.col(c).cast(pl.Int64)
        for c, k in {**required, **optional}.items()
        if k == _INT and c in df.columns
    ]
    casts += [
        pl.col(c).cast(pl.String)
        for c, k in {**required, **optional}.items()
        if k == _STR and c in df.columns
    ]
    casts += [
        pl.col(c).cast(pl.List(pl.Int64))
        for c, k in {**required, **optional}.items()
        if k == _INT_LIST and c in df.columns
    ]
    return df.with_columns(casts)


def _fail_rows(path: Path, df: pl.DataFrame, bad: pl.Expr, col: str, reason: str) -> None:
    """Raise naming the column, the count and the first offending request when `bad` holds."""
    rows = df.filter(bad)
    if rows.height:
        first = rows["request_id"][0] if "request_id" in rows.columns else rows.row(0)
        raise GroundTruthError(
            f"{path}: column '{col}' {reason} in {rows.height} row(s) (first: {first!r})"
        )


def _validate_requests(path: Path, df: pl.DataFrame) -> pl.DataFrame:
    df = _check_columns(path, df, REQUIRED_REQUEST_COLUMNS, OPTIONAL_REQUEST_COLUMNS)
    if df.height == 0:
        raise GroundTruthError(f"{path}: no requests")
    _fail_rows(path, df, pl.col("request_id").is_null(), "request_id", "is null")
    dup = df.filter(pl.col("request_id").is_duplicated())
    if dup.height:
        raise GroundTruthError(
            f"{path}: column 'request_id' has {dup.height} duplicated row(s) "
            f"(first: {dup['request_id'][0]!r})"
        )
    fin = pl.col("status") == "finished"
    status_ok = pl.col("status").is_in(STATUSES)
    checks: list[tuple[str, pl.Expr, str]] = [
        ("status", ~status_ok | pl.col("status").is_null(), f"is not one of {', '.join(STATUSES)}")
    ]
    for col in ("send_us", "first_token_us", "end_us", "prompt_tokens", "output_tokens"):
        checks.append((col, fin & pl.col(col).is_null(), "is null for a finished request"))
    for col in ("send_us", "first_token_us", "end_us"):
        checks.append((col, pl.col(col) > MAX_TIME_US, f"is above {MAX_TIME_US} us"))
    for col in ("prompt_tokens", "output_tokens", "max_new_tokens"):
        if col in df.columns:
            checks.append((col, pl.col(col) > MAX_TOKENS, f"is above {MAX_TOKENS} tokens"))
    for col in ("turn", "think_time_us", "max_new_tokens", "num_soft_resets", "num_cpu_swaps",
                "prefix_hit_tokens"):  # fmt: skip
        if col in df.columns:
            checks.append((col, pl.col(col) < 0, "is negative"))
    if "think_time_us" in df.columns:
        checks.append(
            ("think_time_us", pl.col("think_time_us") > MAX_TIME_US, f"is above {MAX_TIME_US} us")
        )
    checks += [
        ("send_us", pl.col("send_us") < 0, "is negative"),
        ("prompt_tokens", pl.col("prompt_tokens") < 1, "is below 1"),
        ("output_tokens", fin & (pl.col("output_tokens") < 1), "is below 1 for a finished request"),
        ("first_token_us", pl.col("first_token_us") < pl.col("send_us"), "is before send_us"),
        ("end_us", pl.col("end_us") < pl.col("first_token_us"), "is before first_token_us"),
    ]
    if "token_us" in df.columns:
        tok = pl.col("token_us")
        has = fin & tok.is_not_null() & (tok.list.len() > 0)
        recorded = df.filter(fin & tok.is_not_null()).height > 0
        checks += [
            ("token_us", fin & tok.is_not_null() & (tok.list.len() == 0), "is an empty list"),
            ("token_us", tok.list.eval(pl.element().is_null()).list.any(), "holds a null time"),
        ]
        if recorded:  # token times for some finished requests only: ITL of a subset
            checks.append(
                (
                    "token_us",
                    fin & tok.is_null(),
                    "is null for a finished request while others have token times (null the "
                    "whole column when some were not recorded)",
                )
            )
        checks += [
            (
                "token_us",
                has & (tok.list.len() != pl.col("output_tokens")),
                "has a length other than output_tokens",
            ),
            (
                "token_us",
                has & (tok.list.first() != pl.col("first_token_us")),
                "does not start at first_token_us",
            ),
            ("token_us", has & (tok.list.last() != pl.col("end_us")), "does not end at end_us"),
            ("token_us", has & (tok.list.diff().list.min() < 0), "is not non-decreasing"),
        ]
    if "parent_id" in df.columns:
        unknown = ~pl.col("parent_id").is_in(df["request_id"].implode())
        checks.append(
            (
                "parent_id",
                pl.col("parent_id").is_not_null() & unknown,
                "names a request that is not in the file",
            )
        )
        sent = pl.col("parent_id").replace_strict(
            df["request_id"], df["send_us"], default=None, return_dtype=pl.Int64
        )
        df_parent = df.with_columns(parent_send_us=sent)
        _fail_rows(
            path,
            df_parent,
            (pl.col("parent_id") == pl.col("request_id")).fill_null(False),
            "parent_id",
            "names the request itself",
        )
        _fail_rows(
            path,
            df_parent,
            (pl.col("parent_send_us") >= pl.col("send_us")).fill_null(False),
            "parent_id",
            "names a request sent at or after this one (a parent comes earlier)",
        )
    for col, bad, reason in checks:
        _fail_rows(path, df, bad, col, reason)
    return df


def _validate_steps(path: Path, df: pl.DataFrame) -> pl.DataFrame:
    df = _check_columns(path, df, REQUIRED_STEP_COLUMNS, {})
    for col in REQUIRED_STEP_COLUMNS:
        bad = df.filter(pl.col(col).is_null() | (pl.col(col) < 0))
        if bad.height:
            raise GroundTruthError(
                f"{path}: column '{col}' is null or negative in {bad.height} row(s)"
            )
    if df.filter(pl.col("end_us") < pl.col("start_us")).height:
        raise GroundTruthError(f"{path}: column 'end_us' is before start_us")
    return df


def _read_engine(path: Path) -> dict[str, Any]:
    refuse_special_file(path, "engine settings", GroundTruthError)
    if not path.is_file():
        raise GroundTruthError(f"{path}: file not found")
    try:
        engine = read_json(path, "engine settings")
    except InputError as err:
        reason = str(err).removeprefix(f"{path}: ")
        raise GroundTruthError(f"{path}: cannot read as JSON ({reason})") from None
    if not isinstance(engine, dict):
        raise GroundTruthError(f"{path}: expected a JSON object, got {type(engine).__name__}")
    if not isinstance(engine.get("engine"), str) or not engine["engine"]:
        raise GroundTruthError(
            f"{path}: key 'engine' (the engine's name) is missing or not a string"
        )
    return engine


def _validate_block_hashes(folder: Path, df: pl.DataFrame, engine: dict[str, Any]) -> None:
    """`block_hash_ids`: one id per block of `block_size` (engine.json) tokens of the prompt, a
    partial last block optional (the capture names it, Mooncake style; the replay never shares
    it); ids unique in a row, and an id names its whole prefix, so it follows the same id in
    every row (else one cached block would have two parents)."""
    size = engine.get("block_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise GroundTruthError(
            f"{folder / ENGINE_FILE}: key 'block_size' (a positive integer) is needed by column "
            f"'{HASH_COLUMN}' of {REQUESTS_FILE}"
        )
    path, ids = folder / REQUESTS_FILE, pl.col(HASH_COLUMN)
    num = ids.list.len()
    full = pl.col("prompt_tokens") // size
    checks = [
        (ids.is_null() & (pl.col("status") == "finished"), "is null for a finished request"),
        (ids.list.eval(pl.element().is_null()).list.any(), "holds a null id"),
        (
            ids.is_not_null()
            & (num != full)
            & (num != (pl.col("prompt_tokens") + size - 1) // size),
            f"has a length other than prompt_tokens // {size} (block_size of {ENGINE_FILE}) "
            "or that plus a partial last block",
        ),
        (num != ids.list.n_unique(), "repeats an id within a row"),
    ]
    for bad, reason in checks:
        _fail_rows(path, df, bad.fill_null(False), HASH_COLUMN, reason)
    pos = (
        df.select("request_id", HASH_COLUMN)
        .explode(HASH_COLUMN)
        .drop_nulls(HASH_COLUMN)
        .with_columns(prev=pl.col(HASH_COLUMN).shift(1).over("request_id"))
    )
    # -1 can be a real id: compare (has a previous id, that id) pairs
    pos = pos.with_columns(first=pl.col("prev").is_null())
    clash = pos.group_by(HASH_COLUMN).agg(
        (pl.struct("first", "prev").n_unique() > 1).alias("clash")
    )
    bad_ids = clash.filter("clash")[HASH_COLUMN].implode()
    rows = pos.filter(pl.col(HASH_COLUMN).is_in(bad_ids))["request_id"].unique().implode()
    _fail_rows(
        path,
        df,
        pl.col("request_id").is_in(rows),
        HASH_COLUMN,
        "has an id that follows different ids in different rows (an id names its whole prefix)",
    )


def load_ground_truth(folder: str | Path) -> GroundTruth:
    """Load and validate one ground-truth folder; raises GroundTruthError on any problem."""
    path = Path(folder)
    if not path.is_dir():
        raise GroundTruthError(f"{path}: not a folder")
    requests = _validate_requests(path / REQUESTS_FILE, _read_parquet(path / REQUESTS_FILE))
    steps_path = path / STEPS_FILE
    steps = _validate_steps(steps_path, _read_parquet(steps_path)) if steps_path.exists() else None
    engine = _read_engine(path / ENGINE_FILE)
    if HASH_COLUMN in requests.columns:
        _validate_block_hashes(path, requests, engine)
    if requests.filter(pl.col("status") == "finished").height == 0:
        raise GroundTruthError(f"{path / REQUESTS_FILE}: column 'status' has no finished request")
    return GroundTruth(path, requests, steps, engine)


def find_runs(root: str | Path) -> list[Path]:
    """Every ground-truth folder under `root` (folders holding requests.parquet), sorted."""
    root = Path(root)
    if (root / REQUESTS_FILE).is_file():
        return [root]
    return sorted(p.parent for p in root.rglob(REQUESTS_FILE))
