"""Factories for real config and simulation objects (no mocks): make_*(**overrides)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.config import (
    KVConfig,
    ModelConfig,
    PolicyConfig,
    SimConfig,
    WorkloadClass,
    WorkloadConfig,
)

# Trace experiments read $CACHEPILOT_TRACES_DIR; tests use the shipped samples (same layout), so
# they run the same on a clone without the full traces.
SAMPLES_DIR = Path(__file__).resolve().parents[1] / "cachepilot_sim" / "workloads" / "samples"
os.environ["CACHEPILOT_TRACES_DIR"] = str(SAMPLES_DIR)

MIXED = {
    "chat": dict(
        share=0.4,
        prompt_tokens_mean=256,
        output_tokens_mean=192,
        tpot_slo_ms=28,
        priority=3,
        turns_mean=5,
        think_time_mean_s=20,
    ),
    "code": dict(
        share=0.3,
        prompt_tokens_mean=512,
        output_tokens_mean=256,
        tpot_slo_ms=36,
        priority=2,
        turns_mean=4,
        think_time_mean_s=30,
    ),
    "summarize": dict(
        share=0.2,
        prompt_tokens_mean=1024,
        output_tokens_mean=128,
        tpot_slo_ms=25,
        ttft_slo_ms=4000,
        priority=1,
        turns_mean=2,
        think_time_mean_s=45,
    ),
    "longctx": dict(
        share=0.1,
        prompt_tokens_mean=8192,
        output_tokens_mean=512,
        tpot_slo_ms=55,
        ttft_slo_ms=10000,
        priority=0,
        turns_mean=3,
        think_time_mean_s=60,
    ),
}


def make_workload(**overrides: Any) -> WorkloadConfig:
    values: dict[str, Any] = dict(
        name="mixed",
        classes={k: WorkloadClass(**v) for k, v in MIXED.items()},
        num_requests=120,
        session_rate_per_s=0.5,
        spike_multiplier=4.0,
        spike_at_request=40,
        max_active_sessions=16,
    )
    values.update(overrides)
    return WorkloadConfig(**values)


def make_sim_config(**overrides: Any) -> SimConfig:
    """A small mixed-spike simulation; keyword overrides replace whole sections or fields."""
    values: dict[str, Any] = dict(
        seed=0,
        vram_gb=16.0,
        workload=make_workload(),
        model=ModelConfig(max_context_tokens=32768),
        kv=KVConfig(),
        policy=PolicyConfig(),
    )
    values.update(overrides)
    return SimConfig(**values)


@pytest.fixture
def sim_config() -> SimConfig:
    return make_sim_config()


class ListQueue:
    """An engine queue that records what a KV manager hands back (tests drive the manager)."""

    def __init__(self) -> None:
        self.handed_back: list[Any] = []

    def requeue_front(self, req: Any) -> None:
        self.handed_back.append(req)


def make_kv(cfg: SimConfig, policy: Any = None, estimator: Any = None) -> Any:
    """A KV manager for `cfg` on its own clock, with no processes, driven call by call.

    Its queue (`kv.queue`) is a `ListQueue`; the pool is `kv.pool`.
    """
    from cachepilot_sim.clock import SimEnvironment, s_to_us
    from cachepilot_sim.components.kv import KvDeps, make_kv_manager
    from cachepilot_sim.components.pcie_link import PcieLink
    from cachepilot_sim.components.signal import Signal
    from cachepilot_sim.components.vram_pool import VramPool
    from cachepilot_sim.cost import compute_fit, transfer_fits
    from cachepilot_sim.policies import GapEstimator, make_policy
    from cachepilot_sim.trace.events import TraceEvents
    from cachepilot_sim.trace.recorder import NullRecorder

    env = SimEnvironment()
    p = cfg.policy
    if estimator is None:
        estimator = GapEstimator(p.ema_weight, s_to_us(p.prior_gap_s), s_to_us(p.delta_s))
    if policy is None:
        policy = make_policy(p, estimator)
    deps = KvDeps(
        env,
        VramPool(cfg),
        PcieLink(env, *transfer_fits(cfg.hardware)),
        policy,
        estimator,
        compute_fit(cfg.hardware),
        TraceEvents(NullRecorder()),
        ListQueue(),
        Signal(env),
    )
    return make_kv_manager(cfg, deps)


def make_replay_requests(env: Any, workload: Any, priority: int = 1) -> list[Any]:
    """Every request of a replay workload, as the replay clients would send them (arrival now)."""
    from cachepilot_sim.components.request import Request

    t, sessions = workload.table, workload.sessions
    out: list[Any] = []
    for i in range(workload.num_requests):
        req = Request(
            env,
            i,
            i,
            int(sessions.turn[i]),
            0,
            0,
            priority,
            int(env.now),
            10**12,
            10**9,
            0,
            int(t.input_tokens[i]),
            int(t.output_tokens[i]),
        )
        req.hash_ids = t.hash_ids(i).tolist()
        req.group_id = int(sessions.session[i])
        parent = int(sessions.parent[i])
        req.parent = out[parent] if parent >= 0 else None
        out.append(req)
    return out


@pytest.fixture
def ray_tmpdir() -> Any:
    """A short folder for RAY_TMPDIR, directly under the system temp folder: Ray's socket paths
    under it must stay below 107 bytes, and pytest's own tree is too deep on an xdist worker
    (`.../pytest-N/popen-gw0/...`). Removed afterwards."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ray"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def smoke_cli_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`python -m cachepilot_sim +experiment=smoke` into a new folder, as a user runs it (no
    terminal, so no progress bar), run once: its folder and the finished process. Several tests
    read what it wrote and printed; none writes into it."""
    out = tmp_path_factory.mktemp("smoke") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "cachepilot_sim", "+experiment=smoke", f"hydra.run.dir={out}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out, proc


@pytest.fixture(scope="session")
def installed_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a fresh venv holding this checkout's wheel and only its declared dependencies
    (tests/install.py): the `cachepilot-sim` a user gets. Built once per session."""
    from tests.install import install

    root = tmp_path_factory.mktemp("installed")
    return install(root / "venv", root / "wheel")


