"""How a run starts and how it ends when it is told to stop.

Start: everything a run can be refused for (its config, a missing trace or learned-weights file, a
run folder that cannot be made) is checked by `Preflight`, a Hydra callback that runs before Hydra
creates the run folder, so a refused run writes nothing and leaves an earlier run's results whole.
Each refusal is one line naming the key or file, exit 2.

Stop: SIGTERM and SIGHUP behave like SIGINT, and no worker process outlives its parent.

SIGINT already unwound a run cleanly (KeyboardInterrupt). SIGTERM (a scheduler, `kill`, a closed
container) and SIGHUP (a closed terminal) killed only the parent: spawn and loky workers went on
simulating and writing. A run writes into a staging folder and replaces the folder's earlier
results only once complete (outdir.claim/commit), so an interrupted run leaves them as they were;
Preflight keeps the earlier `.hydra/` aside (outdir.backup_hydra) and a failed run puts it back.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from cachepilot_sim.admission import make_controller
from cachepilot_sim.admission.features import feature_names
from cachepilot_sim.admission.mlp import WeightsError
from cachepilot_sim.components.admission_gate import gate_class_names
from cachepilot_sim.config import ConfigError, RunConfig, TraceFormat, to_config
from cachepilot_sim.entry import (  # noqa: F401 - shared with the tools
    STOP_SIGNALS,
    SWEEP_PARENT_ENV,
    exit_status,
    exit_with_parent,
    install_signal_handlers,
    start_loky_tracker,
)
from cachepilot_sim.experiment.outdir import OutputDirError, backup_hydra
from cachepilot_sim.workloads.replay import resolve_path
from cachepilot_sim.workloads.traces import TraceError, require_trace_file

try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra-core always ships it (>= 1.1)
    Callback = object  # type: ignore[misc,assignment]


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate every worker of `pool` now (an interrupted run must not wait for cells)."""
    # The executor offers no public way to stop running tasks: terminate its processes.
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def refuse_ignored_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """`policy=X` next to an experiment's own `compare_policies` would not run X alone: refuse,
    naming both keys and the way to say what was meant. Passed together with `compare_policies`
    that names X, it is a comparison with X configured as `policy.*` says, and runs. A batcher
    choice that the engine profile overrides (engine=hf_cb pins its own) is refused too."""
    chosen = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "policy"]
    for o in overrides:  # an engine profile pins its batching rule over a later batcher choice
        key, _, value = o.lstrip("+~").partition("=")
        if key in ("batcher", "batcher.mode") and value.lower() != str(cfg.batcher.mode).lower():
            raise ConfigError(
                f"{o} is ignored: engine={cfg.engine.name} schedules with batcher "
                f"{str(cfg.batcher.mode).lower()} (its captured rule); drop it, or use "
                "engine=default to choose the batching mode"
            )
    if not chosen or not cfg.get("compare_policies"):
        return
    names = [str(n) for n in cfg.compare_policies]
    name = chosen[0].split("=", 1)[1]
    given = any(o.split("=", 1)[0].lstrip("+") == "compare_policies" for o in overrides)
    if given and name in names:
        return
    tune = f"policies.{name}.<key>=... to set it inside the comparison, " if name in names else ""
    raise ConfigError(
        f"{chosen[0]} does not run {name} alone: compare_policies={names} is set; use "
        f"{tune}compare_policies=[{name}] to run it alone, or pass compare_policies with it"
    )


def check_inputs(cfg: RunConfig) -> None:
    """Open what the run will read besides its config: the trace file and the learned admission
    weights (loaded as the simulation loads them, so a file trained on other features is refused
    too). Raises TraceError or WeightsError naming the file, before anything is written."""
    if cfg.replay.format != TraceFormat.NONE:
        require_trace_file(resolve_path(cfg.replay.path))
    sim = cfg.sim_for(cfg.policy_names()[0], cfg.seed)
    make_controller(sim.admission, feature_names(gate_class_names(sim)))


