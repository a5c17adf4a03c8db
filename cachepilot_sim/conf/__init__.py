"""The Hydra config tree, shipped inside the package (`pkg://cachepilot_sim.conf`).

Groups a user picks (`policy=`, `workload=`, `gpu=`, `+experiment=`, ...) are the folders here;
`plan/` holds capacity-planner questions and GPU prices that `cachepilot-sim plan` reads (no
simulation field takes them), so `--help` leaves it out of the groups a run can pick.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent
# Folders that are not run config groups, with why: left out of `--help`.
NOT_RUN_GROUPS = {"plan": "capacity-planner questions and prices, not a simulation setting"}


def run_groups() -> dict[str, list[str]]:
    """Config group -> its options, for every group a run can pick (sorted; no schemas)."""
    return {
        group.name: sorted(p.stem for p in group.glob("*.yaml"))
        for group in sorted(CONF_DIR.iterdir())
        if group.is_dir()
        and group.name not in NOT_RUN_GROUPS
        and any(group.glob("*.yaml"))
        and group.name != "hydra"
    }


def groups_help() -> str:
    """The `--help` listing: one line per group, `+experiment` written as it must be typed."""
    lines = []
    for group, options in run_groups().items():
        name = f"+{group}" if group == "experiment" else group
        text = f"{name}: " + ", ".join(options)
        lines += textwrap.wrap(text, width=98, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def app_help() -> str:
    """`cachepilot-sim --help` as Hydra prints it (conf/hydra/help/cachepilot.yaml's template with
    its header, footer and group listing put in), without starting Hydra or importing the
    simulator: the help answers at once (tools/cli.py)."""
    import yaml

    spec = yaml.safe_load((CONF_DIR / "hydra" / "help" / "cachepilot.yaml").read_text())
    text = str(spec["template"])
    for key, value in (
        ("${hydra.help.header}", spec["header"]),
        ("${hydra.help.footer}", spec["footer"]),
        ("${cachepilot_groups:}", groups_help()),
    ):
        text = text.replace(key, str(value))
    return text.replace("$$", "$")
