"""Hydra entry point: `python -m cachepilot_sim +experiment=...` (the console command
`cachepilot-sim` runs the same, tools/cli.py). The only DictConfig user.

Configs are packaged in cachepilot_sim/conf (config_path below is relative to this file, so an
installed package finds them too).

`--multirun` sweeps run each job through `sweep.run_job` (crash isolation, resume); see
docs/observability.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cachepilot_sim.conf import app_help, groups_help
from cachepilot_sim.config import register_configs
from cachepilot_sim.experiment import outdir
from cachepilot_sim.experiment.lifecycle import (
    checked_config,
    exit_status,
    install_signal_handlers,
)
from cachepilot_sim.experiment.outdir import OutputDirError
from cachepilot_sim.experiment.sweep import safe_dirname
from cachepilot_sim.workloads.traces import TraceError

register_configs()
# `--help` lists the groups a run can pick through this resolver (conf/hydra/help/cachepilot.yaml).
OmegaConf.register_new_resolver("cachepilot_groups", groups_help, replace=True)
# Job folders are named by their overrides; this keeps each one inside the sweep folder.
OmegaConf.register_new_resolver("cp_safe_dirname", safe_dirname, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def app(cfg: DictConfig) -> None:
    """One run (or one job of a `--multirun` sweep); the Preflight callback
    (experiment/lifecycle.py) has refused a bad config, input or run folder before this runs."""
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        from cachepilot_sim.experiment.sweep import run_job

        overrides = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task) or []]
        run_job(cfg, out_dir, overrides, int(hydra_cfg.job.num), Path(hydra_cfg.sweep.dir))
        return
    overrides = [str(o) for o in hydra_cfg.overrides.task]
    run_cfg = checked_config(cfg, overrides, hydra_cfg.runtime.choices)  # again: no callback ran
    # Imported here, not above: `--help` and a config error answer without the simulator's
    # imports (scipy, polars, the components), about a second sooner.
    from cachepilot_sim.experiment.runner import run_experiment

    install_signal_handlers()  # SIGTERM/SIGHUP stop the run as SIGINT does
    try:
        try:
            run_experiment(run_cfg, out_dir)
        except BaseException:  # the folder keeps the earlier run's results: its .hydra/ too
            outdir.restore_hydra(out_dir)
            raise
        outdir.drop_hydra_backup(out_dir)
    except TraceError as err:  # a bad trace row: file, line and reason, no traceback
        print(f"cachepilot_sim: cannot replay the trace: {err}", file=sys.stderr)
        sys.exit(2)
    except OutputDirError as err:  # an unusable hydra.run.dir: named, no traceback
        print(f"cachepilot_sim: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as err:  # SIGINT, SIGTERM, SIGHUP: workers stopped, files whole
        print(
            f"cachepilot_sim: {str(err) or 'stopped by SIGINT'}; {out_dir} keeps the earlier run's "
            "results, if any",
            file=sys.stderr,
        )
        sys.exit(exit_status(err))
    except Exception as err:  # a value that passed validation but broke the run
        if os.environ.get("CACHEPILOT_TRACEBACK"):
            raise
        first = (str(err).strip().splitlines() or [""])[0]
        print(
            f"cachepilot_sim: the run failed: {type(err).__name__}: {first} "
            "(CACHEPILOT_TRACEBACK=1 shows the traceback)",
            file=sys.stderr,
        )
        sys.exit(2)
    print(f"results: {out_dir}")


# Lines of Hydra's own error messages that say nothing about the input.
HYDRA_NOISE = ("full_key:", "object_type=", "reference_type=", "provider=", "To append to your")


def hydra_error_line(err: BaseException) -> str:
    """Hydra's multi-line message for a bad override or group option as one line: its lines
    joined by `; `, an indented list (a group's options) joined by `, `, and the key that OmegaConf
    names (`full_key`) put first."""
    segments: list[str] = []
    for part in (err, err.__cause__):
        if part is None:
            continue
        lines: list[str] = []
        for raw in str(part).splitlines():
            line = raw.strip().rstrip(".").removeprefix("In 'config':").strip()
            if line == "Config search path:":
                break
            if not line or line.startswith(HYDRA_NOISE):
                continue
            if raw.startswith("\t") and lines:
                lines[-1] += (" " if lines[-1].endswith(":") else ", ") + line
            else:
                lines.append(line)
        key = getattr(part, "full_key", None)
        if key and lines:
            lines[0] = f"{key}: {lines[0]}"
        segments += lines
    override = getattr(err, "override", None)  # a parse error names the override it could not read
    if override:
        segments.insert(0, f"cannot parse {override!r}")
    return "; ".join(segments) or type(err).__name__


def main() -> None:
    """Entry point: Hydra's app, with the errors Hydra reports itself before the app runs (an
    override of a key the config has not, an unknown group option, a value of the wrong type) as
    one line naming the key, exit 2, instead of Hydra's multi-line message and exit 1.
    `HYDRA_FULL_ERROR=1` or `CACHEPILOT_TRACEBACK=1` keep Hydra's own report.

    SIGTERM and SIGHUP stop a sweep as SIGINT does: the launcher's workers are stopped (joblib
    terminates them on the interrupt; each also exits when its parent is gone) and the command
    exits 128 + signal with one line."""
    if sys.argv[1:] in (["--help"], ["-h"]):  # the app help alone: no Hydra start-up needed
        print(app_help())
        return
    install_signal_handlers()
    try:
        _run_app()
    except KeyboardInterrupt as err:  # a sweep (a single run reports its own, naming its folder)
        print(
            f"cachepilot_sim: {str(err) or 'stopped by SIGINT'}; rerun the same command with "
            "the same hydra.sweep.dir: complete jobs are skipped, the others run again",
            file=sys.stderr,
        )
        sys.exit(exit_status(err))


def _run_app() -> None:
    if os.environ.get("HYDRA_FULL_ERROR") or os.environ.get("CACHEPILOT_TRACEBACK"):
        app()
        return
    # Hydra's documented switch to let its errors propagate instead of printing them itself.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except (HydraException, OmegaConfBaseException) as err:
        print(f"cachepilot_sim: invalid configuration: {hydra_error_line(err)}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # Hydra failed outside the run (the run reports its own errors)
        first = (str(err).strip().splitlines() or [""])[0]
        print(
            f"cachepilot_sim: {type(err).__name__}: {first} "
            "(CACHEPILOT_TRACEBACK=1 shows the traceback)",
            file=sys.stderr,
        )
        sys.exit(2)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


if __name__ == "__main__":
    main()
