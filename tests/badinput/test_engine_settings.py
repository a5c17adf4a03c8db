"""Every engine.json setting is honoured or refused (validation/engine_settings.py): a refusal is
one line naming the file and the key, the overrides a replay applies come from the capture, and
`validate` prints what it replayed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.tools.validate import main, sim_config
from cachepilot_sim.validation.engine_settings import EngineSettingsError, resolve

ROOT = Path(__file__).resolve().parents[2] / "experiments/validation/hf_cb/2026-12-01"
CAPTURE = ROOT / "closed_b16/run1"


@pytest.fixture(scope="module")
def hf_cb() -> Any:
    return sim_config("hf_cb", [])


@pytest.fixture(scope="module")
def roofline() -> Any:
    return sim_config("vllm_v1", [])


def _engine(**changes: Any) -> dict[str, Any]:
    engine = json.loads((CAPTURE / "engine.json").read_text())
    for key, value in changes.items():
        if value is None:
            engine.pop(key, None)
        else:
            engine[key] = value
    return engine


def test_the_capture_settings_become_overrides(hf_cb: Any) -> None:
    engine = _engine(max_batch_tokens=8192, max_requests_per_batch=64, safety_margin=0.0)
    engine |= {"num_blocks": 3446, "num_pages": 3446 * 256, "use_async_batching": False}
    out = resolve(CAPTURE, engine, hf_cb)
    assert "batcher.throughput_token_budget=8192" in out.overrides
    assert "batcher.throughput_max_seqs=64" in out.overrides
    assert "engine.kv_pool_blocks=3446" in out.overrides
    assert "engine.prefill_margin_fraction=0.0" in out.overrides
    assert "engine.async_scheduling=false" in out.overrides
    assert "engine.kv_read_cap=true" in out.overrides
    assert "engine.graph_mode=PRECAPTURED" in out.overrides
    # the composed config takes every override
    cfg = sim_config("hf_cb", out.overrides)
    assert cfg.batcher.throughput_token_budget == 8192 and cfg.engine.kv_pool_blocks == 3446
    assert not out.transfer and out.gpu == "NVIDIA H200"


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"q_padding_interval_size": 64}, "q_padding_interval_size"),
        ({"kv_padding_interval_size": 0}, "kv_padding_interval_size"),
        ({"attn_implementation": "paged|sdpa"}, "attn_implementation"),
        ({"use_cuda_graph": [False, False]}, "use_cuda_graph"),
        ({"precaptured_graphs": None}, "use_cuda_graph"),  # lazy: hf_cb has no capture cost
        ({"num_cpu_blocks": -1}, "num_cpu_blocks"),
        ({"scheduler_type": "prefill_first"}, "scheduler_type"),
        ({"use_prefix_sharing": False}, "use_prefix_sharing"),
        ({"decode_fast_path": True}, "decode_fast_path"),
        ({"compile": True}, "compile"),
        ({"max_batch_tokens": 0}, "max_batch_tokens"),
        ({"num_pages": 1000}, "num_pages"),  # not num_blocks x block_size: the read cap
        ({"max_batch_tokens": "2048"}, "max_batch_tokens"),
        ({"safety_margin": 1.5}, "safety_margin"),
        ({"kv_bytes_per_token": 65536}, "kv_bytes_per_token"),
        ({"speculative_tokens": 4}, "speculative_tokens"),  # unknown: may be a setting
    ],
)
def test_a_setting_the_profile_cannot_replay_is_refused_naming_the_key(
    hf_cb: Any, changes: dict[str, Any], key: str
) -> None:
    with pytest.raises(EngineSettingsError) as err:
        resolve(CAPTURE, _engine(**changes), hf_cb)
    line = str(err.value)
    assert "\n" not in line and str(CAPTURE / "engine.json") in line and repr(key) in line


def test_lazy_graphs_and_cpu_swap_are_replayed(hf_cb: Any) -> None:
    captures = [{"t_us": 0, "dur_us": d, "key": [64, 16384, 1024], "pair": 0} for d in (9, 7, 8)]
    engine = _engine(precaptured_graphs=None, graph_captures_during_run=captures)
    lazy_cb = sim_config("hf_cb", ["engine.graph_capture_us=50000"])
    out = resolve(CAPTURE, engine | {"num_cpu_blocks": 32}, lazy_cb)
    assert "engine.graph_mode=LAZY" in out.overrides
    assert not any(o.startswith("engine.graph_capture_us") for o in out.overrides)
    assert "engine.cpu_swap_blocks=32" in out.overrides


def test_a_model_of_another_shape_is_refused(hf_cb: Any) -> None:
    engine = _engine()
    engine["model"] = dict(engine["model"], num_hidden_layers=80)
    with pytest.raises(EngineSettingsError, match=r"'model.num_hidden_layers' = 80"):
        resolve(CAPTURE, engine, hf_cb)


@pytest.mark.parametrize(("key", "value"), [("hidden_size", 5120), ("dtype", "float16")])
def test_a_model_the_step_cost_was_not_measured_on_is_refused(
    hf_cb: Any, key: str, value: Any
) -> None:
    engine = _engine()
    engine["model"] = dict(engine["model"], **{key: value})
    with pytest.raises(EngineSettingsError, match=rf"'model.{key}' = {value}: the step cost"):
        resolve(CAPTURE, engine, hf_cb)


def test_another_gpu_is_a_transfer_reported_not_hidden(hf_cb: Any) -> None:
    out = resolve(CAPTURE, _engine(gpu="NVIDIA H100 80GB HBM3"), hf_cb)
    assert out.transfer and out.fitted_on == "NVIDIA H200"
    assert any("NVIDIA H100" in n and "NVIDIA H200" in n for n in out.notes)


def test_a_roofline_profile_lists_the_step_cost_settings_it_does_not_model(roofline: Any) -> None:
    out = resolve(CAPTURE, _engine(q_padding_interval_size=64), roofline)
    uses = {s.key: s.use for s in out.settings}
    assert "not modelled" in uses["q_padding_interval_size"]
    assert "not modelled" in uses["use_cuda_graph"]
    assert "batcher.throughput_token_budget=2048" in out.overrides


def test_another_engines_keys_are_listed_as_not_read(hf_cb: Any) -> None:
    out = resolve(CAPTURE, {"engine": "vllm", "block_size": 16, "request_rate": 4.0}, hf_cb)
    assert "kv.block_tokens=16" in out.overrides
    assert {s.key: s.use for s in out.settings}["request_rate"].startswith("not read")


def test_validate_prints_the_settings_and_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([str(ROOT / "closed_b16")])
    out = capsys.readouterr().out
    assert "engine settings replayed" in out
    assert "max_batch_tokens = 2048: batcher.throughput_token_budget=2048" in out
    run = tmp_path / "closed_b16" / "run1"
    shutil.copytree(CAPTURE, run)
    (run / "engine.json").write_text(json.dumps(_engine(q_padding_interval_size=64)))
    assert main([str(tmp_path / "closed_b16")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'q_padding_interval_size'" in err
