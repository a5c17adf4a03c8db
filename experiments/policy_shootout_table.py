"""Compact policy-shootout table from a run's metrics.json (mean ± σ over seeds).

    python -m cachepilot_sim +experiment=policy_shootout hydra.run.dir=experiments/policy_shootout
    python experiments/policy_shootout_table.py experiments/policy_shootout/metrics.json

Columns no policy has (the LP bound on trace replay) are left out; with one seed, no ± σ.
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
    ("prefix_hit_ratio", "prefix-hit ratio", "{:.3f}"),
)


def main(path: Path) -> None:
    summary = json.loads(path.read_text())["summary"]
    columns = [c for c in COLUMNS if any(c[0] in stats for stats in summary.values())]
    print("| policy | " + " | ".join(name for _, name, _ in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for policy, stats in summary.items():
        cells = []
        for key, _, spec in columns:
            s = stats.get(key)
            f = spec.format
            if s is None or s["mean"] is None:  # metrics.json writes null for no value
                cells.append("-")
            else:
                cells.append(f(s["mean"]) if s["n"] == 1 else f"{f(s['mean'])} ± {f(s['std'])}")
        print(f"| {policy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
