"""How a single token id reads as text, the same everywhere (CLI, debugger, jitter lab)."""

from __future__ import annotations

from typing import Any


def token_text(tokenizer: Any, token: int) -> str:
    """The text of `token` as a reader sees it: decoded on its own, so byte-level BPE pieces read
    " the" rather than "Ġthe"; the vocabulary piece when decoding yields nothing; the id as text
    when there is no tokenizer."""
    if tokenizer is None:
        return str(token)
    text = tokenizer.decode([int(token)])
    if text:
        return text
    piece = tokenizer.id_to_token(int(token))
    return piece if piece is not None else str(token)
