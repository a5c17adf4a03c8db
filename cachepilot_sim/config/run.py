"""One simulation's config (SimConfig) and one experiment's (RunConfig: policies x seeds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar

from cachepilot_sim.config.admission import AdmissionConfig
from cachepilot_sim.config.base import GB, ConfigError, Sealed, bounded, require
from cachepilot_sim.config.cluster import ROUTERS, ClusterConfig, RouterConfig
from cachepilot_sim.config.engine import BatcherConfig, KVConfig, SchedulerConfig
from cachepilot_sim.config.engine_profile import EngineConfig
from cachepilot_sim.config.engine_rules import check_captured_engine
from cachepilot_sim.config.hardware import GpuSpecConfig, HardwareConfig
from cachepilot_sim.config.model import ModelConfig
from cachepilot_sim.config.policy import ALL_POLICIES, POLICIES, PolicyConfig
from cachepilot_sim.config.workload import ReplayConfig, TraceFormat, WorkloadConfig


class Objective(StrEnum):
    """The metric a comparison of policies (and the planner) ranks on. Members are lower case so
    that `objective=ttft_p99` reads as written (OmegaConf matches an enum by member name)."""

    ttft_p99 = "ttft_p99"  # time to first token, p99 over completed requests: lower is better
    e2e_p99 = "e2e_p99"  # end-to-end latency, p99: lower is better
    goodput = "goodput"  # requests per second meeting their TTFT and TPOT SLOs: higher is better
    restore_s = "restore_s"  # seconds returning sessions waited for KV reload + recompute: lower
    cost = "cost"  # GPU-seconds per completed request (runs) or USD per hour (planner): lower


@dataclass
class TraceConfig(Sealed):
    """Event trace to Parquet: on/off, iteration sampling, session sampling, rows per chunk."""

    section: ClassVar[str | None] = "trace"
    enabled: bool = True
    iteration_every: int = bounded(10, gt=0, integer=True)
    chunk_rows: int = bounded(200_000, gt=0, integer=True)
    # Keep every row of one session in k (session id % k == 0); 1 traces every session.
    session_every: int = bounded(1, gt=0, integer=True)


@dataclass
class TelemetryConfig(Sealed):
    """What a run reports while and after it runs (never changes results): a rich progress bar
    when stdout is a terminal, the Prometheus exposition file, a 127.0.0.1 metrics server."""

    section: ClassVar[str | None] = "telemetry"
    progress: bool = True
    # A 1000-request cell has about 10,000 events: a report every 1,000 moves the bar ~10 times.
    progress_every_events: int = bounded(1_000, gt=0)
    prometheus_file: bool = True
    # 0: no server; else serve /metrics on 127.0.0.1:<port> during the run.
    prometheus_port: int = bounded(0, ge=0, le=65535, integer=True)
    # Simulated seconds between live metric ticks (experiment/live.py: the dashboard's gauges,
    # counters and histograms, served and in metrics.prom); 0: no live metrics. The name is kept
    # from when it counted wall seconds: a renamed field would change every run id (repr(cfg)).
    live_metrics_every_s: float = bounded(1.0, ge=0)


@dataclass
class SimConfig(Sealed):
    """Everything one simulation needs: one policy, one seed."""

    section: ClassVar[str | None] = ""  # its keys are top-level
    seed: int = bounded(0, ge=0, integer=True)  # numpy's SeedSequence takes non-negative integers
    vram_gb: float = bounded(16.0, gt=0)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    extra_models: list[ModelConfig] = field(default_factory=list)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # The GPU type (conf/gpu; not the H200: the calibration scaled by datasheet ratios,
    # cost/gpu_scaling.py) and the tensor-parallel degree: `vram_gb` is per GPU, the weights and
    # KV heads are split over `tp` GPUs. Out of the repr (the run id) while at their defaults.
    gpu: GpuSpecConfig = field(default_factory=GpuSpecConfig, repr=False)
    tp: int = field(default=1, repr=False, metadata={"ge": 1, "le": 64, "integer": True})
    # Out of repr: a run id is the digest of repr(config), and one replica's runs keep the ids
    # they had before clusters existed (outdir.run_id adds both sections for a real cluster).
    cluster: ClusterConfig = field(default_factory=ClusterConfig, repr=False)
    router: RouterConfig = field(default_factory=RouterConfig, repr=False)

    @property
    def vram_bytes(self) -> int:
        return int(self.vram_gb * GB)

    @property
    def models(self) -> list[ModelConfig]:
        return [self.model, *self.extra_models]

    @property
    def kv_pool_bytes(self) -> int:
        """VRAM left for KV after every model's pinned weights and the activation reserve, or the
        engine profile's pool of `engine.kv_pool_blocks` blocks."""
        if self.engine.kv_pool_blocks:
            tokens = self.engine.kv_pool_blocks * self.kv.block_tokens
            return tokens * self.model.kv_bytes_per_token
        weights = sum(m.weight_bytes for m in self.models)
        if self.tp == 1:
            return self.vram_bytes - weights - self.kv.activation_reserve_bytes
        # Each GPU holds 1/tp of the weights and ceil(kv_heads / tp) of the KV heads of every
        # token: more GPUs hold more tokens until the KV heads run out and are replicated.
        per_gpu = self.vram_bytes - weights // self.tp - self.kv.activation_reserve_bytes
        heads = self.model.num_kv_heads
        return per_gpu * heads // -(-heads // self.tp)

    def __post_init__(self) -> None:
        # The policy's workload-dependent settings resolved for this run's workload, before the
        # config is validated and sealed (PolicyConfig.for_workload).
        object.__setattr__(self, "policy", self.policy.for_workload(self.replay))
        super().__post_init__()

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        names = [m.name for m in self.models]
        require(len(set(names)) == len(names), "extra_models", names, "model names must be unique")
        # A TP group's all-reduce is priced on the GPU's own link (gpu.interconnect_gbps); a
        # group wider than a node would cross the slower inter-node network, which is not priced.
        require(
            self.tp <= self.cluster.gpus_per_node,
            "tp",
            self.tp,
            f"wider than a node (cluster.gpus_per_node = {self.cluster.gpus_per_node}): the "
            "inter-node link of a TP group is not modelled",
        )
        if self.replay.format != TraceFormat.NONE:
            require(
                self.replay.hash_block_tokens % self.kv.block_tokens == 0,
                "replay.hash_block_tokens",
                self.replay.hash_block_tokens,
                f"must be a multiple of kv.block_tokens = {self.kv.block_tokens}",
            )
        for cls_name, cls in self.workload.classes.items():
            require(
                cls.model in ("", *names),
                f"workload.classes.{cls_name}.model",
                cls.model,
                f"no such model; configured: {names}",
            )
        if self.kv.offload_dtype_bytes:
            require(
                all(self.kv.offload_dtype_bytes <= m.kv_dtype_bytes for m in self.models),
                "kv.offload_dtype_bytes",
                self.kv.offload_dtype_bytes,
                "must not exceed any model's kv_dtype_bytes (0: as on the GPU)",
            )
        self._check_gpu()
        self._check_fits()
        self._check_router()

    def _check_router(self) -> None:
        """The session KV manager (synthetic workloads) keys KV by session id, not content: a
        session that moved replica would find a stale record of an earlier turn there, so on
        several replicas its turns must stay on one; nor can it use a cluster's shared tier,
        which holds blocks by prefix hash."""
        require(
            not self.cluster.shared_tier.enabled or self.replay.format != TraceFormat.NONE,
            "cluster.shared_tier.capacity_gb",
            self.cluster.shared_tier.capacity_gb,
            "the shared tier holds prefix-hash blocks: it needs a trace replay (replay.format)",
        )
        if self.cluster.single or self.replay.format != TraceFormat.NONE:
            return

        def keeps(name: str) -> bool:
            return bool(getattr(ROUTERS.entry(name).factory, "keeps_sessions", False))

        sticky = [n for n in ROUTERS.names() if keeps(n)]
        require(
            keeps(self.router.name),
            "router.name",
            self.router.name,
            f"synthetic session workloads keep a session's KV by session id, so on several "
            f"replicas its turns must stay on one replica: use router={' or '.join(sticky)}, "
            f"or a trace replay (replay.format), whose KV is shared by prefix hash",
        )

    def _check_gpu(self) -> None:
        require(
            self.vram_gb <= self.gpu.hbm_gb,
            "vram_gb",
            self.vram_gb,
            f"more than gpu {self.gpu.name!r} has ({self.gpu.hbm_gb:g} GB, gpu.hbm_gb)",
        )
        # a fitted or physical step cost: the rules and GPUs its errors were measured with
        check_captured_engine(self.engine, self.batcher, self.gpu, self.tp, self.replay.measuring)

    def _check_fits(self) -> None:
        if self.engine.kv_pool_blocks:
            return  # the engine's own pool size; it fits by construction
        weights = sum(m.weight_bytes for m in self.models)
        largest_block = max(m.kv_bytes_per_token for m in self.models) * self.kv.block_tokens
        at_tp = (
            f" over tp={self.tp} GPUs ({weights / self.tp / GB:.2f} GB each)" if self.tp > 1 else ""
        )
        require(
            self.kv_pool_bytes >= 64 * largest_block,
            "vram_gb",
            self.vram_gb,
            f"cannot hold the model on gpu {self.gpu.name!r}{at_tp}: {weights / GB:.2f} GB of "
            "pinned weights plus "
            f"{self.kv.activation_reserve_bytes / GB:.2f} GB activation reserve leave "
            f"{self.kv_pool_bytes / GB:.3f} GB, under 64 KV blocks",
        )


