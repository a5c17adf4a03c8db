"""Cells that need not run: when the baseline's cells show that no eviction policy can change the
results (experiment/ranking.py cannot_differ), every other policy's cells are the baseline's,
marked COPY_OF, with the baseline's per-request tables and traces under their names.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cachepilot_sim.trace.recorder import META_FILE

# Set to 1 on a cell not simulated but copied from the baseline's (identical by construction;
# metrics.json's ranking names the baseline). A number: every cell value is a number or null.
COPY_OF = "copy_of_baseline"


def copy_cell_files(stage: Path, baseline: str, policy: str, seed: int) -> None:
    """The baseline cell's per-request table and trace under `policy`'s name (hard links where
    the file system allows, else copies), its trace meta naming `policy` and `copy_of`: the plots
    and trace tools find every policy of the run."""
    src, dst = f"{baseline}_seed{seed}", f"{policy}_seed{seed}"

    def link(a: Path, b: Path) -> None:
        b.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    requests = stage / "requests" / f"{src}.parquet"
    if requests.is_file():
        link(requests, stage / "requests" / f"{dst}.parquet")
    trace = stage / "trace" / src
    if (trace / META_FILE).is_file():
        for part in trace.glob("part-*.parquet"):
            link(part, stage / "trace" / dst / part.name)
        meta = json.loads((trace / META_FILE).read_text())
        meta |= {"policy": policy, "copy_of": baseline}
        out = stage / "trace" / dst / META_FILE
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, out)
