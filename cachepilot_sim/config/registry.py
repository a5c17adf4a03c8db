"""Named choices and their config classes: the one place that knows which names exist.

An eviction policy or an admission controller registers under a name with the config class it
reads and the factory that builds it. The config package validates names here and Hydra's
ConfigStore learns each class from here, so the registry is the config schema: choosing a name
chooses its fields. The registry sits below both configs and the registered modules, so neither
imports the other to learn a name.

Each registry names its provider, the package whose modules register into it on import, and
imports it at its first lookup (as a plugin registry loads its entry points). So importing the
package loads nothing (`python -m cachepilot_sim.kernels.bench` needs no simulator), and a config
that is validated has every name it may choose, whichever module the caller imported first.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Generic, TypeVar

from cachepilot_sim.config.base import ConfigError, Sealed

C = TypeVar("C", bound=Sealed)
F = TypeVar("F")


@dataclass(frozen=True, slots=True)
class Entry(Generic[C, F]):
    config: type[C]
    factory: F


class Registry(Generic[C, F]):
    """Names -> (config class, factory) of one kind (`group` is its Hydra config group)."""

    def __init__(self, kind: str, group: str, base: type[C], provider: str = "") -> None:
        self.kind, self.group, self.base = kind, group, base
        self.provider = provider  # the package whose modules register here when imported
        self._entries: dict[str, Entry[C, F]] = {}
        self._loaded = not provider

    def _load(self) -> None:
        """Import the provider once, before the first lookup (its imports call `add`)."""
        if not self._loaded:
            self._loaded = True  # first: a provider module that looks a name up must not recurse
            importlib.import_module(self.provider)

    def add(self, name: str, factory: F, config: type[C] | None = None) -> None:
        """Register `name`; a duplicate name, or a config class not derived from the base, is an
        error."""
        config = config or self.base
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if not issubclass(config, self.base):
            raise TypeError(
                f"{self.kind} {name!r}: {config.__name__} does not derive from {self.base.__name__}"
            )
        self._entries[name] = Entry(config, factory)

    def remove(self, name: str) -> None:
        """Forget `name` (tests that register a toy choice clean up with this)."""
        del self._entries[name]

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def entry(self, name: str) -> Entry[C, F]:
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {self.names()}") from None

    def check(self, key: str, cfg: C) -> None:
        """`cfg.name` is registered and `cfg` is an instance of exactly its config class."""
        name = getattr(cfg, "name")  # noqa: B009  (every registered config has a name)
        if name not in self:
            raise ConfigError(
                f"config key '{key}' = {name!r}: unknown {self.kind}; known: {self.names()}"
            )
        want = self._entries[name].config
        if type(cfg) is not want:
            raise ConfigError(
                f"config key '{key}' = {name!r}: {self.kind} {name!r} reads {want.__name__}, "
                f"not {type(cfg).__name__}; choose it as {self.group}={name}"
            )