def checked_config(task_cfg: DictConfig, overrides: list[str], choices: Any) -> RunConfig:
    """The typed, validated config with its inputs checked; on a refusal, one line on stderr
    naming the key or file, and exit 2. `choices` are Hydra's group choices (model file name)."""
    try:
        refuse_ignored_overrides(task_cfg, overrides)
        run_cfg = to_config(task_cfg)
    except ConfigError as err:
        message = str(err)
        for group in ("model", "gpu", "hardware", "engine"):  # the file a required key is from
            chosen = str(choices.get(group, "<name>"))
            message = message.replace(f"{group}/<name>.yaml", f"{group}/{chosen}.yaml")
        refuse(f"invalid configuration: {message}")
    try:
        check_inputs(run_cfg)
    except TraceError as err:
        refuse(f"cannot replay the trace: {err}")
    except WeightsError as err:
        refuse(f"invalid configuration: admission.weights: {err}")
    return run_cfg


def check_folder(key: str, path: Path) -> None:
    """Make `path` (as Hydra is about to) and write a scratch file in it; OutputDirError naming
    `key` and the path when either fails. Folders made here are removed again on failure."""
    made = [p for p in (path, *path.parents) if not p.exists() and not p.is_symlink()]
    try:
        if path.exists() and not path.is_dir():
            raise OutputDirError(f"{key}={path}: exists and is not a folder")
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        for folder in made:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        in_the_way = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        reason = f"{in_the_way} is a file, not a folder" if in_the_way else err.strerror
        raise OutputDirError(f"{key}={path}: cannot create or write the folder ({reason})") from err


def refuse(message: str) -> None:
    """One line on stderr, exit 2 (the bad-input status)."""
    print(f"cachepilot_sim: {message}", file=sys.stderr)
    sys.exit(2)


def refuse_repeated_sweep_values(overrides: list[str]) -> None:
    """A sweep override listing a value twice (`policy=lru,lru`, `seed=1,1`) would run one job
    twice into one folder, and the sweep report would pool it as two samples: refused, naming
    the override and the value, before anything is launched."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return  # Hydra reports an unparsable override itself (__main__.hydra_error_line)
    for override in parsed:
        if not override.is_sweep_override():
            continue
        values = list(override.sweep_string_iterator())
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            refuse(
                f"{override.input_line}: lists {', '.join(twice)} twice: the same job would run "
                "twice and be pooled as two samples"
            )


class Preflight(Callback):  # type: ignore[misc]
    """Hydra callback (conf/config.yaml): refuses a run before Hydra makes its folder or writes
    `.hydra/` there: a bad config or input (checked_config) or an unusable `hydra.run.dir`; a
    sweep whose `hydra.sweep.dir` cannot be made. Each job of a sweep is checked by its run."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.instance().set_config(config)  # `${hydra:...}` resolves, as in Hydra's run_job
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        overrides = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task) or []]
        checked_config(task_cfg, overrides, config.hydra.runtime.choices)
        self._folder("hydra.run.dir", config)
        try:  # the earlier `.hydra/` stays whole until this run has completed
            backup_hydra(Path(str(config.hydra.run.dir)))
        except OSError as err:
            refuse(f"hydra.run.dir={config.hydra.run.dir}: cannot keep the earlier .hydra/ ({err})")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        overrides = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task) or []]
        refuse_repeated_sweep_values(overrides)
        self._folder("hydra.sweep.dir", config)
        # The launcher's workers leave a Ctrl-C or a closed terminal to this process, which
        # stops them (sweep.run_job, entry.worker_setup); loky's tracker must survive a SIGHUP.
        os.environ[SWEEP_PARENT_ENV] = str(os.getpid())
        if "joblib" in str(OmegaConf.select(config, "hydra.launcher._target_", default="")):
            start_loky_tracker()

    @staticmethod
    def _folder(key: str, config: DictConfig) -> None:
        try:
            check_folder(key, Path(str(OmegaConf.select(config, key))))
        except OutputDirError as err:
            refuse(str(err))
