"""The scorecard command: every tier config validates and cites its sources; bad input is named."""

from __future__ import annotations

import re

import pytest

from cachepilot_sim.cost.kv_bytes import KvDtype, kv_bytes_per_token
from cachepilot_sim.tools import scorecard

TIERS = {"a100_40gb", "a100_80gb", "h100_sxm", "h200", "b200", "l40s", "mi300x"}
FIGURES = ("hbm_gb", "hbm_gbps", "bf16_dense_tflops", "fp8_dense_tflops", "pcie_gen")


def test_every_gpu_tier_validates_and_cites_a_source_per_figure() -> None:
    gpus = scorecard.load_gpus()
    assert {g.name for g in gpus} == TIERS
    for name in TIERS:
        text = (scorecard.CONF_DIR / "gpu" / f"{name}.yaml").read_text()
        assert re.search(r"https://\S+", text), name
        for key in FIGURES:
            line = next(ln for ln in text.splitlines() if ln.startswith(f"{key}:"))
            assert "#" in line, f"{name}: {key} has no cited source"


@pytest.mark.parametrize(
    ("model", "kib_fp16"),
    [
        ("llama2_7b", 512),
        ("llama3_8b", 128),
        ("llama3_70b", 320),
        ("mistral_7b", 128),
        ("qwen2_7b", 56),
    ],
)
def test_model_configs_give_the_hand_computed_kv_bytes_per_token(model: str, kib_fp16: int) -> None:
    m = scorecard.load_model(model)
    assert kv_bytes_per_token(m, KvDtype.FP16.value_bytes) == kib_fp16 * 1024
    assert kv_bytes_per_token(m, KvDtype.FP8.value_bytes) == kib_fp16 * 512


def test_scorecard_prints_every_tier_and_the_measured_h200_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert scorecard.main(["--model", "llama3_8b", "--context-tokens", "2048"]) == 0
    out = capsys.readouterr().out
    for label in ("A100 40GB", "A100 80GB", "H100 SXM", "H200", "B200", "L40S", "MI300X"):
        assert label in out
    assert "bandwidth" in out and "datasheet vs measured" in out
    assert "855.4" in out  # 2 x 8.03e9 FLOP / 18.77 µs per prefill token on the H200


def test_llama3_70b_does_not_fit_a_80gb_part() -> None:
    m = scorecard.load_model("llama3_70b")
    h100 = scorecard.load_gpus(["h100_sxm"])[0]
    ts = scorecard.score(h100, m, 2048, 0, 2**30)
    assert ts.bound is None and ts.tokens[KvDtype.FP16] == 0


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--model", "gpt5"], "model"),
        (["--context-tokens", "-5"], "context_tokens"),
        (["--context-tokens", "abc"], "context_tokens"),
        (["--batch", "-1"], "batch"),
        (["--gpus", "tpu"], "gpus"),
    ],
)
def test_bad_argument_exits_2_naming_the_key(
    args: list[str], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert scorecard.main(args) == 2
    assert f"'{key}'" in capsys.readouterr().err


def test_unknown_option_is_refused_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        scorecard.main(["--colour", "red"])
    assert exit_info.value.code == 2 and "--colour" in capsys.readouterr().err
