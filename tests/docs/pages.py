"""The documentation as tests read it: the README and every docs page, and the commands they
show (fenced and indented blocks, inline code), continuations joined, prompts and comments gone."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
INDENTED = re.compile(r"^ {4}(?! *[-*] )(.*)$", re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# The words a documented command starts with.
COMMAND_HEADS = ("cachepilot-sim", "python", "python3", "make")


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@dataclass(frozen=True)
class Command:
    page: Path
    text: str  # as written, continuations joined
    argv: tuple[str, ...]  # shell words, environment assignments before the command dropped
    refused: bool = False  # the page shows it stopping with a one-line error (the next line)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}: {self.text}"


def _words(text: str) -> tuple[str, ...] | None:
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote: not a command line
        return None
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]  # VAR=value cmd ...
    return tuple(words) if words and words[0] in COMMAND_HEADS else None


def _found(page: Path, block: str) -> list[Command]:
    lines = _lines(block)
    out = []
    for i, line in enumerate(lines):
        argv = _words(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if argv:
            out.append(Command(page, line, argv, refused=nxt.startswith("cachepilot_sim: ")))
    return out


def _lines(block: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        out.append(line)
    return out


def commands(page: Path) -> list[Command]:
    """Every command the page shows: each line of a shell or plain fenced block, and each inline
    code span, that starts with one of COMMAND_HEADS (a `VAR=value` prefix allowed)."""
    text = page.read_text()
    found: list[Command] = []
    for info, block in FENCE.findall(text):
        if info.strip() and info.split()[0] not in ("bash", "sh", "console", "shell", "text"):
            continue
        found += _found(page, block)
    prose = FENCE.sub("", text)
    found += _found(page, "\n".join(INDENTED.findall(prose)))  # 4-space code blocks
    for span in INLINE.findall(prose):
        argv = _words(span)
        if argv:
            found.append(Command(page, span, argv))
    return found
