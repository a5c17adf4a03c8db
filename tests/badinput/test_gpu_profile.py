"""A bad gpu_profile.json is refused in one line naming the file and the key; a missing key is an
error, never a figure borrowed from another GPU (cost/gpu_profile.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from cachepilot_sim.cost.gpu_profile import GpuProfileError, check_model, load_gpu_profile
from tests.unit.test_step_physical import synthetic_profile_json


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "gpu_profile.json"
    path.write_text(json.dumps(data))
    return path


def without(data: dict[str, Any], dotted: str) -> dict[str, Any]:
    """`data` with the key at `dotted` (a.b, or a[3].b) removed."""
    out = copy.deepcopy(data)
    node: Any = out
    parts = dotted.replace("[", ".").replace("]", "").split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    del node[parts[-1]]
    return out


@pytest.mark.parametrize(
    "key",
    [
        "format",
        "gpu",
        "hbm_read_bytes_per_us",
        "hbm_copy_bytes_per_us",
        "launch_us",
        "graph_kernel_us",
        "pcie_h2d_bytes_per_us",
        "model.kv_heads",
        "gemm",
        "gemm[3].us",
        "gemm[0].m",
        "attention",
        "attention.prefill",
        "attention.decode[2].context",
    ],
)
def test_missing_key_is_an_error_naming_file_and_key(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, without(synthetic_profile_json(), key))
    with pytest.raises(GpuProfileError) as info:
        load_gpu_profile(path)
    message = str(info.value)
    assert str(path) in message and f"'{key}'" in message and "missing" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hbm_copy_bytes_per_us", 0),
        ("launch_us", -1.0),
        ("hbm_read_bytes_per_us", "fast"),
        ("graph_kernel_us", True),
        ("format", "cachepilot-gpu-profile/0"),
        ("gpu", ""),
    ],
)
def test_bad_value_is_refused(tmp_path: Path, key: str, value: object) -> None:
    data = synthetic_profile_json() | {key: value}
    path = write(tmp_path, data)
    with pytest.raises(GpuProfileError, match=rf"{path}: key '{key}' = "):
        load_gpu_profile(path)


def test_unknown_gemm_layer_and_too_few_points_are_refused(tmp_path: Path) -> None:
    data = synthetic_profile_json()
    data["gemm"][0]["layer"] = "mlp"
    with pytest.raises(GpuProfileError, match=r"key 'gemm\[0\]\.layer' = 'mlp'"):
        load_gpu_profile(write(tmp_path, data))
    data = synthetic_profile_json()
    data["gemm"] = [row for row in data["gemm"] if row["layer"] != "down" or row["m"] == 1]
    with pytest.raises(GpuProfileError, match=r"key 'gemm\[layer=down\]' needs at least 2"):
        load_gpu_profile(write(tmp_path, data))
    data = synthetic_profile_json()
    data["attention"]["decode"] = [r for r in data["attention"]["decode"] if r["batch"] != 1]
    with pytest.raises(GpuProfileError, match=r"key 'attention\.decode\[batch=1\]'"):
        load_gpu_profile(write(tmp_path, data))


def test_repeated_gemm_point_is_refused(tmp_path: Path) -> None:
    data = synthetic_profile_json()
    data["gemm"].append(dict(data["gemm"][0]))
    with pytest.raises(GpuProfileError, match=r"key 'gemm\[layer=qkv\]' repeats a point"):
        load_gpu_profile(write(tmp_path, data))


def test_unreadable_or_non_json_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(GpuProfileError, match=r"nope\.json: cannot read"):
        load_gpu_profile(tmp_path / "nope.json")
    path = tmp_path / "gpu_profile.json"
    path.write_text("{not json")
    with pytest.raises(GpuProfileError, match=rf"{path}: not JSON \(line 1"):
        load_gpu_profile(path)


def test_profile_of_another_model_geometry_is_refused(tmp_path: Path) -> None:
    profile = load_gpu_profile(write(tmp_path, synthetic_profile_json()))
    check_model(profile, kv_heads=8, head_dim=128, heads=32)
    with pytest.raises(GpuProfileError, match=r"key 'model\.kv_heads' = 8: the simulated model"):
        check_model(profile, kv_heads=4, head_dim=128, heads=32)
