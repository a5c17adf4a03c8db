"""mkdocs hook: the site's home page is the README, so the front door has one source.

Its links into the site (`docs/page.md`) are rewritten to the page (`page.md`); everything else is
served as written. The README stays the repository's own front page on a code host."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS_LINK = re.compile(r"\]\(docs/")


def home_page_markdown(readme: str) -> str:
    """The README with its `docs/` links made relative to the docs folder."""
    return DOCS_LINK.sub("](", readme)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "index.md", content=home_page_markdown(README.read_text())))
    return files
