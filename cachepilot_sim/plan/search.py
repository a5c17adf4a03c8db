"""The search: for each combination of GPU, TP, policy, router, batcher, offload size and P/D split
(a cell), the fewest replicas that meet the SLA, by binary search over the replica count.

Pruning rests on monotonicity: if N replicas miss the SLA, fewer miss it too (less capacity for the
same arrivals), so a cell costs 1 + ceil(log2(max_replicas)) simulations instead of max_replicas.
Cells run in parallel (joblib's loky worker processes here, or a Ray cluster through joblib's Ray
backend). Every simulation is deterministic per seed and results are ordered by cell, so a rerun
gives the same answer.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import ConfigError
from cachepilot_sim.entry import start_loky_tracker, worker_setup, workers_starting
from cachepilot_sim.plan.config import Launcher, PlanConfig, SlaConfig


@dataclass(frozen=True, slots=True, order=True)
class Cell:
    """One combination of the search space; replicas are searched within it."""

    gpu: str
    tp: int
    policy: str
    router: str
    batcher: str
    offload_gb: float
    pd_split: str

    def label(self) -> str:
        return (
            f"{self.gpu} tp{self.tp} {self.policy} {self.router} {self.batcher} "
            f"offload {self.offload_gb:g} GB {self.pd_split}"
        )

    def overrides(self, scale: int) -> list[str]:
        """Hydra overrides of this cell at `scale` (replicas, or P/D groups of the split)."""
        out = [
            f"gpu={self.gpu}",
            f"tp={self.tp}",
            f"policy={self.policy}",
            "compare_policies=[]",
            f"router={self.router}",
            f"batcher={self.batcher}",
        ]
        if self.offload_gb > 0:
            out.append(f"kv.cpu_store_bytes={int(self.offload_gb * 1e9)}")
        else:
            out.append("kv.offload_enabled=false")
        if self.pd_split == "colocated":
            out += ["cluster=colocated", f"cluster.replicas={scale}"]
        else:
            p, d = (int(x) for x in self.pd_split.split(":"))
            out += [
                "cluster=disaggregated",
                f"cluster.prefill_replicas={p * scale}",
                f"cluster.decode_replicas={d * scale}",
            ]
        return out

    def num_gpus(self, scale: int) -> int:
        if self.pd_split == "colocated":
            return scale * self.tp
        p, d = (int(x) for x in self.pd_split.split(":"))
        return (p + d) * scale * self.tp


def cells_of(plan: PlanConfig) -> list[Cell]:
    """Every cell of the search space, in a fixed order."""
    s = plan.space
    return sorted(
        Cell(g, tp, pol, r, b, float(gb), pd)
        for g in s.gpus
        for tp in s.tp
        for pol in s.policies
        for r in s.routers
        for b in s.batchers
        for gb in s.offload_gb
        for pd in s.pd_splits
    )


@dataclass(slots=True)
class Evaluation:
    """One simulated configuration (a cell at one scale) against the SLA."""

    cell: Cell
    scale: int
    num_gpus: int
    ttft_p99_s: float
    tpot_p99_ms: float
    goodput_fraction: float
    requests: int
    rejected_requests: int
    misses: dict[str, dict[str, float]] = field(default_factory=dict)  # SLA term -> value, limit
    hardware_profile: str = ""
    trust: str = ""  # the engine label (trust.py): engine, hardware, measured error

    @property
    def meets(self) -> bool:
        return not self.misses

    def record(self) -> dict[str, Any]:
        return asdict(self) | {"cell": asdict(self.cell), "meets": self.meets}


@dataclass(slots=True)
class CellResult:
    """A cell's search: every evaluation in the order run, the smallest scale that met the SLA
    (0: none up to max_replicas), or the config error that refused the cell."""

    cell: Cell
    evaluations: list[Evaluation]
    best_scale: int = 0
    refused: str = ""


def sla_terms(frame: pl.DataFrame) -> tuple[float, float, float]:
    """(TTFT p99 s, TPOT p99 ms, goodput fraction) of a run's request table: percentiles over
    completed requests (TPOT over those with more than one token), goodput over all requests
    (a rejected request misses its SLO)."""
    done = frame.filter(pl.col("outcome") == "completed")
    ttft = done["ttft_us"].to_numpy() / 1e6
    tpot = done.filter(pl.col("generated") > 1)["tpot_us"].to_numpy() / 1e3
    p99 = float(np.percentile(ttft, 99)) if ttft.size else math.inf
    tp99 = float(np.percentile(tpot, 99)) if tpot.size else 0.0
    good = float(frame["sla_met"].cast(pl.Float64).mean() or 0.0) if frame.height else 0.0  # type: ignore[arg-type]
    return p99, tp99, good


def misses_of(sla: SlaConfig, ttft: float, tpot: float, good: float) -> dict[str, dict[str, float]]:
    """Which SLA terms a run missed, with its value and the limit."""
    out: dict[str, dict[str, float]] = {}
    if ttft > sla.ttft_p99_s:
        out["ttft_p99_s"] = {"value": ttft, "limit": sla.ttft_p99_s}
    if tpot > sla.tpot_p99_ms:
        out["tpot_p99_ms"] = {"value": tpot, "limit": sla.tpot_p99_ms}
    if good < sla.goodput_fraction:
        out["goodput_fraction"] = {"value": good, "limit": sla.goodput_fraction}
    return out


def compose_run(plan: PlanConfig, cell: Cell, scale: int) -> Any:
    """The RunConfig of `cell` at `scale`: the plan's simulation overrides, then the cell's; the
    GPU's whole memory per replica, one seed, no trace. Raises ConfigError naming the key."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from cachepilot_sim.config import register_configs, to_config

    register_configs()
    overrides = [
        *plan.simulation,
        *cell.overrides(scale),
        f"seed={plan.seed}",
        "seeds=1",
        "trace.enabled=false",
    ]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = compose(config_name="config", overrides=overrides)
        node.vram_gb = node.gpu.hbm_gb  # each replica's GPU, all of it
        run = to_config(node)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(str(err).splitlines()[0]) from err
    mode = str(run.batcher.mode)
    if mode != cell.batcher:  # an engine profile pins its own batching rule over the cell's
        raise ConfigError(
            f"config key 'space.batchers' = {cell.batcher!r}: engine {run.engine.name} "
            f"schedules with batcher {mode} (its captured rule); put {mode!r} in space.batchers"
        )
    return run