@pytest.fixture(scope="session")
def tour(installed_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The README's quick commands run once, in README order, by the installed `cachepilot-sim`
    in an empty folder outside the checkout (tests/readme.py); several tests read the result."""
    from tests.readme import take_the_tour

    return take_the_tour(installed_bin, tmp_path_factory.mktemp("tour") / "work")


# --- Running on pytest-xdist workers (`make test` runs `-n 2 --dist loadgroup`) ----------------
# A fixture wider than one test (module or session scope, defined under tests/) is built once per
# worker that runs a test using it: the tests sharing one are put in one xdist group, so that the
# fixture (a sweep, the installed venv, the README tour) is built once, as in a serial run. A test
# marked `exclusive` (it times how soon processes stop after a signal) runs while no other test
# does: a gate lock and a shared/exclusive lock on files that all workers of the run open.


def _shared_fixtures(item: pytest.Item) -> list[str]:
    """Names of the module- and session-scoped fixtures from tests/ that `item` uses
    (`module.fixture` for a module's own)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    here = Path(__file__).resolve().parent
    found = []
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            code = getattr(getattr(fixturedef, "func", None), "__code__", None)
            source = Path(code.co_filename if code else "/")
            if fixturedef.scope != "function" and source.is_relative_to(here):
                found.append(name if fixturedef.scope == "session" else f"{source.stem}.{name}")
    return found


def _group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    """Mark each test that uses a shared fixture with one xdist group per connected set of such
    fixtures (tests sharing any of them, directly or through other tests, land on one worker)."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    uses = {item.nodeid: _shared_fixtures(item) for item in items}
    for item in items:  # the exclusive tests one after another: the others wait for them once
        if item.get_closest_marker("exclusive") is not None:
            uses[item.nodeid].insert(0, "exclusive")
    for names in uses.values():
        for other in names[1:]:
            parent[find(other)] = find(names[0])
    for item in items:
        if uses[item.nodeid]:
            item.add_marker(pytest.mark.xdist_group(find(uses[item.nodeid][0])))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Any:
    """Group the tests before xdist reads the groups into the node ids (`@group`), then make
    those ids stick: pytest-xdist 3.8 writes them to `item._nodeid`, which pytest 9.2 no longer
    reads (it keeps a parsed `item._id`), so that loadgroup would schedule each test on its own
    and build a shared fixture once per worker. A no-op where `_nodeid` is still the id."""
    grouping = getattr(config.option, "loadgroup", False)  # on workers of `--dist loadgroup`
    if grouping:
        _group_by_shared_fixtures(items)
    result = yield
    for item in items if grouping else []:
        grouped = item.__dict__.get("_nodeid")
        if isinstance(grouped, str) and grouped != item.nodeid and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId  # pytest >= 9.2 only

            item._id = NodeId.parse(grouped)
    return result


_gate: dict[str, Any] = {}  # the gate lock file, held across consecutive exclusive tests


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """On an xdist worker, hold the run lock shared (exclusive for an `exclusive` test) through
    the test's setup, call and teardown. A test takes the gate first: an exclusive test keeps it
    until the last of a row of exclusive tests ends, so that no other test starts meanwhile."""
    if not hasattr(item.config, "workerinput"):  # a plain run: nothing runs beside this test
        return (yield)
    locks = Path(item.config.option.basetemp).parent  # the run's basetemp, shared by workers
    exclusive = item.get_closest_marker("exclusive") is not None
    if "file" not in _gate:
        _gate["file"] = open(locks / "gate.lock", "a")  # held across tests
        fcntl.flock(_gate["file"], fcntl.LOCK_EX)
    with open(locks / "run.lock", "a") as run:
        fcntl.flock(run, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not (exclusive and nextitem and nextitem.get_closest_marker("exclusive")):
            _gate.pop("file").close()  # closing the file releases the gate
        return (yield)
