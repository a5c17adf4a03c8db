"""The engine's own run-to-run spread: the same request list run twice on fresh engines.

For every workload folder with run1 and run2 under ROOT, prints a Markdown table of mean and p99
TTFT, TPOT and E2E latency and output-token throughput: run 1, run 2 and the relative difference
(run2 - run1) / run1. An error of the simulator below this spread is within the engine's noise.

    PYTHONPATH=. python experiments/validation/spread.py experiments/validation/hf_cb/2026-12-01

`--base OTHER_ROOT --run runK` compares OTHER_ROOT's run 1 of each workload with ROOT's run K
instead (a later capture of the same request list against the validation run):

    PYTHONPATH=. python experiments/validation/spread.py \
        experiments/validation/hf_cb/2026-12-02-preemptdiag \
        --base experiments/validation/hf_cb/2026-12-01 --run run1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cachepilot_sim.validation.ground_truth import GroundTruthError, load_ground_truth
from cachepilot_sim.validation.gt_stats import summarize

METRICS = (
    ("ttft_ms_mean", "TTFT mean (ms)"),
    ("ttft_ms_p99", "TTFT p99 (ms)"),
    ("tpot_ms_mean", "TPOT mean (ms)"),
    ("tpot_ms_p99", "TPOT p99 (ms)"),
    ("e2e_ms_mean", "E2E mean (ms)"),
    ("e2e_ms_p99", "E2E p99 (ms)"),
    ("throughput_tok_s", "throughput (tok/s)"),
)


def spread(root: Path, base: Path | None = None, run: str = "run2") -> dict[str, dict]:
    """workload -> {metric: {"run1", "run2", "rel_diff"}} for workloads with both runs ("run1":
    `base`'s run 1 when given, else ROOT's; "run2": ROOT's `run`)."""
    out: dict[str, dict] = {}
    first = base or root
    for wl in sorted(p for p in root.iterdir() if (first / p.name / "run1").is_dir()):
        if not (wl / run).is_dir():
            continue
        s1, s2 = (summarize(load_ground_truth(p)) for p in (first / wl.name / "run1", wl / run))
        row: dict = {"requests": s1["requests"]}
        for key, _ in METRICS:
            a, b = s1[key], s2[key]
            row[key] = {"run1": a, "run2": b, "rel_diff": (b - a) / a if a else None}
        out[wl.name] = row
    return out


def markdown(table: dict[str, dict]) -> str:
    head = "| workload | requests | " + " | ".join(label for _, label in METRICS) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(METRICS)]
    for name, row in table.items():
        cells = []
        for key, _ in METRICS:
            m = row[key]
            digits = 0 if m["run1"] >= 100 else 1
            cells.append(f"{m['run1']:.{digits}f} / {m['run2']:.{digits}f} ({m['rel_diff']:+.1%})")
        lines.append(f"| `{name}` | {row['requests']} | " + " | ".join(cells) + " |")
    worst = {key: max(abs(r[key]["rel_diff"]) for r in table.values()) for key, _ in METRICS}
    lines.append(
        "| **largest abs. difference** | | "
        + " | ".join(f"**{worst[k]:.1%}**" for k, _ in METRICS)
        + " |"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--json", type=Path, help="also write the numbers as JSON")
    ap.add_argument("--base", type=Path, help="take run 1 from this root instead")
    ap.add_argument("--run", default="run2", help="ROOT's run to compare (default run2)")
    args = ap.parse_args()
    try:
        table = spread(args.root, args.base, args.run)
    except GroundTruthError as err:
        sys.exit(f"error: {err}")
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
