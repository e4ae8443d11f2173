"""Token ids as people read and write them, the same everywhere (CLI, debugger, jitter lab): one
parser of comma-separated ids and one way a single id reads as text."""

from __future__ import annotations

import re
from typing import Any

_ID = re.compile(r"-?[0-9]+")
EMBEDDING_TEXT = "<embedding>"   # a position fed an embedding row instead of a token (id -1)


def parse_token_ids(text: str) -> list[int]:
    """'3, 4,5' -> [3, 4, 5]: decimal ids separated by commas, spaces around them and empty items
    ignored. Raises ValueError naming the text for anything else. Only the form is checked: the
    engine judges whether an id is in the vocabulary."""
    parts = [part.strip() for part in text.split(",")]
    if not all(_ID.fullmatch(part) for part in parts if part):
        raise ValueError(f"expected comma-separated token ids, got {text!r}")
    return [int(part) for part in parts if part]


def token_text(tokenizer: Any, token: int) -> str:
    """The text of `token` as a reader sees it: decoded on its own, so byte-level BPE pieces read
    " the" rather than "Ġthe"; the vocabulary piece when decoding yields nothing; the id as text
    when there is no tokenizer; `<embedding>` for a position fed an embedding row (token -1)."""
    if token < 0:
        return EMBEDDING_TEXT
    if tokenizer is None:
        return str(token)
    text = tokenizer.decode([int(token)])
    if text:
        return text
    piece = tokenizer.id_to_token(int(token))
    return piece if piece is not None else str(token)
