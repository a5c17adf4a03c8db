"""`python -m cachepilot_sim.tools.vllm_bench` without a GPU: argument handling, the engine
configuration per policy, session loading, the summary, and the standalone job script. The engine
run itself (integrations/vllm/engine_run.py) needs vLLM on a CUDA host and is not exercised here."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.integrations.vllm.engine_run import summarize
from cachepilot_sim.integrations.vllm.params import ENV_VAR, params_from_env, params_from_mapping
from cachepilot_sim.tools import vllm_bench


def test_engines_differ_only_in_the_cache_policy() -> None:
    args = vllm_bench.parse_args(["--model", "/m", "--dummy-weights", "--cpu-offload-gb", "2"])
    lru, perc = vllm_bench.engine_kwargs(args, "lru"), vllm_bench.engine_kwargs(args, "perc")
    extra_lru = lru["kv_transfer_config"]["kv_connector_extra_config"]
    extra_perc = perc["kv_transfer_config"]["kv_connector_extra_config"]
    assert extra_lru == {
        "cpu_bytes_to_use": 2 * 1024**3,
        "blocks_per_chunk": 16,
        "eviction_policy": "lru",
    }
    assert extra_perc["eviction_policy"] == "PercCachePolicy"
    assert extra_perc["cache_policy_module_path"] == "cachepilot_sim.integrations.vllm.policy"
    assert {k: v for k, v in perc.items() if k != "kv_transfer_config"} == {
        k: v for k, v in lru.items() if k != "kv_transfer_config"
    }
    assert lru["load_format"] == "dummy" and lru["skip_tokenizer_init"] is True
    assert lru["kv_transfer_config"]["kv_connector"] == "OffloadingConnector"


def test_on_vllm_026_perc_comes_through_our_spec_and_every_policy_offloads_replies() -> None:
    args = vllm_bench.parse_args(
        ["--model", "/m", "--vllm-api", "0.26", "--perc-delta-s", "12", "--no-compile"]
    )
    lru, perc = vllm_bench.engine_kwargs(args, "lru"), vllm_bench.engine_kwargs(args, "perc")
    extra_lru = lru["kv_transfer_config"]["kv_connector_extra_config"]
    extra_perc = perc["kv_transfer_config"]["kv_connector_extra_config"]
    assert extra_lru["eviction_policy"] == "lru" and extra_lru["offload_prompt_only"] is False
    assert "eviction_policy" not in extra_perc and extra_perc["offload_prompt_only"] is False
    assert extra_perc["spec_name"] == "PercCPUOffloadingSpec026"
    assert extra_perc["spec_module_path"] == "cachepilot_sim.integrations.vllm.spec026"
    assert extra_perc["cachepilot_policy"] == "perc"
    assert extra_perc["cachepilot_perc"]["delta_s"] == 12.0
    params_from_mapping(extra_perc["cachepilot_perc"], tokens_per_chunk=256)  # the spec's call
    assert (
        lru["compilation_config"]
        == perc["compilation_config"]
        == {
            "mode": 0,
            "cudagraph_mode": "FULL_DECODE_ONLY",
        }
    )


def test_perc_parameters_reach_the_engine_through_the_environment() -> None:
    args = vllm_bench.parse_args(
        ["--model", "/m", "--perc-delta-s", "12", "--block-size", "32", "--blocks-per-chunk", "4"]
    )
    assert vllm_bench.engine_env(args, "lru") == {}
    params = params_from_env(vllm_bench.engine_env(args, "perc"))
    assert (params.delta_s, params.tokens_per_chunk) == (12.0, 128)
    assert ENV_VAR in vllm_bench.engine_env(args, "perc")


@pytest.mark.parametrize(
    "argv",
    [
        ["--dummy-weights"],  # no --model
        ["--model", "/m", "--policies", "lru,fifo"],
        ["--model", "/m", "--cpu-offload-gb", "0"],
        ["--model", "/m", "--prompts", "a.jsonl", "--dataset", "b.json"],
    ],
)
def test_bad_arguments_stop_with_a_usage_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as err:
        vllm_bench.parse_args(argv)
    assert err.value.code == 2


def test_sessions_from_jsonl_sharegpt_and_the_synthetic_mix(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"session_id": "a", "turns": ["hi", "more"]}\n{"prompt": "solo"}\n')
    args = vllm_bench.parse_args(["--model", "/m", "--prompts", str(jsonl), "--max-tokens", "9"])
    sessions = vllm_bench.load_sessions(args)
    assert [(s.session_id, s.turns, s.max_tokens) for s in sessions] == [
        ("a", ["hi", "more"], [9, 9]),
        ("1", ["solo"], [9]),
    ]
    share = tmp_path / "s.json"
    convs = [
        {
            "id": "c",
            "conversations": [
                {"from": "human", "value": "q1"},
                {"from": "gpt", "value": "a1"},
                {"from": "human", "value": "q2"},
            ],
        }
    ]
    share.write_text(json.dumps(convs))
    args = vllm_bench.parse_args(["--model", "/m", "--dataset", str(share)])
    assert vllm_bench.load_sessions(args)[0].turns == ["q1", "q2"]
    args = vllm_bench.parse_args(
        [
            "--model",
            "/m",
            "--num-sessions",
            "5",
            "--max-turns",
            "2",
            "--workload",
            str(CONF_DIR / "workload/mixed.yaml"),
        ]
    )
    synth = vllm_bench.load_sessions(args)
    assert len(synth) == 5 and all(1 <= len(s.turns) <= 2 for s in synth)
    assert all(isinstance(t, list) and max(t) < 32_000 for s in synth for t in s.turns)
    assert synth == vllm_bench.load_sessions(args)  # seeded
    args = vllm_bench.parse_args(
        [
            "--model",
            "/m",
            "--num-sessions",
            "40",
            "--max-model-len",
            "3000",
            "--workload",
            str(CONF_DIR / "workload/mixed.yaml"),
        ]
    )
    short = vllm_bench.load_sessions(args)
    assert short and all(sum(len(t) for t in s.turns) + sum(s.max_tokens) <= 3000 for s in short)
    assert len(short) < 40  # long-context sessions do not fit at all and are left out


def test_summary_of_per_request_metrics() -> None:
    records = [
        {"ttft_s": 0.1, "tpot_s": 0.02, "output_tokens": 10},
        {"ttft_s": 0.3, "tpot_s": float("nan"), "output_tokens": 1},
    ]
    s = summarize(records, wall_s=2.0)
    assert s["ttft_s_mean"] == pytest.approx(0.2) and s["tpot_ms_mean"] == pytest.approx(20.0)
    assert s["output_tokens_per_s"] == pytest.approx(5.5) and s["requests_per_s"] == 1.0


def test_standalone_script_reruns_the_same_arguments(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    argv = ["--model", "/models/x y", "--dummy-weights", "--emit-script", str(script)]
    vllm_bench.main(argv)
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    line = next(
        x
        for x in text.splitlines()
        if "cachepilot_sim.tools.vllm_bench" in x and not x.startswith("#")
    )
    rerun = shlex.split(line)[3:]
    assert "--emit-script" not in rerun
    assert vars(vllm_bench.parse_args(rerun)) == {
        **vars(vllm_bench.parse_args(argv)),
        "emit_script": None,
    }
    assert "pip install '.[vllm]'" in text  # the project checkout the job runs in, with vLLM


def test_each_policy_runs_in_its_own_process_and_the_summaries_are_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-policy child process is replaced by one that writes what engine_run would."""
    calls: list[tuple[str, bool]] = []

    def child(cmd: list[str], check: bool, env: dict[str, str]) -> None:
        policy = cmd[cmd.index("--only") + 1]
        calls.append((policy, ENV_VAR in env))
        assert cmd[1:3] == ["-m", "cachepilot_sim.tools.vllm_bench"] and check
        summary = {"ttft_s_mean": {"lru": 1.0, "perc": 0.5}[policy]}
        (tmp_path / f"{policy}.json").write_text(json.dumps({"summary": summary}))

    monkeypatch.setattr(vllm_bench.subprocess, "run", child)
    monkeypatch.delenv(ENV_VAR, raising=False)
    vllm_bench.main(["--model", "/m", "--out", str(tmp_path)])
    assert calls == [("lru", False), ("perc", True)]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"lru": {"ttft_s_mean": 1.0}, "perc": {"ttft_s_mean": 0.5}}
