"""What a capacity plan asks: the workload (Hydra overrides of one simulation run), the SLA, the
search space, and the price of a GPU-hour per GPU type (conf/plan/prices.yaml, source and date)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import (
    POLICIES,
    ConfigError,
    Objective,
    Sealed,
    bounded,
    known_routers,
    require,
)
from cachepilot_sim.inputs import parse_overrides, read_yaml, refuse_special_file

PRICES_FILE = CONF_DIR / "plan" / "prices.yaml"
MAX_USD_PER_GPU_HOUR = 1e4  # a finite, physical price: an infinite one makes every cost equal
PD_SPLIT = re.compile(r"^(colocated|[1-9][0-9]*:[1-9][0-9]*)$")
# What the planner can rank the configurations meeting the SLA on (it records no E2E or restore).
PLAN_OBJECTIVES = (Objective.cost, Objective.ttft_p99, Objective.goodput)


class Launcher(StrEnum):
    JOBLIB = "joblib"  # worker processes on this machine (loky)
    RAY = "ray"  # joblib's Ray backend: a local Ray instance or a cluster (ray_address)


def known(group: str) -> list[str]:
    """The YAML choices of one config group (conf/<group>/*.yaml)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@dataclass
class SlaConfig(Sealed):
    """The service level a configuration must meet over the whole workload."""

    section: ClassVar[str | None] = "sla"
    ttft_p99_s: float = bounded(2.0, gt=0)
    tpot_p99_ms: float = bounded(50.0, gt=0)
    # Share of all requests that complete within their own TTFT and TPOT SLOs (replay.*_slo_ms).
    goodput_fraction: float = bounded(0.99, ge=0, le=1)


# The choices a cell combines, and how many cells one plan may hold: 10^4 cells are already up
# to 1.1 x 10^5 simulations; a product past it (a long offload_gb or pd_splits list) would run
# for days, and building its cells alone hung the planner before it printed anything.
CELL_KEYS = ("gpus", "tp", "policies", "routers", "batchers", "offload_gb", "pd_splits")
MAX_CELLS = 10_000


@dataclass
class SearchSpace(Sealed):
    """Every choice the planner may combine; replicas are searched, not enumerated."""

    section: ClassVar[str | None] = "space"
    gpus: list[str] = field(default_factory=lambda: ["h200"])
    tp: list[int] = field(default_factory=lambda: [1])
    policies: list[str] = field(default_factory=lambda: ["perc"])
    routers: list[str] = field(default_factory=lambda: ["least_outstanding"])
    batchers: list[str] = field(default_factory=lambda: ["adaptive"])
    offload_gb: list[float] = field(default_factory=lambda: [64.0])  # CPU store per replica; 0: off
    # "colocated", or "P:D": prefill and decode replicas in that ratio (scaled together).
    pd_splits: list[str] = field(default_factory=lambda: ["colocated"])
    max_replicas: int = bounded(16, ge=1, le=1024, integer=True)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        choices: dict[str, tuple[list[Any], list[Any]]] = {
            "gpus": (self.gpus, known("gpu")),
            "policies": (self.policies, POLICIES.names()),
            "routers": (self.routers, known_routers()),
            "batchers": (self.batchers, known("batcher")),
        }
        for key, (values, allowed) in choices.items():
            require(bool(values), f"{prefix}.{key}", values, "must list at least one choice")
            for v in values:
                require(v in allowed, f"{prefix}.{key}", v, f"unknown; known: {allowed}")
        for key in ("tp", "offload_gb", "pd_splits"):
            require(bool(getattr(self, key)), f"{prefix}.{key}", [], "must list a choice")
        counts = [len(getattr(self, key)) for key in CELL_KEYS]
        runs = 1 + math.ceil(math.log2(self.max_replicas))
        require(
            math.prod(counts) <= MAX_CELLS,
            prefix,
            " x ".join(f"{n} {key}" for key, n in zip(CELL_KEYS, counts, strict=True)),
            f"{math.prod(counts):,} cells, each up to {runs} simulations: at most "
            f"{MAX_CELLS:,} cells in one plan (the search would run for days and hold every "
            "cell in memory); narrow the space or split it into plans",
        )
        for tp in self.tp:
            require(isinstance(tp, int) and 1 <= tp <= 64, f"{prefix}.tp", tp, "1..64 GPUs")
        for gb in self.offload_gb:
            require(0 <= gb < 1e6, f"{prefix}.offload_gb", gb, "GB of CPU store, >= 0")
        for split in self.pd_splits:
            ok = isinstance(split, str) and bool(PD_SPLIT.match(split))
            require(ok, f"{prefix}.pd_splits", split, "'colocated' or 'P:D', e.g. '1:2'")
        for key in CELL_KEYS:
            values = [float(v) if key == "offload_gb" else v for v in getattr(self, key)]
            twice = sorted(str(v) for v, n in Counter(values).items() if n > 1)
            require(
                not twice,
                f"{prefix}.{key}",
                getattr(self, key),
                f"lists {', '.join(twice)} twice: one configuration would be simulated as "
                "several cells (and pooled as several samples)",
            )


@dataclass
class PlanConfig(Sealed):
    """One capacity-planning question (conf/plan/<name>.yaml)."""

    section: ClassVar[str | None] = ""
    name: str = bounded("plan", nonempty=True)
    # Hydra overrides of `python -m cachepilot_sim` that set the workload, model and SLOs.
    simulation: list[str] = field(default_factory=list)
    sla: SlaConfig = field(default_factory=SlaConfig)
    space: SearchSpace = field(default_factory=SearchSpace)
    prices: str = str(PRICES_FILE)
    seed: int = bounded(0, ge=0, integer=True)
    jobs: int = bounded(0, ge=0, integer=True)  # 0: one worker per core
    launcher: Launcher = Launcher.JOBLIB
    ray_address: str = ""  # with launcher=ray: "" starts a local Ray instance
    # How the configurations meeting the SLA are ranked (plan.md's "Best"): a capacity plan asks
    # for the cheapest by default; ttft_p99 or goodput pick the fastest or the most within SLO.
    objective: Objective = Objective.cost

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        allowed = [str(o) for o in PLAN_OBJECTIVES]
        ok = self.objective in PLAN_OBJECTIVES
        require(ok, "objective", str(self.objective), f"the planner ranks on one of {allowed}")


@dataclass(frozen=True, slots=True)
class GpuPrice:
    """One GPU type's price per GPU-hour and where it came from."""

    usd_per_gpu_hour: float
    source: str
    date: str


def load_plan(path: Path, overrides: list[str]) -> PlanConfig:
    """The plan file merged over the schema, then `key=value` overrides; validated. The file and
    the overrides are read as inputs.read_yaml reads YAML: UTF-8, no key twice, and `1:1` kept
    as the text written (YAML 1.1 would read 61)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    refuse_special_file(path, "plan file", ConfigError)
    if not path.is_file():
        raise ConfigError(f"plan file '{path}' not found")
    data = read_yaml(path, "plan file")
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}, not a mapping of keys"
        raise ConfigError(f"{path}: the plan file is {what}")
    try:
        given = OmegaConf.create(data)
        cli = OmegaConf.create()
        for key, value in parse_overrides(overrides):
            OmegaConf.update(cli, key, value, force_add=True)
        node = OmegaConf.merge(OmegaConf.structured(PlanConfig), given, cli)
        plan = OmegaConf.to_object(node)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{path}: config key '{key}': {str(err).splitlines()[0]}") from err
    assert isinstance(plan, PlanConfig)
    return plan


def load_prices(plan: PlanConfig) -> dict[str, GpuPrice]:
    """Prices of every GPU in the search space; a missing or non-positive one names its key."""

    path = Path(plan.prices)
    require(path.is_file(), "prices", plan.prices, "price file not found")
    table = read_yaml(path, "price file")
    entries = table.get("prices") if isinstance(table, dict) else None
    require(isinstance(entries, dict), f"{path}: prices", entries, "a mapping gpu -> price")
    assert isinstance(entries, dict)
    out: dict[str, GpuPrice] = {}
    for gpu in plan.space.gpus:
        entry = entries.get(gpu)
        key = f"{path}: prices.{gpu}"
        require(isinstance(entry, dict), key, entry, "missing (usd_per_gpu_hour, source, date)")
        assert isinstance(entry, dict)
        price = entry.get("usd_per_gpu_hour")
        number = isinstance(price, int | float) and not isinstance(price, bool)
        ok = number and 0 < price < MAX_USD_PER_GPU_HOUR  # type: ignore[operator]
        why = f"must be a number in (0, {MAX_USD_PER_GPU_HOUR:g})"  # NaN, infinity refused
        require(ok, f"{key}.usd_per_gpu_hour", price, why)
        for k in ("source", "date"):
            require(bool(entry.get(k)), f"{key}.{k}", entry.get(k), "every price cites one")
        out[gpu] = GpuPrice(float(price), str(entry["source"]), str(entry["date"]))  # type: ignore[arg-type]
    return out
