"""Regenerate the trace samples shipped in cachepilot_sim/workloads/samples from the full traces.

Azure and ShareGPT: the first 300 data rows (header kept), byte for byte. Mooncake: every row, byte
for byte and in file order, of the first 65 sessions (by first request) that have at least two
inferred turns, so that the small sample still exercises prefix reuse and session inference (the
first 300 rows hold only 4 continuations: turns are ~440 s apart).

    python experiments/make_trace_samples.py [--src ../shared/traces]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cachepilot_sim.config import OnError, TraceFormat
from cachepilot_sim.workloads.replay import SAMPLES_DIR
from cachepilot_sim.workloads.sessions import infer_sessions
from cachepilot_sim.workloads.traces import read_trace

HEAD_ROWS = 300
MOONCAKE_SESSIONS = 65
CSV_FILES = (
    "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    "sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
)
MOONCAKE_FILE = "mooncake_synthetic/synthetic_trace.jsonl"


def mooncake_lines(src: Path) -> list[bytes]:
    table = read_trace(TraceFormat.MOONCAKE, src, OnError.RAISE)
    sessions = infer_sessions(table, 512)
    sizes = np.bincount(sessions.session)
    _, first_row = np.unique(sessions.session, return_index=True)
    multi = [k for k in np.argsort(first_row, kind="stable") if sizes[k] >= 2][:MOONCAKE_SESSIONS]
    keep = np.isin(sessions.session, multi)
    lines = src.read_bytes().splitlines(keepends=True)
    return [lines[int(n) - 1] for n in table.line[keep]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", type=Path, default=Path("../shared/traces"))
    args = parser.parse_args()
    for rel in CSV_FILES:
        lines = (args.src / rel).read_bytes().splitlines(keepends=True)[: HEAD_ROWS + 1]
        (SAMPLES_DIR / rel).write_bytes(b"".join(lines))
    (SAMPLES_DIR / MOONCAKE_FILE).write_bytes(b"".join(mooncake_lines(args.src / MOONCAKE_FILE)))
    print(f"wrote samples under {SAMPLES_DIR}")


if __name__ == "__main__":
    main()
