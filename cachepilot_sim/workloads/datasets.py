"""Local dataset exports as conversation turns: ShareGPT-style conversation lists (JSON/JSONL),
Alpaca-style flat records (instruction, input, output) and Kaggle-style turn tables
(conversation_id, role, message; CSV/Parquet).

Every format becomes one polars table of messages (conversation, position, role, text); a request
is an assistant message: its prompt is every earlier message of the conversation (the new part is
what came after the previous answer) and its response is the message itself.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import polars as pl

from cachepilot_sim.inputs import InputError, refuse_special_file

USER_ROLES = ("human", "user", "system", "prompter")
ASSISTANT_ROLES = ("gpt", "assistant", "chatgpt", "bard", "bing", "model", "bot")


class DatasetFormat(StrEnum):
    AUTO = "auto"
    SHAREGPT = "sharegpt"
    ALPACA = "alpaca"
    TURNS = "turns"


class DatasetError(InputError):
    """A dataset that cannot be profiled; the message names the file and the reason."""


def _read_records(path: Path) -> pl.DataFrame:
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            return pl.read_ndjson(path, infer_schema_length=None)
        if suffix == ".json":
            return pl.read_json(path, infer_schema_length=None)
        if suffix == ".csv":
            return pl.read_csv(path, infer_schema=False)
        if suffix == ".parquet":
            return pl.read_parquet(path)
    except pl.exceptions.PolarsError as err:
        if suffix == ".jsonl":
            _raise_bad_json_line(path)
        raise DatasetError(f"{path}: cannot be read as {suffix[1:]}: {err}") from None
    raise DatasetError(f"{path}: unknown extension {suffix!r} (.json, .jsonl, .csv, .parquet)")


def _raise_bad_json_line(path: Path) -> None:
    """Error path only (polars refused the file): name the first line that is not a JSON object."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                if not isinstance(json.loads(line), dict):
                    raise ValueError("not a JSON object")
            except ValueError as err:
                raise DatasetError(f"{path}:{number}: not a valid JSON record: {err}") from None


def detect_format(frame: pl.DataFrame, path: Path) -> DatasetFormat:
    cols = set(frame.columns)
    if cols & {"conversations", "messages", "conversation"} and not {"role", "message"} <= cols:
        return DatasetFormat.SHAREGPT
    if {"instruction", "output"} <= cols:
        return DatasetFormat.ALPACA
    if {"conversation_id", "role", "message"} <= cols:
        return DatasetFormat.TURNS
    raise DatasetError(
        f"{path}: columns {sorted(cols)} match no known layout: ShareGPT needs 'conversations' "
        "(or 'messages'), Alpaca 'instruction' and 'output', turn tables 'conversation_id', "
        "'role' and 'message'"
    )


def _sharegpt(frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    col = next(c for c in ("conversations", "messages", "conversation") if c in frame.columns)
    dtype = frame.schema[col]
    if not isinstance(dtype, pl.List) or not isinstance(dtype.inner, pl.Struct):
        raise DatasetError(f"{path}: '{col}' is {dtype}, expected a list of messages")
    fields = {f.name for f in dtype.inner.fields}
    role = next((f for f in ("from", "role") if f in fields), None)
    text = next((f for f in ("value", "content", "text") if f in fields), None)
    if role is None or text is None:
        raise DatasetError(
            f"{path}: messages have fields {sorted(fields)}; need 'from'/'role' "
            "and 'value'/'content'"
        )
    return (
        frame.select(col)
        .with_row_index("conversation")
        .explode(col)
        .drop_nulls(col)
        .with_columns(pl.int_range(pl.len()).over("conversation").alias("position"))
        .select(
            "conversation",
            "position",
            pl.col(col).struct.field(role).cast(pl.Utf8).alias("role"),
            pl.col(col).struct.field(text).cast(pl.Utf8).alias("text"),
        )
    )


def _alpaca(frame: pl.DataFrame) -> pl.DataFrame:
    extra = pl.col("input").fill_null("") if "input" in frame.columns else pl.lit("")
    prompt = (
        pl.when(extra.str.len_chars() > 0)
        .then(pl.col("instruction").fill_null("") + pl.lit("\n\n") + extra)
        .otherwise(pl.col("instruction"))
    )
    base = frame.with_row_index("conversation")
    user = base.select(
        "conversation",
        pl.lit(0).alias("position"),
        pl.lit("user").alias("role"),
        prompt.cast(pl.Utf8).alias("text"),
    )
    answer = base.select(
        "conversation",
        pl.lit(1).alias("position"),
        pl.lit("assistant").alias("role"),
        pl.col("output").cast(pl.Utf8).alias("text"),
    )
    return pl.concat([user, answer]).sort("conversation", "position")


def _turns(frame: pl.DataFrame) -> pl.DataFrame:
    # Row order within a conversation is the turn order (a 'turn' column, if any, wins).
    order = "turn" if "turn" in frame.columns else None
    base = frame.with_row_index("row")
    base = base.with_columns(
        pl.col("conversation_id").rank("dense").cast(pl.Int64).alias("conversation")
    )
    keys: list[str | pl.Expr] = ["conversation"]
    if order:
        keys.append(pl.col(order).cast(pl.Int64, strict=False))
    base = base.sort([*keys, "row"])
    return base.select(
        "conversation",
        pl.int_range(pl.len()).over("conversation").alias("position"),
        pl.col("role").cast(pl.Utf8),
        pl.col("message").cast(pl.Utf8).alias("text"),
    )


def read_messages(
    path: Path, fmt: DatasetFormat = DatasetFormat.AUTO, max_records: int = 0
) -> tuple[pl.DataFrame, DatasetFormat, dict[str, int]]:
    """(messages, the format used, skipped messages per reason). Roles are normalised to
    'user' / 'assistant'; messages with an unknown role or no text are skipped and counted."""
    refuse_special_file(path, "dataset", DatasetError)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    frame = _read_records(path)
    if max_records > 0:
        frame = frame.head(max_records)
    fmt = detect_format(frame, path) if fmt == DatasetFormat.AUTO else DatasetFormat(fmt)
    if fmt == DatasetFormat.SHAREGPT:
        msgs = _sharegpt(frame, path)
    elif fmt == DatasetFormat.ALPACA:
        msgs = _alpaca(frame)
    else:
        msgs = _turns(frame)
    role = pl.col("role").str.to_lowercase().str.strip_chars()
    msgs = msgs.with_columns(
        pl.when(role.is_in(USER_ROLES))
        .then(pl.lit("user"))
        .when(role.is_in(ASSISTANT_ROLES))
        .then(pl.lit("assistant"))
        .otherwise(None)
        .alias("role_norm"),
    )
    reasons = (
        pl.when(pl.col("text").is_null() | (pl.col("text").str.len_chars() == 0))
        .then(pl.lit("empty or missing text"))
        .when(pl.col("role_norm").is_null())
        .then(pl.format("unknown role '{}'", pl.col("role")))
    )
    msgs = msgs.with_columns(reasons.alias("reason"))
    bad = msgs.filter(pl.col("reason").is_not_null())["reason"].value_counts(sort=True)
    skipped = dict(zip(bad["reason"].to_list(), bad["count"].to_list(), strict=True))
    good = msgs.filter(pl.col("reason").is_null()).select(
        "conversation", "position", pl.col("role_norm").alias("role"), "text"
    )
    if good.height == 0:
        raise DatasetError(f"{path}: no usable messages (skipped: {skipped})")
    return good, fmt, skipped