@dataclass
class RunConfig(SimConfig):
    """Top-level Hydra config: a SimConfig plus what to compare (policies x seeds)."""

    # Single-seed comparisons of eviction policies mislead; past 1,000 a run only builds its
    # cells (policies x seeds) for minutes before it prints anything (it hung at 10^9).
    seeds: int = bounded(5, ge=1, le=1000, integer=True)
    # Policies run side by side, each with its registered config: `policy`'s own fields apply to
    # the policy it names, the others get their defaults; the shared fields apply to all.
    compare_policies: list[str] = field(default_factory=list)
    # Per-policy settings inside a comparison: `policies.marconi.flop_weight=2` next to
    # `compare_policies=[marconi,lru]` (a compared policy's own fields; see policy_for). Out of
    # repr while empty, so that every run id from before it existed stays as it was.
    policies: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    write_requests: bool = True
    # report.md, report.html (headline figure embedded), results.csv and run_meta.json in the run
    # folder (cachepilot_sim/experiment/report.py); about a second of matplotlib per run.
    write_report: bool = True
    jobs: int = bounded(0, ge=0)  # worker processes for the (policy, seed) cells; 0: one per core
    # Policy lab: after each cell, the offline LP lower bound on restore cost over its recorded
    # access sequence (cachepilot_sim/experiment/offline.py).
    offline_bound: bool = False
    # The metric the answer ranks policies on, each shown as its difference to the baseline
    # (experiment/ranking.py). Out of repr: it changes what is shown, not what is simulated, so a
    # run keeps its id (outdir.run_id).
    objective: Objective = field(default=Objective.ttft_p99, repr=False)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        for name in self.compare_policies:
            if name == ALL_POLICIES and len(self.compare_policies) == 1:
                continue
            require(
                name in POLICIES,
                "compare_policies",
                name,
                f"unknown policy; known: {POLICIES.names()} (or [{ALL_POLICIES}] alone)",
            )

        for name in self.policies:
            self._check_policy_settings(name)

    def _check_policy_settings(self, name: str) -> None:
        """`policies.<name>` names a compared policy and only its own fields; its values are
        checked by building that policy's config."""
        key = f"policies.{name}"
        require(name in POLICIES, key, name, f"unknown policy; known: {POLICIES.names()}")
        compared = self.policy_names()
        require(
            name in compared,
            key,
            dict(self.policies[name]),
            f"policy {name!r} is not compared (compare_policies={compared}): add it there or "
            "drop the setting",
        )
        own = own_policy_fields(name)
        for field_name in self.policies[name]:
            require(
                field_name in own,
                f"{key}.{field_name}",
                self.policies[name][field_name],
                f"not a setting of policy {name!r}; its own: {sorted(own)}"
                + (" (shared ones are set once, as policy.<key>)" if field_name in SHARED else ""),
            )
            if name == self.policy.name:  # the same field set two ways: neither may be lost
                fresh = POLICIES.entry(name).config(name=name).for_workload(self.replay)
                default = getattr(fresh, field_name)
                mine = getattr(self.policy, field_name)
                require(
                    mine == default or mine == self.policies[name][field_name],
                    f"{key}.{field_name}",
                    self.policies[name][field_name],
                    f"policy.{field_name} = {mine!r} sets it too: set it once",
                )
        self.policy_for(name)

    def policy_names(self) -> list[str]:
        """The policies this run compares: `[all]` means every registered policy."""
        if list(self.compare_policies) == [ALL_POLICIES]:
            return POLICIES.names()
        return list(self.compare_policies) or [self.policy.name]

    def policy_for(self, name: str) -> PolicyConfig:
        """Policy `name`'s config in this run: `policy` itself when it names `name`; otherwise
        the registered class with its defaults and the shared fields (PolicyConfig's) of
        `policy`; then `policies.<name>`'s settings over either."""
        if name == self.policy.name:
            base = self.policy
        else:
            shared = {f: getattr(self.policy, f) for f in SHARED}
            base = POLICIES.entry(name).config(**(shared | {"name": name}))
        settings = self.policies.get(name)
        if not settings:
            return base
        values = {f.name: getattr(base, f.name) for f in fields(base)} | dict(settings)
        return typed_policy_config(name, values)

    def sim_for(self, policy_name: str, seed: int) -> SimConfig:
        """The SimConfig of one (policy, seed) cell of this run."""
        values = {f.name: getattr(self, f.name) for f in fields(SimConfig)}
        values.update(seed=seed, policy=self.policy_for(policy_name))
        return SimConfig(**values)