def evaluate(plan: PlanConfig, cell: Cell, scale: int) -> Evaluation:
    """Simulate `cell` at `scale` and score it against the plan's SLA."""
    from cachepilot_sim.cost.gpu_scaling import hardware_note
    from cachepilot_sim.sim import make_simulation
    from cachepilot_sim.trust import engine_label, trust_for

    run = compose_run(plan, cell, scale)
    sim_cfg = run.sim_for(run.policy.name, run.seed)
    frame = make_simulation(sim_cfg).run().requests
    ttft, tpot, good = sla_terms(frame)
    rejected = int((frame["outcome"] != "completed").sum())
    note = str(hardware_note(sim_cfg).get("hardware_profile", ""))
    misses = misses_of(plan.sla, ttft, tpot, good)
    n_gpus = cell.num_gpus(scale)
    trust = engine_label(trust_for(sim_cfg))
    return Evaluation(
        cell, scale, n_gpus, ttft, tpot, good, frame.height, rejected, misses, note, trust
    )


def search_cell(plan: PlanConfig, cell: Cell) -> CellResult:
    """The fewest replicas of `cell` meeting the SLA: the largest scale first (a miss there
    rejects the cell), then binary search below it, each miss ruling out every smaller scale."""
    top = plan.space.max_replicas
    try:
        evals = [evaluate(plan, cell, top)]
    except ConfigError as err:  # refused (a model that does not fit the GPU at this TP, say)
        return CellResult(cell, [], refused=str(err))
    if not evals[0].meets:
        return CellResult(cell, evals)
    lo, hi = 1, top  # invariant: hi meets; every scale below lo misses
    while lo < hi:
        mid = (lo + hi) // 2
        evals.append(evaluate(plan, cell, mid))
        if evals[-1].meets:
            hi = mid
        else:
            lo = mid + 1
    return CellResult(cell, evals, best_scale=hi)


def _search_in_worker(parent: int, plan: PlanConfig, cell: Cell) -> CellResult:
    """search_cell in a pool worker: the worker exits with the planner and leaves a Ctrl-C or a
    closed terminal to it (entry.worker_setup), so a stopped plan leaves no worker behind and
    prints one line, not a traceback per worker. joblib terminates its workers on the interrupt."""
    if os.getpid() != parent:
        worker_setup(parent)
    return search_cell(plan, cell)


def run_search(plan: PlanConfig, cells: list[Cell]) -> list[CellResult]:
    """Search every cell in parallel on the plan's launcher; results in cell order."""
    import joblib

    jobs = plan.jobs or -1
    parent = os.getpid()
    tasks = (joblib.delayed(_search_in_worker)(parent, plan, cell) for cell in cells)
    if plan.launcher == Launcher.RAY:
        import ray
        from ray.util.joblib import register_ray

        register_ray()
        ray.init(address=plan.ray_address or None, include_dashboard=False, log_to_driver=False)
        try:
            with joblib.parallel_backend("ray"):
                return list(joblib.Parallel(n_jobs=jobs)(tasks))
        finally:
            ray.shutdown()
    return _run_on_loky(plan, cells, parent)


def _run_on_loky(plan: PlanConfig, cells: list[Cell], parent: int) -> list[CellResult]:
    """The cells on joblib's loky workers, started with SIGINT and SIGHUP blocked
    (entry.workers_starting) and ignored by their initializer (entry.worker_setup): a Ctrl-C
    that reached a worker still importing printed its traceback (joblib.Parallel starts its
    workers while it dispatches, where the planner cannot block them). Stopped on an interrupt."""
    from joblib.externals.loky import ProcessPoolExecutor as LokyPool

    num_workers = min(plan.jobs or os.cpu_count() or 1, len(cells))
    if num_workers <= 1:
        return [search_cell(plan, cell) for cell in cells]
    start_loky_tracker()
    pool = LokyPool(num_workers, initializer=worker_setup, initargs=(parent,))
    todo = list(enumerate(cells))
    running: dict[Future[CellResult], int] = {}
    results: dict[int, CellResult] = {}

    def dispatch() -> None:  # one cell per worker: none waits in loky's queues when stopped
        while todo and len(running) < num_workers:
            index, cell = todo.pop(0)
            running[pool.submit(search_cell, plan, cell)] = index

    try:
        with workers_starting():  # the first submit starts every worker
            dispatch()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                results[running.pop(future)] = future.result()
            dispatch()
    except BaseException:  # SIGINT, SIGTERM, SIGHUP, a failed cell: stop every worker now
        for future in running:
            future.cancel()
        pool.shutdown(wait=True, kill_workers=True)
        raise
    pool.shutdown(wait=True)
    return [results[i] for i in range(len(cells))]
