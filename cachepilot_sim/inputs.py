"""The input-checking layer every entry point shares (issue 30): a bad input stops the command with
one line naming the file, row, column or key, exit status 2, no traceback, nothing written.

Every reader raises an `InputError` (the project's error types for configs, traces, ground truth,
converters, profiles and output folders derive from it); `entry.entry_point` turns it, an
`OSError` and a stop signal into that one line. The readers here (`read_text`, `read_json`,
`read_yaml`, `parse_overrides`) are the strict versions the tools use: a file that is not
UTF-8, a JSON key given twice, a NaN, or a YAML 1.1 base-60 number (`1:1` read as 61) is refused
or kept as written, never reinterpreted.
"""

from __future__ import annotations

import json
import math
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """An input the command cannot use; the message names the file, row, column or key."""


def one_line(text: object) -> str:
    """`text` as one line: its lines joined by `; ` (a message printed to a terminal or a log)."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def refuse_special_file(
    path: Path, what: str = "file", error: type[InputError] = InputError
) -> None:
    """`error` naming `path` when it exists but is neither a regular file nor a folder: a FIFO
    (reading blocks until a writer comes, in polars' and numpy's readers past any signal), a
    device (`/dev/zero` never ends) or a socket. A missing path is left to the caller."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise error(
            f"{path}: not a regular file (a FIFO, device or socket): the {what} is refused, "
            "reading it could block or never end"
        )


def read_text(path: Path, what: str = "file") -> str:
    """The text of `path`, UTF-8; missing, unreadable, not a regular file or not UTF-8 is an
    InputError naming it."""
    refuse_special_file(path, what)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read the {what} ({err.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line}: the {what} is not UTF-8 text") from None


def _no_duplicates(path: Path) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise InputError(f"{path}: key {key!r} given twice")
            out[key] = value
        return out

    return build


def _no_constant(path: Path) -> Callable[[str], Any]:
    def refuse(name: str) -> Any:
        raise InputError(f"{path}: {name} is not a JSON number")

    return refuse


def read_json(path: Path, what: str = "JSON file") -> Any:
    """Strict JSON from `path`: a key given twice, NaN or ±Infinity, or malformed text is an
    InputError naming the file and line."""
    return parse_json(read_text(path, what), path)


def parse_json(text: str, path: Path, *, allow_nan: bool = False) -> Any:
    """`text` (from `path`) as strict JSON (see read_json); `allow_nan` reads NaN and ±Infinity
    (for files whose writer emits them where a statistic is empty: check each value used)."""
    constant = None if allow_nan else _no_constant(path)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(path), parse_constant=constant)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: line {err.lineno} column {err.colno}: {err.msg}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply") from None


def _yaml_loader() -> Any:
    """OmegaConf's YAML loader (duplicate keys refused) that keeps `1:1` or `1:30:00` as the text
    written: YAML 1.1 reads an unquoted base-60 number as 61 or 5400, a reading no user means."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    base = get_yaml_loader()
    numbers = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}

    class PlainLoader(base):  # type: ignore[misc,valid-type]
        def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
            tag = super().resolve(kind, value, implicit)
            if kind is yaml.ScalarNode and implicit[0] and ":" in value and tag in numbers:
                return "tag:yaml.org,2002:str"
            return tag

    return PlainLoader


def parse_yaml(text: str, where: str) -> Any:
    """`text` as YAML (see _yaml_loader); malformed YAML is an InputError naming `where` and the
    line and column."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or one_line(err)
        raise InputError(f"{where}: {at}invalid YAML ({problem})") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply") from None


def read_yaml(path: Path, what: str = "YAML file") -> Any:
    """The YAML document in `path` (UTF-8, duplicate keys refused, `1:1` kept as text)."""
    return parse_yaml(read_text(path, what), str(path))


def parse_overrides(overrides: Sequence[str]) -> list[tuple[str, Any]]:
    """`key=value` command-line overrides as (key, value), each value read as read_yaml reads a
    file's; an override without `=` or with an empty key is an InputError naming it."""
    out = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"override {item!r}: expected key=value")
        value = parse_yaml(raw, f"override {item!r}") if raw else ""
        out.append((key.strip(), value))
    return out


def finite_number(value: object, where: str, *, integer: bool = False) -> float:
    """`value` as a finite number (an int where `integer`); a bool, a string, NaN or ±inf is an
    InputError naming `where`."""
    kind = "an integer" if integer else "a finite number"
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InputError(f"{where} = {value!r}: must be {kind}")
    try:
        number = float(value)
    except OverflowError:
        raise InputError(f"{where} = {value}: out of range") from None
    if not math.isfinite(number) or (integer and not number.is_integer()):
        raise InputError(f"{where} = {value!r}: must be {kind}")
    return number
