#!/usr/bin/env python3
"""Bring the vLLM bundle onto the GPU machine one carried part per command (stdlib only).

A carried path is replaced by the next command's, so each command copies its part out to a
staging folder; the last one (`--finish`) checks every part and the whole archive against the
committed manifest and extracts it (tarfile mode 'r|xz') into the site folder put on PYTHONPATH.

    S=experiments/validation/vllm/gpu_stage.py
    python3 $S --part build/vllm_bundle/part0 --stage /tmp/vllm_stage
    python3 $S --part build/vllm_bundle/part1 --stage /tmp/vllm_stage
    python3 $S --part build/vllm_bundle/part2 --stage /tmp/vllm_stage --finish --site /tmp/vllm_site

Every failure is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import shutil
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

MANIFEST = Path(__file__).resolve().with_name("bundle_manifest.json")
DONE_MARK = ".bundle_sha256"


class StageError(Exception):
    """A bad part, manifest or site: reported in one line."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
        parts = {p["name"]: p for p in manifest["parts"]}
        manifest["archive_sha256"]  # noqa: B018 (presence check)
    except FileNotFoundError:
        raise StageError(f"manifest {path}: not found") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise StageError(f"manifest {path}: unreadable ({type(e).__name__}: {e})") from None
    manifest["by_name"] = parts
    return manifest


def check_part(path: Path, manifest: dict) -> None:
    entry = manifest["by_name"].get(path.name)
    if entry is None:
        known = ", ".join(manifest["by_name"])
        raise StageError(f"part {path}: not in the manifest (parts: {known})")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise StageError(f"part {path}: {size} bytes, manifest says {entry['bytes']}")
    digest = sha256_file(path)
    if digest != entry["sha256"]:
        raise StageError(
            f"part {path}: sha256 {digest[:16]}... != manifest {entry['sha256'][:16]}..."
        )


def copy_part(part: Path, stage: Path, manifest: dict) -> Path:
    """Copy one carried part into `stage` (checked before and after the copy)."""
    if not part.is_file():
        raise StageError(f"--part {part}: no such file (was it carried with this command?)")
    check_part(part, manifest)
    stage.mkdir(parents=True, exist_ok=True)
    dest = stage / part.name
    tmp = dest.with_suffix(".partial")
    shutil.copyfile(part, tmp)
    tmp.replace(dest)
    check_part(dest, manifest)
    return dest


class ChainedParts(io.RawIOBase):
    """The parts read back to back as one stream, hashed as they go."""

    def __init__(self, paths: list[Path]) -> None:
        self._files: Iterator[Path] = iter(paths)
        self._current = None
        self.sha = hashlib.sha256()
        self._next()

    def _next(self) -> None:
        if self._current is not None:
            self._current.close()
        path = next(self._files, None)
        self._current = None if path is None else open(path, "rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
        while self._current is not None:
            n = self._current.readinto(buf)
            if n:
                self.sha.update(memoryview(buf)[:n])
                return n
            self._next()
        return 0


def finish(stage: Path, site: Path, manifest: dict) -> str:
    """Check every staged part, extract the archive into `site`, check the whole sha256."""
    names = [p["name"] for p in manifest["parts"]]
    missing = [n for n in names if not (stage / n).is_file()]
    if missing:
        raise StageError(
            f"--stage {stage}: parts {missing} missing (copied more than ~30 s apart? "
            "run every part's command again, back to back)"
        )
    for name in names:
        check_part(stage / name, manifest)
    mark = site / DONE_MARK
    if mark.is_file() and mark.read_text().strip() == manifest["archive_sha256"]:
        return "already extracted"
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    stream = ChainedParts([stage / n for n in names])
    with tarfile.open(fileobj=io.BufferedReader(stream, 1 << 20), mode="r|xz") as tar:
        tar.extractall(site, filter="data")
    while stream.readinto(bytearray(1 << 20)):  # hash any bytes past the tar's end marker
        pass
    digest = stream.sha.hexdigest()
    if digest != manifest["archive_sha256"]:
        shutil.rmtree(site)
        raise StageError(f"archive sha256 {digest[:16]}... != manifest; {site} removed")
    mark.write_text(digest + "\n")
    return "extracted"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--part", type=Path, required=True)
    ap.add_argument("--stage", type=Path, required=True)
    ap.add_argument("--finish", action="store_true")
    ap.add_argument("--site", type=Path)
    ap.add_argument("--manifest", type=Path, default=MANIFEST)
    args = ap.parse_args()
    if args.finish and args.site is None:
        print("gpu_stage: --finish needs --site", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        manifest = load_manifest(args.manifest)
        dest = copy_part(args.part, args.stage, manifest)
        staged = sorted(p.name for p in args.stage.iterdir() if p.name in manifest["by_name"])
        print(f"gpu_stage: {dest} ok; staged {staged} of {len(manifest['parts'])}", flush=True)
        if args.finish:
            what = finish(args.stage, args.site, manifest)
            print(
                f"gpu_stage: {args.site} {what}, sha256 {manifest['archive_sha256'][:16]}... ok "
                f"({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
    except StageError as e:
        print(f"gpu_stage: {e}", file=sys.stderr)
        return 2
    except (OSError, tarfile.TarError, EOFError, lzma.LZMAError) as e:
        print(f"gpu_stage: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