SHARED = frozenset(f.name for f in fields(PolicyConfig))  # every policy's fields, set as policy.*


def own_policy_fields(name: str) -> set[str]:
    """The fields policy `name`'s registered config adds to PolicyConfig's shared ones."""
    return {f.name for f in fields(POLICIES.entry(name).config)} - SHARED


def typed_policy_config(name: str, values: dict[str, Any]) -> PolicyConfig:
    """Policy `name`'s config from `values` (the command line's strings and numbers), typed by
    OmegaConf as a `policy.` override is; an error names the key as `policies.<name>.<field>`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    cls = POLICIES.entry(name).config
    try:
        node = OmegaConf.merge(OmegaConf.structured(cls), values)
        obj = OmegaConf.to_object(node)
    except ValidationError as err:
        field_name = str(err.full_key).split(".")[-1]
        reason = str(err.msg).splitlines()[0]
        raise ConfigError(
            f"config key 'policies.{name}.{field_name}' = {values.get(field_name)!r}: {reason}"
        ) from None
    except ConfigError as err:  # the class's own validation names its keys `policy.<field>`
        raise ConfigError(str(err).replace("'policy.", f"'policies.{name}.", 1)) from None
    assert isinstance(obj, PolicyConfig)
    return obj


def _with_topology(cls: Any) -> None:
    """Append `gpu` and `tp` to the dataclass repr when they differ from one H200: the run id is
    a digest of the repr, so every run from before they existed keeps its id."""
    generated: Callable[[SimConfig], str] = cls.__repr__

    def __repr__(self: SimConfig) -> str:
        text = generated(self)
        if self.tp == 1 and self.gpu.figures() == GpuSpecConfig().figures():
            return text
        return f"{text[:-1]}, gpu={self.gpu!r}, tp={self.tp})"

    cls.__repr__ = __repr__


_with_topology(SimConfig)
_with_topology(RunConfig)


def _with_policy_settings(cls: Any) -> None:
    """Append `policies` to RunConfig's repr (so to its run id) when it holds a setting."""
    before: Callable[[RunConfig], str] = cls.__repr__

    def __repr__(self: RunConfig) -> str:
        text = before(self)
        return f"{text[:-1]}, policies={self.policies!r})" if self.policies else text

    cls.__repr__ = __repr__


_with_policy_settings(RunConfig)
