"""Mooncake JSON lines decoded to typed columns under one strict schema, and the numeric limits
every trace reader checks before converting to int64.

The typed polars decode (fast path) is used only when it coerces nothing; otherwise each line is
parsed with `json` (slow path, strict), so both paths accept and refuse the same values.
"""

from __future__ import annotations

import json
import math

import polars as pl

_LENGTHS = ("input_length", "output_length")
_FIELDS = frozenset({"timestamp", *_LENGTHS, "hash_ids"})
_HASH_TYPE = pl.List(pl.Int64)
MOONCAKE_SCHEMA = pl.Struct(
    {
        "timestamp": pl.Float64,
        "input_length": pl.Float64,
        "output_length": pl.Float64,
        "hash_ids": _HASH_TYPE,
    }
)

# Range limits checked before any float -> int64 conversion (NumPy would wrap with a warning).
# No request has 2^31 tokens: a longer one is a corrupt row, and the limit keeps token x byte
# products and float64 lengths exact. Timestamps and scaled arrivals stay within 2^61 us (73,000
# years) so that differences of two of them still fit in int64.
MAX_LENGTH_TOKENS = 2**31 - 1
MAX_TIME_US = 2**61
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Mooncake JSON: what the typed fast path would coerce (true -> 1.0, 1.5 -> hash 1, 2^70 -> null);
# a file with such a value is decoded by the strict slow path instead, so both paths agree.
_TEXT_SCHEMA = pl.Struct(
    {
        "timestamp": pl.Utf8,
        "input_length": pl.Utf8,
        "output_length": pl.Utf8,
        "hash_ids": pl.List(pl.Utf8),
    }
)


def decode_slow(lines: pl.DataFrame) -> pl.DataFrame:
    """Error path only (polars refused some line): parse line by line to name the bad ones.

    A line that is not a JSON object becomes a row of nulls with its reason in `parse_error`.
    """
    rows: dict[str, list[object]] = {
        k: [] for k in ("timestamp", *_LENGTHS, "hash_ids", "parse_error")
    }
    for raw in lines["raw"].to_list():
        try:
            obj = json.loads(raw, object_pairs_hook=_no_repeated_field)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            values = [_as_float(k, obj.get(k)) for k in ("timestamp", *_LENGTHS)]
            ids = _as_hash_ids(obj.get("hash_ids"))
            error = None
        except (ValueError, OverflowError, RecursionError) as err:  # JSONDecodeError: ValueError
            values, ids, error = [None, None, None], None, f"not a valid JSON request: {err}"
        for key, value in zip(
            ("timestamp", *_LENGTHS, "hash_ids", "parse_error"), (*values, ids, error), strict=True
        ):
            rows[key].append(value)
    schema = pl.Schema(
        [
            ("timestamp", pl.Float64),
            ("input_length", pl.Float64),
            ("output_length", pl.Float64),
            ("hash_ids", _HASH_TYPE),
            ("parse_error", pl.Utf8),
        ]
    )
    return pl.DataFrame(rows, schema=schema).with_columns(lines["line"])


def _no_repeated_field(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object, refused when it gives a request field twice (json keeps the last, polars
    may keep another: a guess either way)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out and key in _FIELDS:
            raise ValueError(f"'{key}' given twice")
        out[key] = value
    return out


def _as_float(key: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"'{key}' = {json.dumps(value)[:40]} is not a number")
    if isinstance(value, int) and abs(value) > MAX_TIME_US:
        raise ValueError(f"'{key}' = {value} is over the limit of {MAX_TIME_US}")
    return float(value)


def _as_hash_ids(ids: object) -> list[int] | None:
    """JSON integers within int64 (an integral float such as 1e3 is that integer, as in polars)."""
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise ValueError("'hash_ids' is not a list of integers")
    out = []
    for x in ids:
        if isinstance(x, float) and math.isfinite(x) and x.is_integer():
            x = int(x)
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"hash id {x!r:.40} is not an integer")
        if not _INT64_MIN <= x <= _INT64_MAX:
            raise ValueError(f"hash id {x} is outside int64 [{_INT64_MIN}, {_INT64_MAX}]")
        out.append(x)
    return out


def fast_decode(lines: pl.DataFrame) -> pl.DataFrame:
    """The typed polars decode, refused (PolarsError) when it would coerce a value.

    The same lines decoded as text show booleans, fractional or null hash ids and hash ids that
    did not fit int64 (null in the typed decode): such files go to the strict slow path.
    """
    frame = lines.select(
        "line",
        pl.col("raw").str.json_decode(MOONCAKE_SCHEMA).alias("j"),
        pl.col("raw").str.json_decode(_TEXT_SCHEMA).alias("t"),
    )
    typed, text = pl.col("j").struct, pl.col("t").struct
    lines_with_raw = frame.with_columns(lines["raw"])
    frame = lines_with_raw
    coerced = pl.any_horizontal(
        *(text.field(k).is_in(["true", "false"]) for k in ("timestamp", *_LENGTHS)),
        text.field("hash_ids")
        .list.eval(pl.element().is_null() | ~pl.element().str.contains(r"^-?\d+$"))
        .list.any(),
        typed.field("hash_ids").list.eval(pl.element().is_null()).list.any(),
        # a field given twice: the slow path refuses it (_no_repeated_field)
        *(pl.col("raw").str.count_matches(rf'"{k}"\s*:') > 1 for k in sorted(_FIELDS)),
    )
    if frame.select(coerced.fill_null(False).any()).item():
        raise pl.exceptions.ComputeError("a value would be coerced")
    return frame.select("line", "j").unnest("j")
