"""Readers for public LLM-serving traces: Mooncake JSONL, Azure LLM inference 2023 CSV, ShareGPT.

Each reader scans its file with polars (lazy, streaming engine), checks every row with vectorised
expressions and returns one `TraceTable` of NumPy columns. A bad row (missing field, NaN, negative
or fractional length, unparseable time, timestamps going backwards, `hash_ids` not matching the
input's blocks) raises `TraceError` naming the file, the line and the reason, unless
`on_error=SKIP`: then every skipped row is counted per reason in `TraceTable.skipped`, never
dropped silently.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from cachepilot_sim.config import OnError, TraceFormat
from cachepilot_sim.inputs import InputError, refuse_special_file
from cachepilot_sim.workloads.trace_json import (
    _LENGTHS,
    MAX_LENGTH_TOKENS,
    MAX_TIME_US,
    decode_slow,
    fast_decode,
)

AZURE_COLUMNS = {
    "TIMESTAMP": "timestamp",
    "ContextTokens": "input_length",
    "GeneratedTokens": "output_length",
}
SHAREGPT_COLUMNS = {"num_prefill_tokens": "input_length", "num_decode_tokens": "output_length"}


class TraceError(InputError):
    """A trace file that cannot be replayed; the message names the file, the line and the reason."""


@dataclass
class TraceTable:
    """Validated requests of one trace, in file order. Times are integer microseconds."""

    path: str
    line: np.ndarray  # 1-based line of each request in the source file
    arrival_us: np.ndarray  # relative to the first request (0 for formats without timestamps)
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_offsets: np.ndarray | None = None  # request i's hash ids: hash_values[off[i]:off[i+1]]
    hash_values: np.ndarray | None = None
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows skipped (on_error=skip)

    @property
    def num_requests(self) -> int:
        return int(self.input_tokens.shape[0])

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def hash_ids(self, i: int) -> np.ndarray:
        if self.hash_offsets is None or self.hash_values is None:
            return np.empty(0, dtype=np.int64)
        return self.hash_values[self.hash_offsets[i] : self.hash_offsets[i + 1]]

    def head(self, n: int) -> TraceTable:
        """The first n requests (all when n <= 0 or n >= the number of requests)."""
        if n <= 0 or n >= self.num_requests:
            return self
        offsets = values = None
        if self.hash_offsets is not None and self.hash_values is not None:
            offsets = self.hash_offsets[: n + 1]
            values = self.hash_values[: offsets[-1]]
        return TraceTable(
            self.path,
            self.line[:n],
            self.arrival_us[:n],
            self.input_tokens[:n],
            self.output_tokens[:n],
            offsets,
            values,
            dict(self.skipped),
        )


def _length_reason(name: str) -> pl.Expr:
    c = pl.col(name)
    return (
        pl.when(c.is_null())
        .then(pl.lit(f"missing or non-numeric field '{name}'"))
        .when(c.is_nan())
        .then(pl.lit(f"'{name}' is NaN"))
        .when(c < 0)
        .then(pl.format(f"negative '{name}' = {{}}", c))
        .when(c.is_infinite())
        .then(pl.lit(f"'{name}' is infinite"))
        .when(c != c.floor())
        .then(pl.format(f"'{name}' = {{}} is not a whole number", c))
        .when(c < 1)
        .then(pl.lit(f"'{name}' is 0 (every request needs at least one token)"))
        .when(c > MAX_LENGTH_TOKENS)
        .then(pl.format(f"'{name}' = {{}} is over the limit of {MAX_LENGTH_TOKENS} tokens", c))
    )


def _row_reasons(hash_block_tokens: int | None, time_to_us: float) -> pl.Expr:
    """The first reason a row is bad, or null: lengths, then timestamp, then hash ids."""
    reasons = [_length_reason(name) for name in _LENGTHS]
    ts = pl.col("timestamp")
    reasons.append(
        pl.when(ts.is_null())
        .then(pl.lit("missing or unparseable 'timestamp'"))
        .when(ts.is_nan() | ts.is_infinite())
        .then(pl.lit("'timestamp' is not finite"))
        .when(ts.abs() * time_to_us > MAX_TIME_US)
        .then(pl.format(f"'timestamp' = {{}} is over the limit of {MAX_TIME_US} us", ts))
    )
    if hash_block_tokens is not None:
        h = pl.col("hash_ids")
        need = (pl.col("input_length") / hash_block_tokens).ceil().cast(pl.Int64, strict=False)
        reasons.append(
            pl.when(h.is_null())
            .then(pl.lit("missing field 'hash_ids'"))
            .when(h.list.len() != need)
            .then(
                pl.format(
                    "'hash_ids' has {} entries but input_length {} needs {} blocks of "
                    f"{hash_block_tokens} tokens",
                    h.list.len(),
                    pl.col("input_length"),
                    need,
                )
            )
            .when(h.list.n_unique() != h.list.len())
            .then(pl.lit("'hash_ids' repeats an id"))
        )
    return pl.coalesce(reasons)


def _validate(
    frame: pl.DataFrame,
    path: Path,
    on_error: OnError,
    hash_block_tokens: int | None,
    time_to_us: float,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """Drop or raise on bad rows; returns the good rows and the skip counts per reason."""
    checked = frame.with_columns(_row_reasons(hash_block_tokens, time_to_us).alias("reason"))
    skipped: dict[str, int] = {}
    bad = checked.filter(pl.col("reason").is_not_null())
    good = checked.filter(pl.col("reason").is_null())
    # A timestamp below an earlier good one goes backwards (rows dropped above do not count).
    prev = pl.col("timestamp").cum_max().shift(1)
    good = good.with_columns(
        pl.when(pl.col("timestamp") < prev)
        .then(
            pl.format(
                "timestamp {} goes backwards (an earlier row has {})", pl.col("timestamp"), prev
            )
        )
        .alias("reason")
    )
    bad = pl.concat([bad, good.filter(pl.col("reason").is_not_null())]).sort("line")
    good = good.filter(pl.col("reason").is_null())
    if bad.height and on_error == OnError.RAISE:
        row = bad.row(0, named=True)
        raise TraceError(
            f"{path}:{row['line']}: {row['reason']} (set replay.on_error=SKIP to "
            f"skip bad rows; {bad.height} bad rows in this file)"
        )
    if bad.height:
        # Count by the reason's kind: the text with every number written as N.
        kinds = (
            bad["reason"].str.replace_all(r"-?\d+(\.\d+)?(e-?\d+)?", "N").value_counts(sort=True)
        )
        skipped = dict(zip(kinds["reason"].to_list(), kinds["count"].to_list(), strict=True))
    return good.drop("reason"), skipped


def _scan_lines(path: Path) -> pl.LazyFrame:
    """The file as one text column with its 1-based line numbers; blank lines are dropped."""
    return (
        pl.scan_csv(
            path, has_header=False, separator="\x1f", quote_char=None, schema={"raw": pl.Utf8}
        )
        .with_row_index("line", offset=1)
        .filter(pl.col("raw").is_not_null() & (pl.col("raw").str.strip_chars() != ""))
    )


def read_mooncake(path: Path, on_error: OnError, hash_block_tokens: int = 512) -> TraceTable:
    """Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`."""
    lines = _scan_lines(path).collect(engine="streaming")
    try:
        frame = fast_decode(lines).with_columns(pl.lit(None, pl.Utf8).alias("parse_error"))
    except pl.exceptions.PolarsError:
        frame = decode_slow(lines)
    parse_bad = frame.filter(pl.col("parse_error").is_not_null())
    if parse_bad.height and on_error == OnError.RAISE:
        row = parse_bad.row(0, named=True)
        raise TraceError(f"{path}:{row['line']}: {row['parse_error']}")
    frame = frame.filter(pl.col("parse_error").is_null()).drop("parse_error")
    good, skipped = _validate(frame, path, on_error, hash_block_tokens, 1_000.0)
    good = _check_prefix_tree(good, path, on_error, skipped)
    if parse_bad.height:
        skipped = {"not a valid JSON request": parse_bad.height, **skipped}
    table = _to_table(good, path, skipped, time_to_us=1_000.0)
    lengths = good["hash_ids"].list.len().to_numpy().astype(np.int64)
    table.hash_offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    table.hash_values = good["hash_ids"].explode().to_numpy().astype(np.int64)
    if lengths.sum() == 0:
        table.hash_values = np.empty(0, dtype=np.int64)
    return table


def _check_prefix_tree(
    good: pl.DataFrame, path: Path, on_error: OnError, skipped: dict[str, int]
) -> pl.DataFrame:
    """A prefix hash names its whole prefix: every occurrence of an id must follow the same id.

    Rows breaking this would make one cached block the child of two parents; they are bad rows.
    """
    # No sentinel for "first block": -1 (or any integer) can be a real id, so a first block and
    # one after id -1 compare as (null, -1), different.
    pos = (
        good.select("line", "hash_ids")
        .explode("hash_ids")
        .drop_nulls("hash_ids")
        .with_columns(pl.col("hash_ids").shift(1).over("line").alias("prev"))
    )
    first = pos.group_by("hash_ids", maintain_order=True).agg(
        pl.col("prev").first().alias("first_prev"), pl.col("line").first().alias("first_line")
    )
    clash = pos.join(first, on="hash_ids", how="left", maintain_order="left").filter(
        pl.col("prev").ne_missing(pl.col("first_prev"))
    )
    if clash.height == 0:
        return good
    row = clash.row(0, named=True)
    if on_error == OnError.RAISE:
        earlier = FIRST_BLOCK if row["first_prev"] is None else row["first_prev"]
        raise TraceError(
            f"{path}:{row['line']}: hash id {row['hash_ids']} follows {_after(row['prev'])} here "
            f"but {earlier} on line {row['first_line']}; prefix hashes "
            "must name the whole prefix (set replay.on_error=SKIP to skip such rows)"
        )
    bad_lines = clash["line"].unique()
    skipped["hash id follows a different prefix than on an earlier line"] = bad_lines.len()
    return good.filter(~pl.col("line").is_in(bad_lines.implode()))


FIRST_BLOCK = "no id (a first block)"  # not -1: any integer may be a real id


def _after(prev: int | None) -> str:
    return FIRST_BLOCK if prev is None else f"id {prev}"


def _scan_csv_columns(path: Path, columns: dict[str, str]) -> pl.DataFrame:
    """Read a CSV as text, check its header, and rename the needed columns. A column named twice
    is refused: which of the two holds the values is a guess."""
    _refuse_duplicate_columns(path)
    lf = pl.scan_csv(path, infer_schema=False).with_row_index("line", offset=2)
    header = lf.collect_schema().names()
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceError(f"{path}:1: header lacks column(s) {missing}; found {header[1:]}")
    return lf.select("line", *(pl.col(src).alias(dst) for src, dst in columns.items())).collect(
        engine="streaming"
    )


def _refuse_duplicate_columns(path: Path) -> None:
    try:
        with path.open(encoding="utf-8", newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return  # the reader's own error names it (_file_error)
    names = [h.strip() for h in header]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TraceError(f"{path}:1: header names column(s) {twice} more than once")


def _numeric(name: str) -> pl.Expr:
    return pl.col(name).str.strip_chars().cast(pl.Float64, strict=False)


def read_azure(path: Path, on_error: OnError) -> TraceTable:
    """Azure LLM inference 2023: TIMESTAMP (datetime), ContextTokens, GeneratedTokens."""
    raw = _scan_csv_columns(path, AZURE_COLUMNS)
    stamp = (
        pl.col("timestamp")
        .str.strip_chars()
        .str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", strict=False)
    )
    frame = raw.with_columns(
        (stamp.dt.epoch("ns").cast(pl.Float64) / 1_000.0).alias("timestamp"),
        *(_numeric(n) for n in _LENGTHS),
    )
    good, skipped = _validate(frame, path, on_error, None, 1.0)
    return _to_table(good, path, skipped, time_to_us=1.0)


def read_sharegpt(path: Path, on_error: OnError) -> TraceTable:
    """ShareGPT length statistics: num_prefill_tokens, num_decode_tokens; no timestamps."""
    raw = _scan_csv_columns(path, SHAREGPT_COLUMNS)
    frame = raw.with_columns(*(_numeric(n) for n in _LENGTHS), pl.lit(0.0).alias("timestamp"))
    good, skipped = _validate(frame, path, on_error, None, 1.0)
    return _to_table(good, path, skipped, time_to_us=1.0)


def _to_table(
    good: pl.DataFrame, path: Path, skipped: dict[str, int], time_to_us: float
) -> TraceTable:
    ts = good["timestamp"].to_numpy()
    arrival = np.rint((ts - (ts[0] if ts.size else 0.0)) * time_to_us).astype(np.int64)
    return TraceTable(
        str(path),
        good["line"].to_numpy().astype(np.int64),
        arrival,
        good["input_length"].to_numpy().astype(np.int64),
        good["output_length"].to_numpy().astype(np.int64),
        skipped=skipped,
    )


def _file_error(path: Path, fmt: TraceFormat, err: Exception) -> str:
    """One line for a file polars or the OS refused: unreadable, not UTF-8, empty, ragged CSV."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, OSError):
        return f"{path}: cannot read ({err.strerror or text})"
    if "utf-8" in text.lower():
        return f"{path}: not UTF-8 text ({text}); is it a binary file?"
    if isinstance(err, pl.exceptions.NoDataError):
        return f"{path}:1: empty file (a {fmt!s} trace needs a header line)"
    if fmt != TraceFormat.MOONCAKE and "fields" in text:
        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f)
            width = len(next(rows, []))
            for num, row in enumerate(rows, start=2):
                if row and len(row) != width:
                    return (
                        f"{path}:{num}: {len(row)} fields but the header has {width} (ragged CSV)"
                    )
    return f"{path}: cannot read as a {fmt!s} trace ({text})"


def require_trace_file(p: Path) -> None:
    """TraceError naming `p` when it is not a file (checked again before a run writes anything)."""
    refuse_special_file(p, "trace file", TraceError)
    if not p.is_file():
        raise TraceError(
            f"{p}: no such trace file (set replay.path, or CACHEPILOT_TRACES_DIR to "
            f"a folder laid out like cachepilot_sim/workloads/samples)"
        )


def read_trace(
    fmt: TraceFormat, path: str | Path, on_error: OnError, hash_block_tokens: int = 512
) -> TraceTable:
    """Read and validate one trace file of the given format."""
    p = Path(path)
    require_trace_file(p)
    try:
        if fmt == TraceFormat.MOONCAKE:
            table = read_mooncake(p, on_error, hash_block_tokens)
        elif fmt == TraceFormat.AZURE:
            table = read_azure(p, on_error)
        elif fmt == TraceFormat.SHAREGPT:
            table = read_sharegpt(p, on_error)
        else:
            raise TraceError(f"{p}: trace format {fmt!r} has no reader")
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as err:
        raise TraceError(_file_error(p, fmt, err)) from err
    if table.num_requests == 0:
        raise TraceError(f"{p}: no valid requests (skipped: {table.skipped})")
    assert math.isfinite(float(table.arrival_us[-1]))
    return table
