"""The vLLM bundle's GPU-side stager (experiments/validation/vllm/gpu_stage.py) on a tiny bundle:
parts copied one command at a time, checked against the manifest, extracted; bad input refused
in one line with exit code 2; and the committed manifest describes a bundle that fits a command."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

VLLM_DIR = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "vllm"
STAGER = VLLM_DIR / "gpu_stage.py"
COMMAND_LIMIT_BYTES = 64 << 20


def make_bundle(tmp: Path, part_bytes: int = 700) -> Path:
    """A tar.xz of a small package tree split into parts, and its manifest; returns the manifest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, size in (("pkg/__init__.py", 50), ("pkg/data.bin", 3000)):
            data = np.random.default_rng(size).bytes(size)  # incompressible: several parts
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(data[:size]))
    archive = buf.getvalue()
    out = tmp / "bundle"
    out.mkdir()
    parts = []
    for i in range(0, len(archive), part_bytes):
        chunk = archive[i : i + part_bytes]
        (out / f"part{len(parts)}").write_bytes(chunk)
        parts.append(
            {
                "name": f"part{len(parts)}",
                "bytes": len(chunk),
                "sha256": hashlib.sha256(chunk).hexdigest(),
            }
        )
    manifest = out / "manifest.json"
    manifest.write_text(
        json.dumps({"archive_sha256": hashlib.sha256(archive).hexdigest(), "parts": parts})
    )
    return manifest


def stage(manifest: Path, part: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["--part", str(manifest.parent / part), "--manifest", str(manifest), *extra]
    return subprocess.run(
        [sys.executable, str(STAGER), *args], capture_output=True, text=True, timeout=60
    )


def test_parts_sent_one_by_one_extract_to_the_site(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    names = [p["name"] for p in json.loads(manifest.read_text())["parts"]]
    assert len(names) >= 3
    st, site = tmp_path / "stage", tmp_path / "site"
    for name in names[:-1]:
        assert stage(manifest, name, "--stage", str(st)).returncode == 0
    res = stage(manifest, names[-1], "--stage", str(st), "--finish", "--site", str(site))
    assert res.returncode == 0, res.stderr
    assert (site / "pkg" / "data.bin").stat().st_size == 3000
    again = stage(manifest, names[-1], "--stage", str(st), "--finish", "--site", str(site))
    assert "already extracted" in again.stdout


def test_corrupt_part_is_refused_in_one_line(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    part = manifest.parent / "part1"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    res = stage(manifest, "part1", "--stage", str(tmp_path / "stage"))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "part1" in res.stderr and "sha256" in res.stderr
    assert not (tmp_path / "stage" / "part1").exists()


@pytest.mark.parametrize(
    ("part", "message"), [("part9", "no such file"), ("manifest.json", "not in the manifest")]
)
def test_unknown_part_is_refused(tmp_path: Path, part: str, message: str) -> None:
    manifest = make_bundle(tmp_path)
    res = stage(manifest, part, "--stage", str(tmp_path / "stage"))
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_finish_names_the_parts_missing_from_the_stage(tmp_path: Path) -> None:
    manifest = make_bundle(tmp_path)
    last = json.loads(manifest.read_text())["parts"][-1]["name"]
    site = tmp_path / "site"
    res = stage(manifest, last, "--stage", str(tmp_path / "stage"), "--finish", "--site", str(site))
    assert res.returncode == 2 and "['part0'" in res.stderr and "back to back" in res.stderr
    assert not site.exists()


def test_committed_manifest_parts_each_fit_one_command_beside_the_tree() -> None:
    manifest = json.loads((VLLM_DIR / "bundle_manifest.json").read_text())
    assert sum(p["bytes"] for p in manifest["parts"]) == manifest["archive_bytes"]
    assert max(p["bytes"] for p in manifest["parts"]) <= 30 << 20
    assert 30 << 20 <= COMMAND_LIMIT_BYTES - (25 << 20)  # the ~25 MiB working tree travels too
    wheels = {w["name"]: w["version"] for w in manifest["wheels"]}
    assert wheels["vllm"] == "0.26.0"
    removed = {d["glob"] for d in manifest["deletions"] if d["num_paths"] > 0}
    assert "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" in removed
