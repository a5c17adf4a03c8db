"""The package as a user installs it: a wheel built from this checkout, installed (not editable)
into a fresh virtual environment that holds nothing else but the distributions that the wheel's
`Requires-Dist` names, and theirs, in turn (linked from the environment running the tests, so no
package index is needed and nothing is downloaded). A module that the package imports without
declaring it, or a file that it reads from the checkout rather than from its package data, fails
there as it would for a user."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def user_env(**extra: str) -> dict[str, str]:
    """The environment with no way back to the checkout: no PYTHONPATH, no traces folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CACHEPILOT_TRACES_DIR")}
    return {**env, **extra}


def build_wheel(out: Path) -> Path:
    """`pip wheel` of the checkout (no dependencies, the running environment's setuptools)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (wheel,) = out.glob("cachepilot_sim-*.whl")
    return wheel


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's `Requires-Dist` lines (extras' requirements included; markers say which)."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []


def dependency_closure(requirements: list[str]) -> list[Distribution]:
    """The installed distributions that a plain install (no extras) of `requirements` pulls in:
    each requirement whose marker holds, then their own requirements (with the extras asked
    for), transitively."""
    todo = [(r, frozenset[str]()) for r in requirements]
    found: dict[str, Distribution] = {}
    while todo:
        text, extras = todo.pop()
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            found[name] = distribution(req.name)
        except PackageNotFoundError as err:
            raise AssertionError(f"{req.name} is required but not installed here") from err
        todo += [(r, frozenset(req.extras)) for r in found[name].requires or []]
    return [found[n] for n in sorted(found)]


def link_distributions(dists: list[Distribution], site: Path) -> None:
    """Link each distribution's top-level modules, packages and metadata into `site`."""
    for dist in dists:
        for top in sorted({f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}):
            source = Path(str(dist.locate_file(top)))
            if top != "__pycache__" and source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)


def install(venv: Path, wheel_dir: Path) -> Path:
    """A fresh venv at `venv` with the wheel and its dependency closure; returns its bin/."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheel = build_wheel(wheel_dir)
    # Run from the venv with user_env: the checkout on sys.path would look installed already.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         str(wheel)],
        check=True, capture_output=True, text=True, timeout=600, cwd=venv, env=user_env(),
    )  # fmt: skip
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True, cwd=venv, env=user_env(),
    ).stdout.strip()  # fmt: skip
    deps = venv / "deps"
    deps.mkdir()
    link_distributions(dependency_closure(wheel_requirements(wheel)), deps)
    (Path(purelib) / "dependencies.pth").write_text(f"{deps}\n")
    return venv / "bin"
