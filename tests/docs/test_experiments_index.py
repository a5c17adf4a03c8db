"""experiments/README.md is the index of the experiments (issue 32): it names every script and
every folder there, each file or folder it names exists, and each docs page it says reports a
result names that script or result."""

from __future__ import annotations

import re

from tests.docs.pages import ROOT

EXPERIMENTS = ROOT / "experiments"
INDEX = (EXPERIMENTS / "README.md").read_text()
NAMED = set(re.findall(r"`([^`\s]+)`", INDEX))


def test_the_index_names_every_script_and_folder() -> None:
    scripts = {p.name for p in EXPERIMENTS.glob("*.py")}
    folders = {p.name + "/" for p in EXPERIMENTS.iterdir() if p.is_dir() and p.name[0] != "_"}
    named = {n.split("/")[0] + ("/" if "/" in n else "") for n in NAMED}
    assert scripts - NAMED == set()
    assert folders - named == set()
    diagnostics = {p.name for p in (EXPERIMENTS / "diagnostics").glob("*.py")}
    assert diagnostics and diagnostics <= NAMED


def test_every_path_the_index_names_exists() -> None:
    missing = []
    for name in NAMED:
        if "*" in name or not re.search(r"\.(py|md|json|png|npz|patch|txt)$|/$", name):
            continue  # a glob, a command or an option
        # A row names its results relative to the script's folder (`admission/` files by name).
        candidates = [EXPERIMENTS / name, ROOT / name]
        if not any(p.exists() for p in candidates) and not any(EXPERIMENTS.rglob(name)):
            missing.append(name)
    assert missing == []


def test_each_row_is_reported_where_it_says() -> None:
    wrong = []
    for row in re.findall(r"^\| `([^`]+)`[^|]* \|[^|]*\|([^|]*)\| ([^|]*) \|$", INDEX, re.M):
        script, results, pages = row
        keys = {script.removesuffix(".py").split("/")[0]}
        keys |= {r.split("/")[0].removesuffix(".md") for r in re.findall(r"`([^`]+)`", results)}
        for page in re.findall(r"(docs/[\w]+\.md)|`([\w]+\.md)`", pages):
            path = ROOT / page[0] if page[0] else EXPERIMENTS / page[1]
            text = path.read_text()
            if not any(k in text for k in keys):
                wrong.append(f"{script}: {path.relative_to(ROOT)}")
    assert wrong == []
