"""The config base class: validated on construction from field metadata, read-only afterwards.

A field states its bounds where it is declared (`field(default=0.3, metadata={"gt": 0, "le": 1})`,
or the `bounded` shorthand); `Sealed.validate` checks every such field by its full dotted key, and
a subclass adds rules that relate several fields by extending `validate`.
"""

from __future__ import annotations

import math
import operator
from dataclasses import field, fields
from typing import Any, ClassVar

from cachepilot_sim.inputs import InputError

GIB = 1024**3
GB = 10**9

# Bounds a field's metadata may state, with the words an error uses for each.
_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_COMPARE = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}


class ConfigError(InputError):
    """A config value that cannot be simulated; the message names the key and the value."""


def require(ok: bool, key: str, value: object, reason: str) -> None:
    """Raise a ConfigError naming `key` and `value` unless `ok`."""
    if not ok:
        raise ConfigError(f"config key '{key}' = {value!r}: {reason}")


def bounded(default: Any, **metadata: Any) -> Any:
    """A dataclass field with a default and validation metadata.

    Keys: `gt`, `ge`, `lt`, `le` (numeric bounds; the value must also be a finite number),
    `integer` (must be an int), `nonempty` (must be a non-empty string).
    """
    unknown = set(metadata) - {*_BOUNDS, "integer", "nonempty"}
    if unknown:
        raise TypeError(f"unknown field metadata {sorted(unknown)}")
    return field(default=default, metadata=metadata)


def join_key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def check_field(key: str, value: object, metadata: Any) -> None:
    """Check one value against its field's metadata; raise ConfigError naming `key`."""
    if metadata.get("nonempty"):
        require(isinstance(value, str) and bool(value), key, value, "must not be empty")
    if metadata.get("integer"):
        require(
            isinstance(value, int) and not isinstance(value, bool), key, value, "must be an integer"
        )
    bounds = [(op, metadata[op]) for op in _BOUNDS if op in metadata]
    if not bounds:
        return
    ok = (
        isinstance(value, int | float)
        and math.isfinite(value)
        and all(_COMPARE[op](value, limit) for op, limit in bounds)
    )
    require(
        ok,
        key,
        value,
        "must be a finite number " + " and ".join(f"{_BOUNDS[op]} {limit}" for op, limit in bounds),
    )


class Sealed:
    """Validated on construction, read-only afterwards.

    `section` is the dotted key prefix used in error messages ("" for top-level keys); None means
    the parent validates this object (dict values, whose key only the parent knows).
    """

    section: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if self.section is not None:
            self.validate(self.section)
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False):
            raise AttributeError(f"config is read-only after validation; cannot set {name!r}")
        object.__setattr__(self, name, value)

    def validate(self, prefix: str) -> None:
        """Check every field that carries metadata; subclasses add rules across fields."""
        for f in fields(self):  # type: ignore[arg-type]
            if f.metadata:
                check_field(join_key(prefix, f.name), getattr(self, f.name), f.metadata)
