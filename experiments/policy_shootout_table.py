"""Compact policy-shootout table from a run's metrics.json (mean ± σ over seeds).

    python -m cachepilot_sim +experiment=policy_shootout hydra.run.dir=experiments/policy_shootout
    python experiments/policy_shootout_table.py experiments/policy_shootout/metrics.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = (
    ("realized_restore_s", "realized restore s", "{:.2f}"),
    ("restore_vs_lru", "vs LRU", "{:.3f}"),
    ("offline_lp_restore_s", "LP bound s", "{:.2f}"),
    ("restore_vs_offline_lp", "realized / LP", "{:.2f}"),
    ("oracle_gap_mean", "oracle gap mean", "{:.2f}"),
    ("oracle_gap_worst", "oracle gap worst", "{:.1f}"),
    ("oracle_gap_frac_suboptimal", "decisions above oracle", "{:.0%}"),
    ("evictions", "evictions", "{:.0f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("goodput_req_s", "goodput req/s", "{:.3f}"),
)


def main(path: Path) -> None:
    summary = json.loads(path.read_text())["summary"]
    print("| policy | " + " | ".join(name for _, name, _ in COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for policy, stats in summary.items():
        cells = []
        for key, _, spec in COLUMNS:
            s = stats.get(key)
            f = spec.format
            cells.append("-" if s is None else f"{f(s['mean'])} ± {f(s['std'])}")
        print(f"| {policy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
