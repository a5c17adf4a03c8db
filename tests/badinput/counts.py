"""Bad-input cases per entry point, counted from the collected tests (docs/reliability.md prints
this table; tests/badinput/test_reliability_counts.py fails when the page and the tests differ).

    python -m tests.badinput.counts          # the table, as markdown
    python -m tests.badinput.counts --write  # ... written into docs/reliability.md
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- counts:begin (python -m tests.badinput.counts) -->", "<!-- counts:end -->"

# Every file of tests/badinput that holds tests, by the entry point its inputs go through.
SURFACES: dict[str, tuple[str, ...]] = {
    "run command (config, trace file, run folder, reruns, signals)": (
        "test_config_values.py", "test_entry_point.py", "test_atomic_rerun.py",
        "test_output_folders.py", "test_required_keys.py", "test_context_window.py",
        "test_signals.py", "test_engine_batching_rule.py",
    ),
    "trace readers (Mooncake, Azure, ShareGPT)": (
        "test_trace_rows.py", "test_trace_keys.py", "test_time_scale.py",
    ),
    "sweeps (`--multirun`)": ("test_sweep_paths.py", "test_sweep_repeats.py",
                              "test_signals_sweep.py"),
    "`validate` and its ground truth": ("test_ground_truth_inputs.py", "test_engine_settings.py",
                                        "test_ground_truth_hashes.py",
                                        "test_vllm_engine_settings.py"),
    "vLLM/SGLang converters": ("test_converter_inputs.py",),
    "`plan`": ("test_plan_inputs.py", "test_signals_plan.py"),
    "`fit-engine`": ("test_fit_engine_inputs.py",),
    "profiles (GPU, model, hardware, engine) and `scorecard`": ("test_profile_inputs.py",
                                                                 "test_gpu_profile.py",
                                                                 "test_engine_profiles.py"),
    "inputs that hung an entry point (FIFO or device files, a plan space, seeds, replicas)": (
        "test_hangs.py",
    ),
    "other tools (collect, plot, telemetry, train-admission, profile-dataset, calibrate)": (
        "test_tool_args.py", "test_profile_dataset_args.py", "test_calibrate_args.py",
    ),
}  # fmt: skip


def per_file(folder: str = "tests/badinput") -> Counter[str]:
    """The tests pytest collects per file of `folder` (one per distinct input)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", folder],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    counts: Counter[str] = Counter()
    for line in out.splitlines():
        if "::" in line:  # one node id a line
            counts[Path(line.split("::")[0]).name] += 1
        elif line.startswith(folder) and line.rsplit(": ", 1)[-1].isdigit():  # `file: N` (-qq)
            path, num = line.rsplit(": ", 1)
            counts[Path(path).name] += int(num)
    counts.pop(Path(__file__).with_name("test_reliability_counts.py").name, None)  # the check
    return counts


def table(counts: Counter[str]) -> str:
    rows = ["| entry point | test files | bad-input cases |", "|---|---|---:|"]
    for surface, files in SURFACES.items():
        names = ", ".join(f"`{f}`" for f in files)
        rows.append(f"| {surface} | {names} | {sum(counts[f] for f in files)} |")
    rows.append(f"| **total** | | **{sum(counts.values())}** |")
    return "\n".join(rows)


def unmapped(counts: Counter[str]) -> list[str]:
    mapped = {f for files in SURFACES.values() for f in files}
    return sorted(set(counts) - mapped)


def doc_block(text: str) -> str:
    """The table between the markers of docs/reliability.md."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


if __name__ == "__main__":
    text = table(per_file())
    if "--write" in sys.argv[1:]:
        page = ROOT / "docs" / "reliability.md"
        old = page.read_text()
        page.write_text(old.replace(doc_block(old), text, 1))
    print(text)
