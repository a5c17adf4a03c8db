"""A vLLM capture's engine.json (experiments/validation/vllm/capture_vllm.py) is honoured or
refused key by key (validation/engine_settings.py `_vllm`), and a capture folder in its format
replays through `validate` on engine=vllm_v1."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.config.engine_profile import FITTED_COST_KEYS
from cachepilot_sim.tools.validate import sim_config, validate_runs
from cachepilot_sim.validation.engine_settings import EngineSettingsError, resolve

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "experiments/validation/vllm"), str(ROOT / "experiments/validation")]

import vllm_gt  # noqa: E402
from capture_common import REQUEST_TYPES, write_table  # noqa: E402
from vllm_common import LLAMA3_8B  # noqa: E402

FOLDER = Path("gt/poisson_r6/run1")
# What capture_vllm.resolve_config reads back from a 0.26 engine on an H100 (defaults pinned).
RESOLVED: dict[str, Any] = {
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 1024,
    "block_size": 16,
    "num_gpu_blocks": 26001,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "async_scheduling": True,
    "scheduling_policy": "fcfs",
    "watermark": 0.0,
    "scheduler_reserve_full_isl": True,
    "long_prefill_token_threshold": 0,
    "max_model_len": 16384,
    "compilation_mode": 0,
    "cudagraph_mode": "FULL_DECODE_ONLY",
    "enforce_eager": False,
    "gpu_memory_utilization": 0.9,
    "kv_offloading_size": None,
    "kv_offloading_backend": "native",
    "prefix_caching_hash_algo": "sha256",
    "dtype": "bfloat16",
    "model_runner": "v2",
    "cudagraph_capture_sizes": [1, 2, 4, 8, 16],
    "max_cudagraph_capture_size": 512,
    "attention_backend": None,
}
RECORDS = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "sm": "90",
    "versions": {"vllm": "0.26.0", "torch": "2.11.0+cu130"},
    "engine_spec": {"name": "vllm_main"},
    "env": {"VLLM_NO_USAGE_STATS": "1"},
    "engine_init_s": 61.0,
    "frontend": "AsyncLLM, engine core process",
    "command": "capture_vllm.py --out /out",
    "prefix_cache_cleared_before_run": True,
    "workload": "poisson_r6",
    "run": 1,
    "workload_meta": {"kind": "poisson"},
    "captured_at": "2026-12-06T22:00:00Z",
    "wall_s": 30.0,
    "step_source": "engine_core_step_log",
    "num_preemptions": 0,
}


def engine(**changes: Any) -> dict[str, Any]:
    eng = vllm_gt.engine_json(RESOLVED, LLAMA3_8B, RECORDS)
    for key, value in changes.items():
        eng[key] = value
    return eng


@pytest.fixture(scope="module")
def vllm_v1() -> Any:
    return sim_config("vllm_v1", [])


def test_the_capture_limits_and_pool_become_overrides(vllm_v1: Any) -> None:
    out = resolve(FOLDER, engine(), vllm_v1)
    for override in (
        "batcher.throughput_token_budget=8192",
        "batcher.throughput_max_seqs=1024",
        "kv.block_tokens=16",
        "engine.kv_pool_blocks=26000",  # one block is vLLM's null block
        "engine.async_scheduling=true",
        "gpu=h100_sxm",
    ):
        assert override in out.overrides
    uses = {s.key: s.use for s in out.settings}
    assert uses["enable_prefix_caching"] == "requires true"
    assert "not modelled" in uses["cudagraph_mode"]  # the roofline step cost
    cfg = sim_config("vllm_v1", out.overrides)
    assert cfg.engine.kv_pool_blocks == 26000 and cfg.batcher.throughput_max_seqs == 1024


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"enable_prefix_caching": False}, "enable_prefix_caching"),
        ({"enable_chunked_prefill": False}, "enable_chunked_prefill"),
        ({"scheduling_policy": "priority"}, "scheduling_policy"),
        ({"watermark": 0.05}, "watermark"),
        ({"scheduler_reserve_full_isl": False}, "scheduler_reserve_full_isl"),
        ({"long_prefill_token_threshold": 512}, "long_prefill_token_threshold"),
        ({"dtype": "float16"}, "dtype"),
        ({"kv_offloading_size": 8.0}, "kv_offloading_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"num_gpu_blocks": 1}, "num_gpu_blocks"),
        ({"async_scheduling": "yes"}, "async_scheduling"),
        ({"kv_bytes_per_token": 65536}, "kv_bytes_per_token"),
        ({"speculative_config": {"method": "eagle"}}, "speculative_config"),  # unknown
    ],
)
def test_a_setting_the_vllm_profile_cannot_replay_is_refused_naming_the_key(
    vllm_v1: Any, changes: dict[str, Any], key: str
) -> None:
    with pytest.raises(EngineSettingsError) as err:
        resolve(FOLDER, engine(**changes), vllm_v1)
    line = str(err.value)
    assert "\n" not in line and str(FOLDER / "engine.json") in line and repr(key) in line


def test_a_vllm_capture_is_refused_on_another_engines_profile() -> None:
    with pytest.raises(EngineSettingsError, match=r"'engine' = vllm_v1: a vLLM capture"):
        resolve(FOLDER, engine(), sim_config("hf_cb", []))


def test_a_step_cost_fitted_at_other_graphs_refuses_the_capture() -> None:
    pinned = sim_config(
        "vllm_v1",
        [
            "engine.step_cost=FITTED",  # a fitted profile states every term it reads
            *(f"engine.{k}=0" for k in FITTED_COST_KEYS if k != "request_us"),
            "engine.request_us=50",
            "engine.q_shape_us=[]",
            "engine.q_pad_tokens=16",
            "engine.kv_pad_tokens=0",
            "engine.fitted_on='NVIDIA H100 80GB HBM3'",
            "++engine.fitted_settings={cudagraph_mode:FULL_AND_PIECEWISE}",
        ],
    )
    with pytest.raises(EngineSettingsError, match=r"'cudagraph_mode' = FULL_DECODE_ONLY"):
        resolve(FOLDER, engine(), pinned)


def test_a_folder_in_the_capture_format_validates_on_vllm_v1(tmp_path: Path) -> None:
    reqs, _ = vllm_gt.workload("poisson_r6")
    reqs = [vllm_gt.Req(**{**r.__dict__, "max_new_tokens": 8}) for r in reqs[:10]]
    client = vllm_gt.OpenLoop(reqs)
    t0 = 50.0
    for r, _ids in client.due(1e9):
        sent = t0 + (client.records[r.request_id].planned_s or 0.0)
        client.sent(r.request_id, sent)
        for k in range(8):
            client.tokens(r.request_id, sent + 0.04 + 0.012 * k, [5])
        client.records[r.request_id].num_cached_tokens = 0
        client.finish(r.request_id, t0)
    run = tmp_path / "poisson_r6" / "run1"
    run.mkdir(parents=True)
    rows = client.rows(t0, 16, {})
    write_table(rows, {**REQUEST_TYPES, **vllm_gt.ENGINE_REQUEST_TYPES}, run / "requests")
    (run / "engine.json").write_text(json.dumps(engine(gpu="NVIDIA H200")))
    out, pairs = validate_runs(tmp_path / "poisson_r6", "vllm_v1")
    row = out["poisson_r6"]
    assert row["finished_sim"] == row["requests"] == 10
    assert "engine.kv_pool_blocks=26000" in row["engine_settings"]["overrides"]
    sim, real = pairs["poisson_r6"]
    assert sim.finished.height == real.finished.height == 10


@pytest.fixture(scope="module")
def vllm_h100() -> Any:
    return sim_config("vllm_v1_h100", [])


def test_the_fitted_vllm_profile_takes_the_capture_sizes_and_pins_the_rest(vllm_h100: Any) -> None:
    out = resolve(FOLDER, engine(max_cudagraph_capture_size=16), vllm_h100)
    assert "engine.graph_sizes=[1,2,4,8,16]" in out.overrides
    uses = {s.key: s.use for s in out.settings}
    assert uses["cudagraph_mode"] == "equals the step cost's FULL_DECODE_ONLY"
    assert uses["compilation_mode"] == "equals the step cost's 0"
    assert sim_config("vllm_v1_h100", out.overrides).engine.graph_sizes == [1, 2, 4, 8, 16]


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"max_cudagraph_capture_size": 512}, "max_cudagraph_capture_size"),  # sizes end at 16
        ({"cudagraph_capture_sizes": [1, 0, 8]}, "cudagraph_capture_sizes"),
        ({"cudagraph_capture_sizes": "1,2"}, "cudagraph_capture_sizes"),
        ({"cudagraph_mode": "FULL_AND_PIECEWISE"}, "cudagraph_mode"),
        ({"compilation_mode": 3}, "compilation_mode"),
        ({"enforce_eager": True}, "enforce_eager"),
        ({"model_runner": "v1"}, "model_runner"),
        ({"attention_backend": "TRITON_ATTN"}, "attention_backend"),
    ],
)
def test_a_graph_or_compile_setting_the_fitted_vllm_cost_was_not_measured_at_is_refused(
    vllm_h100: Any, changes: dict[str, Any], key: str
) -> None:
    with pytest.raises(EngineSettingsError) as err:
        resolve(FOLDER, engine(**({"max_cudagraph_capture_size": 16} | changes)), vllm_h100)
    line = str(err.value)
    assert "\n" not in line and str(FOLDER / "engine.json") in line and repr(key) in line
