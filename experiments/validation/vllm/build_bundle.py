#!/usr/bin/env python3
"""Build the trimmed vLLM 0.26.0 bundle that the lent GPU machine (no network) imports offline.

Downloads pinned wheels from PyPI (`pip download --no-deps`, CPython 3.12 x86-64 manylinux tags),
installs them into one staging folder (`pip install --no-deps --no-compile --target`), deletes what
an offline dense-Llama run on SM90 never loads (see DELETIONS), packs the tree with `tar | xz`,
splits it into parts small enough to ride one GPU command each, and writes a manifest (versions,
deletions, sizes, sha256 of the archive and of every part). The committed copy of the manifest
(bundle_manifest.json beside this script) is what gpu_stage.py checks the parts against.

    python3 experiments/validation/vllm/build_bundle.py --out /work/main/build/vllm_bundle

Packages the GPU machine already has (torch 2.11.0, triton 3.6, transformers, numpy, numba,
protobuf, ...) are not carried: every install is `--no-deps`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
PYTHON_VERSION = "3.12"
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in (17, 24, 26, 27, 28, 31)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]

# vLLM and what an offline AsyncLLM run imports that the GPU machine lacks
# (../shared/reference/vllm_on_gpu_machine.md), plus what torch.compile and logging use lazily.
PINS = [
    "vllm==0.26.0",
    "pydantic==2.13.4",
    "pydantic-core==2.46.4",
    "typing-inspection==0.4.5",
    "annotated-types==0.8.0",
    "cbor2==6.3.0",
    "pyzmq==27.1.0",
    "openai-harmony==0.0.8",
    "openai==3.22.1",
    "httpx2==2.17.0",
    "httpcore2==2.17.0",
    "truststore==0.10.5",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "msgspec==0.23.0",
    "pybase64==1.5.1",
    "cachetools==8.0.3",
    "llguidance==1.7.6",
    "xgrammar==0.2.3",
    "apache-tvm-ffi==0.1.10",
    "fastapi==0.136.3",
    "starlette==1.7.0",
    "partial-json-parser==0.2.1.1.post7",
    "depyf==0.20.0",
    "astor==0.8.1",
    "dill==0.4.1",
    "setproctitle==1.3.8",
    "blake3==1.0.11",
    "prometheus-fastapi-instrumentator==8.1.0",
    "python-json-logger==4.2.0",
]

# (glob relative to the stage, why). A glob matching nothing is reported, not an error: the
# manifest says what each one removed.
DELETIONS = [
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FA2 fallback; vLLM picks FA3 on SM90"),
    ("vllm/vllm-rs", "Rust front-end binary (the API server's), unused offline"),
    *(
        (f"vllm/third_party/deep_gemm/_C.cpython-{v}-*.so", "deep_gemm build for another Python")
        for v in (310, 311, 313, 314)
    ),
    ("xgrammar/lib/libxgrammar.a", "static library, only for building against xgrammar"),
    ("vllm/third_party/deep_gemm/include", "JIT-only header tree (deep_gemm, FP8 MoE/GEMM)"),
    ("vllm/third_party/fmha_sm100", "JIT-only header tree for SM100 attention"),
    ("bin", "console scripts, unused with PYTHONPATH"),
    ("**/__pycache__", "byte code; rebuilt on first import"),
]
MOE_DELETION = (
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "MoE kernels; platforms/cuda.py imports it under suppress(ImportError), a dense Llama never "
    "calls it (only fused_moe and _custom_ops' MoE wrappers use torch.ops._moe_C)",
)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


def tree_bytes(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+ " + " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else ""), flush=True)
    subprocess.run(cmd, check=True)


def target_flags() -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for plat in PLATFORMS:
        flags += ["--platform", plat]
    return flags


def download(wheels: Path, pins: list[str]) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    pip("download", "--no-deps", "-q", *target_flags(), "-d", str(wheels), *pins)
    names = {p.split("==")[0].lower().replace("-", "_") for p in pins}
    found = [w for w in sorted(wheels.glob("*.whl")) if w.name.split("-")[0].lower() in names]
    missing = names - {w.name.split("-")[0].lower() for w in found}
    if missing:
        raise SystemExit(f"build_bundle: no wheel downloaded for {sorted(missing)}")
    return found


def delete(stage: Path, rules: list[tuple[str, str]]) -> list[dict]:
    """Apply each (glob, why) rule under `stage`; return what each removed (paths and bytes)."""
    done = []
    for pattern, why in rules:
        if pattern.startswith("**/"):
            hits = sorted(stage.rglob(pattern[3:]))
        else:
            hits = sorted(stage.glob(pattern))
        removed = 0
        for hit in hits:
            if not (hit.exists() or hit.is_symlink()):
                continue  # inside a tree already removed
            removed += tree_bytes(hit)
            if hit.is_dir() and not hit.is_symlink():
                shutil.rmtree(hit)
            else:
                hit.unlink()
        done.append(
            {
                "glob": pattern,
                "why": why,
                "num_paths": len(hits),
                "bytes": removed,
                "paths": [str(h.relative_to(stage)) for h in hits[:20]],
            }
        )
        print(f"  delete {pattern}: {len(hits)} paths, {removed / MIB:.1f} MiB", flush=True)
    return done


def pack(stage: Path, archive: Path, threads: int, level: int) -> None:
    """Deterministic tar (sorted names, fixed owner and mtime) piped through xz."""
    tar = subprocess.Popen(
        [
            "tar",
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=2026-01-01 00:00:00",
            "-C",
            str(stage),
            "-cf",
            "-",
            ".",
        ],
        stdout=subprocess.PIPE,
    )
    with open(archive, "wb") as f:
        xz = subprocess.run(
            ["xz", f"-T{threads}", f"-{level}", "-c"], stdin=tar.stdout, stdout=f, check=False
        )
    assert tar.stdout is not None
    tar.stdout.close()
    if tar.wait() != 0 or xz.returncode != 0:
        raise SystemExit(f"build_bundle: tar|xz failed ({tar.returncode}, {xz.returncode})")


def split(archive: Path, out: Path, part_bytes: int) -> list[dict]:
    parts = []
    with open(archive, "rb") as f:
        while chunk := f.read(part_bytes):
            path = out / f"part{len(parts)}"
            path.write_bytes(chunk)
            parts.append(
                {
                    "name": path.name,
                    "bytes": len(chunk),
                    "sha256": hashlib.sha256(chunk).hexdigest(),
                }
            )
    return parts


def wheel_version(wheel: Path) -> tuple[str, str]:
    name, version = wheel.name.split("-")[:2]
    return name.lower(), version


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for part0, part1, ...")
    ap.add_argument("--work", type=Path, default=Path("/tmp/vllm_bundle_work"))
    ap.add_argument("--part-mib", type=int, default=30)
    ap.add_argument("--keep-moe", action="store_true", help="carry _moe_C (MoE models)")
    ap.add_argument("--xz-threads", type=int, default=2)
    ap.add_argument("--xz-level", type=int, default=6)
    ap.add_argument(
        "--manifest", type=Path, default=HERE / "bundle_manifest.json", help="committed copy"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    wheels = download(args.work / "wheels", PINS)
    stage = args.work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    pip(
        "install",
        "--no-deps",
        "--no-compile",
        "-q",
        "--target",
        str(stage),
        *target_flags(),
        *map(str, wheels),
    )
    installed = tree_bytes(stage)
    rules = DELETIONS + ([] if args.keep_moe else [MOE_DELETION])
    deletions = delete(stage, rules)
    staged = tree_bytes(stage)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("part*"):
        old.unlink()
    archive = args.work / "vllm_bundle.tar.xz"
    pack(stage, archive, args.xz_threads, args.xz_level)
    parts = split(archive, args.out, args.part_mib * MIB)
    manifest = {
        "bundle": "vllm_bundle.tar.xz",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python_target": PYTHON_VERSION,
        "platforms": PLATFORMS,
        "wheels": [
            {
                "file": w.name,
                "name": wheel_version(w)[0],
                "version": wheel_version(w)[1],
                "bytes": w.stat().st_size,
                "sha256": sha256_file(w),
            }
            for w in wheels
        ],
        "keep_moe": args.keep_moe,
        "deletions": deletions,
        "installed_bytes": installed,
        "staged_bytes": staged,
        "archive_bytes": archive.stat().st_size,
        "archive_sha256": sha256_file(archive),
        "part_bytes_max": args.part_mib * MIB,
        "parts": parts,
        "command": " ".join(sys.argv),
    }
    text = json.dumps(manifest, indent=1) + "\n"
    (args.out / "manifest.json").write_text(text)
    args.manifest.write_text(text)
    print(
        f"build_bundle: {len(wheels)} wheels, installed {installed / MIB:.0f} MiB, staged "
        f"{staged / MIB:.0f} MiB, archive {manifest['archive_bytes'] / MIB:.1f} MiB in "
        f"{len(parts)} parts under {args.out} ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    os.sync()


if __name__ == "__main__":
    main()
