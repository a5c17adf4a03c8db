"""The README is a front door (issue 32): at most 300 lines, its sections in order, every result one
line with a link to the page that holds it; and the two things it says about trust are what the
committed files give: the validation table is experiments/validation/hf_cb/2026-12-01/errors.json
(every page that shows it), and each trust label is the one cachepilot_sim/trust.py prints."""

from __future__ import annotations

import json
import re

import pytest
from hydra import compose, initialize_config_dir

from cachepilot_sim.conf import CONF_DIR
from cachepilot_sim.config import register_configs, to_config
from cachepilot_sim.trust import engine_label, trust_for
from tests.docs.pages import DOCS, ROOT, pages

README = (ROOT / "README.md").read_text()
ERRORS = ROOT / "experiments/validation/hf_cb/2026-12-01/errors.json"
SECTIONS = ["Two commands", "5-minute tour", "How far to trust it", "Results, one line each",
            "Where to go"]  # fmt: skip
# The validation table's columns after workload and requests: the errors.json key of each cell.
ERROR_COLUMNS = ["ttft_mean_err", "ttft_p99_err", "tpot_mean_err", "tpot_p99_err", "itl_mean_err",
                 "itl_p99_err", "e2e_mean_err", "e2e_p99_err", "throughput_err"]  # fmt: skip
VALIDATION_HEADER = "| workload | req. | TTFT mean | TTFT p99 | TPOT mean |"

register_configs()


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end > 0 else None]


def test_the_readme_is_a_front_door_of_at_most_300_lines() -> None:
    assert len(README.splitlines()) <= 300
    heads = re.findall(r"^## (.+)$", README, re.M)
    assert heads == SECTIONS


def test_every_result_is_one_line_with_a_link_to_a_docs_page() -> None:
    items = re.split(r"\n- ", section("Results, one line each"))[1:]
    assert len(items) >= 10
    for item in items:
        links = re.findall(r"\]\(docs/([\w.]+\.md)", item)
        assert links, item
        assert all((DOCS / link).is_file() for link in links), item
    linked = set(re.findall(r"\]\(docs/([\w.]+\.md)", README))
    assert {p.name for p in DOCS.glob("*.md")} <= linked  # "where to go" reaches every page


def test_every_number_of_a_result_line_is_stated_on_the_page_it_links() -> None:
    """The front door states no figure of its own: each is copied from the page holding the
    command that produced it."""
    for item in re.split(r"\n- ", section("Results, one line each"))[1:]:
        pages = re.findall(r"\]\(docs/([\w.]+\.md)", item)
        text = "".join((DOCS / page).read_text() for page in pages)
        body = re.sub(r"\]\([^)]*\)", "]", item)  # the link targets are not figures
        numbers = re.findall(r"\d[\d,.]*\d|\d", body)
        assert numbers, item
        assert [n for n in numbers if n not in text] == [], item


def _percent(fraction: float) -> str:
    return f"{100 * fraction:+.1f}%"


def expected_rows() -> dict[str, str]:
    workloads = json.loads(ERRORS.read_text())["workloads"]
    rows = {}
    for name, w in workloads.items():
        cells = [f"`{name}`", str(w["requests"])]
        cells += [f"{_percent(w[c])} ({_percent(w['spread'][c])})" for c in ERROR_COLUMNS]
        cells += [f"{w['preemptions_sim']}/{w['preemptions_real']}", f"{100 * w['e2e_mape']:.1f}%"]
        rows[name] = "| " + " | ".join(cells) + " |"
    return rows


TABLE_PAGES = [p for p in pages() if VALIDATION_HEADER in p.read_text()]


def test_the_validation_table_is_shown_on_the_readme_and_its_page() -> None:
    assert {p.name for p in TABLE_PAGES} == {"README.md", "real_engine.md"}


@pytest.mark.parametrize("page", TABLE_PAGES, ids=lambda p: p.name)
def test_the_validation_table_is_the_committed_errors_json(page) -> None:  # noqa: ANN001
    text = page.read_text()
    table = text[text.index(VALIDATION_HEADER) :].split("\n\n")[0].splitlines()[2:]
    assert table == list(expected_rows().values())


TRUST_ROW = re.compile(r"^\| (`[^`]+`)(?: \([^)]*\))? \| (\w+) \| `([^`]+)` \|$", re.M)


def test_every_trust_label_in_the_readme_is_what_trust_py_prints() -> None:
    rows = TRUST_ROW.findall(section("How far to trust it"))
    assert {kind for _, kind, _ in rows} == {"measured", "transferred", "unvalidated"}
    for run, kind, label in rows:
        overrides = run.strip("`").split() if run.startswith("`") else []
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            t = trust_for(to_config(compose(config_name="config", overrides=overrides)))
        assert (str(t.kind), engine_label(t)) == (kind, label), run
