"""Hypothesis fuzz of every reader and tool entry point that issue 30 hardened: ground truth,
the vLLM converter, plan YAML and overrides, GPU and model profiles. Each input gives a result or
a named one-line refusal (an InputError, or exit 2 with one stderr line that is not the fallback
for an unnamed error); never another exception, never exit 0 with an empty answer.

CACHEPILOT_FUZZ_EXAMPLES sets the examples per test (default 25; `make test-fuzz` runs 2000)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import polars as pl
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import GpuSpecConfig, ModelConfig
from cachepilot_sim.config.store import REQUIRED_GPU_KEYS, REQUIRED_MODEL_KEYS
from cachepilot_sim.entry import TRACEBACK_HINT
from cachepilot_sim.inputs import InputError
from cachepilot_sim.plan import cells_of, load_plan
from cachepilot_sim.plan.config import load_prices
from cachepilot_sim.tools import scorecard
from cachepilot_sim.tools.validate import sim_config
from cachepilot_sim.validation import convert
from cachepilot_sim.validation.engine_settings import resolve
from cachepilot_sim.validation.ground_truth import load_ground_truth

EXAMPLES = int(os.environ.get("CACHEPILOT_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=5,
)
CAPTURE = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-01/closed_b16"


def _json(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


def _tool(main: Any, argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    return status, err.getvalue()


def _refused_in_one_line(status: int, err: str) -> bool:
    """Exit 2 with one named line, or 0 (the caller checks the answer)."""
    if status == 0:
        return False
    assert status == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and TRACEBACK_HINT not in err, err
    return True


# ground truth -------------------------------------------------------------------------------

ENGINE_KEYS = ["num_blocks", "block_size", "max_batch_tokens", "max_requests_per_batch",
               "safety_margin", "use_async_batching", "q_padding_interval_size",
               "kv_padding_interval_size", "num_cpu_blocks", "gpu", "model", "kv_bytes_per_token",
               "use_cuda_graph", "scheduler_type", "compile"]  # fmt: skip


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(ENGINE_KEYS), VALUES, min_size=1, max_size=3))
def test_engine_json_settings_are_replayed_or_refused_by_key(changes: dict[str, Any]) -> None:
    engine = json.loads((CAPTURE / "run1" / "engine.json").read_text()) | changes
    try:
        out = resolve(CAPTURE / "run1", engine, _HF_CB)
    except InputError as err:
        assert "engine.json" in str(err) and "\n" not in str(err)
        return
    for key in changes:  # every key given is accounted for
        assert key in {s.key for s in out.settings} or key in {"gpu", "model"}, key


_HF_CB = sim_config("hf_cb", [])
REQUEST_COLUMNS = ["send_us", "prompt_tokens", "output_tokens", "first_token_us", "end_us",
                   "think_time_us", "num_cpu_swaps"]  # fmt: skip
CELLS = st.none() | st.integers(min_value=-(2**62), max_value=2**62)


@FUZZ
@given(
    column=st.sampled_from(REQUEST_COLUMNS),
    row=st.integers(min_value=0, max_value=2),
    value=CELLS,
    tokens=st.none() | st.lists(st.none() | st.integers(-5, 2_000_000), max_size=4),
    parent=st.none() | st.sampled_from(["a", "b", "c", "zz"]),
)
def test_ground_truth_rows_load_or_are_refused_by_column(
    column: str, row: int, value: int | None, tokens: list[int | None] | None, parent: str | None
) -> None:
    cols: dict[str, list[Any]] = {
        "request_id": ["a", "b", "c"], "parent_id": [None, "a", None],
        "send_us": [0, 1_305_000, 500_000], "prompt_tokens": [100, 300, 50],
        "output_tokens": [3, 2, 1], "first_token_us": [100_000, 1_400_000, 700_000],
        "end_us": [1_300_000, 1_600_000, 700_000],
        "token_us": [[100_000, 700_000, 1_300_000], [1_400_000, 1_600_000], [700_000]],
        "status": ["finished"] * 3, "think_time_us": [None, 5_000, None], "num_cpu_swaps": [0] * 3,
    }  # fmt: skip
    cols[column][row] = value
    cols["token_us"][row] = tokens
    cols["parent_id"][2] = parent
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "wl" / "run1"
        folder.mkdir(parents=True)
        pl.DataFrame(cols, schema_overrides={"token_us": pl.List(pl.Int64)}).write_parquet(
            folder / "requests.parquet"
        )
        (folder / "engine.json").write_text('{"engine": "hand-made"}')
        try:
            gt = load_ground_truth(folder)
        except InputError as err:
            assert "requests.parquet" in str(err) and "\n" not in str(err)
            return
    fin = gt.finished
    assert fin.height > 0
    assert (fin["first_token_us"] >= fin["send_us"]).all() and (fin["end_us"] >= 0).all()
    assert (gt.requests["prompt_tokens"] >= 1).all()
    if "think_time_us" in gt.requests.columns:
        assert (gt.requests["think_time_us"].drop_nulls() >= 0).all()


# converter ----------------------------------------------------------------------------------

VLLM_KEYS = ["input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors",
             "request_rate"]  # fmt: skip
ENTRY = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))


@FUZZ
@given(
    key=st.sampled_from(VLLM_KEYS),
    entry=st.integers(min_value=0, max_value=1),
    value=ENTRY,
    whole=st.booleans(),
)
def test_vllm_conversion_gives_ground_truth_or_a_named_line(
    key: str, entry: int, value: Any, whole: bool
) -> None:
    result: dict[str, Any] = {
        "request_rate": 2.0, "input_lens": [100, 200], "output_lens": [3, 1],
        "ttfts": [0.1, 0.25], "itls": [[0.02, 0.03], []], "latencies": [0.15, 0.25],
        "start_times": [1000.5, 1001.0], "errors": ["", ""],
    }  # fmt: skip
    if whole or key == "request_rate":
        result[key] = value
    else:
        result[key][entry] = value
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "r.json", Path(tmp) / "gt"
        src.write_text(_json(result))
        status, err = _tool(convert.main, ["vllm", str(src), str(out)])
        if _refused_in_one_line(status, err):
            assert "r.json" in err or "gt" in err
            assert not out.exists() or not any(out.iterdir())
            return
        gt = load_ground_truth(out)
        assert gt.requests.height == 2 and gt.finished.height > 0


@FUZZ
@given(data=st.binary(max_size=200))
def test_vllm_conversion_of_random_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "r.json", Path(tmp) / "gt"
        src.write_bytes(data)
        status, err = _tool(convert.main, ["vllm", str(src), str(out)])
        assert _refused_in_one_line(status, err) and "r.json" in err


# plan YAML ----------------------------------------------------------------------------------

PLAN = {
    "name": "fuzz", "simulation": ["+experiment=azure_conv"],
    "sla": {"ttft_p99_s": 2.0, "tpot_p99_ms": 50.0, "goodput_fraction": 0.95},
    "space": {"gpus": ["h200"], "tp": [1], "pd_splits": ["colocated"], "max_replicas": 4},
    "jobs": 1,
}  # fmt: skip
PLAN_KEYS = ["name", "sla.ttft_p99_s", "sla.goodput_fraction", "space.gpus", "space.tp",
             "space.offload_gb", "space.pd_splits", "space.max_replicas", "jobs", "seed",
             "launcher", "prices"]  # fmt: skip
YAML_TEXT = st.text(alphabet=st.sampled_from(list("abc01:-[]{},.# \n\t'\"!&*?|>%@`")), max_size=40)


def _plan_answer(path: Path, overrides: list[str]) -> None:
    try:
        plan = load_plan(path, overrides)
        load_prices(plan)
        cells = cells_of(plan)
    except InputError as err:
        assert "\n" not in str(err)
        return
    assert cells and len(set(cells)) == len(cells)  # no configuration simulated twice


@FUZZ
@given(key=st.sampled_from(PLAN_KEYS), value=VALUES)
def test_plan_file_values_are_read_or_refused(key: str, value: Any) -> None:
    plan: dict[str, Any] = json.loads(json.dumps(PLAN))
    section, _, leaf = key.rpartition(".")
    (plan[section] if section else plan)[leaf] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.yaml"
        path.write_text(yaml.safe_dump(plan, allow_unicode=True))
        _plan_answer(path, [])


@FUZZ
@given(
    text=YAML_TEXT | st.binary(max_size=40).map(lambda b: b.decode("latin-1")), raw=st.booleans()
)
def test_plan_yaml_text_and_overrides_are_read_or_refused(text: str, raw: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.yaml"
        if raw:
            path.write_bytes(text.encode("latin-1", errors="replace"))
            _plan_answer(path, [])
        else:
            path.write_text(yaml.safe_dump(PLAN))
            _plan_answer(path, [f"space.pd_splits={text}"])


# profiles -----------------------------------------------------------------------------------


def _profile(group: str, name: str, changes: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text())
    for key, value in changes.items():
        if value == "<omit>":
            data.pop(key, None)
        else:
            data[key] = value
    return data


NUMBERS = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, 1, 3, "<omit>", None, "x", True])
)


@FUZZ
@given(
    gpu=st.dictionaries(st.sampled_from(REQUIRED_GPU_KEYS + ("pcie_lanes",)), NUMBERS, max_size=3),
    model=st.dictionaries(st.sampled_from(REQUIRED_MODEL_KEYS), NUMBERS, max_size=3),
)
def test_profiles_load_and_score_or_are_refused_by_key(
    gpu: dict[str, Any], model: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        gpu_path, model_path = Path(tmp) / "g.yaml", Path(tmp) / "m.yaml"
        gpu_path.write_text(_json(_profile("gpu", "l40s", gpu)))
        model_path.write_text(_json(_profile("model", "qwen2_1_5b", model)))
        try:
            g = scorecard._load(GpuSpecConfig, gpu_path)
            m = scorecard._load(ModelConfig, model_path)
        except InputError as err:
            assert "g.yaml" in str(err) or "m.yaml" in str(err) or "config key" in str(err)
            return
    ts = scorecard.score(g, m, 2048, 0, 0)  # no OverflowError, no ZeroDivisionError
    assert ts.pool_bytes >= 0 and all(v >= 0 for v in ts.tokens.values())
    if ts.bound is not None:
        assert math.isfinite(ts.bound.step_us) and ts.bound.step_us > 0
