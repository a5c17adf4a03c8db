"""docs/reliability.md's per-entry-point counts are the collected tests' (tests/badinput/counts.py):
a test added or removed without the page changing, or a test file no surface claims, fails."""

from __future__ import annotations

from tests.badinput.counts import ROOT, doc_block, per_file, table, unmapped


def test_the_reliability_page_counts_the_bad_input_tests_per_entry_point() -> None:
    counts = per_file()
    assert not unmapped(counts), f"add to tests/badinput/counts.py SURFACES: {unmapped(counts)}"
    page = (ROOT / "docs" / "reliability.md").read_text()
    assert doc_block(page) == table(counts), "run `python -m tests.badinput.counts` into the page"
