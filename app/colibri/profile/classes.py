"""Token classes: what kind of text each token id stands for, so routing can be read as "this
expert takes digits" rather than as a list of ids.

A token's class comes from its text as a reader sees it (`colibri.tokens.token_text`), leading
and trailing whitespace set aside:
  special      a special token of the tokenizer (e.g. end of text);
  whitespace   nothing but spaces, tabs and newlines;
  keyword      a keyword of a common programming language (Python, C and C++, Java, JavaScript,
               Go, Rust), compared case-sensitively;
  digits       only decimal digits;
  letters      only letters (any script);
  punctuation  no letter and no digit (operators, brackets, quotes, symbols);
  other        a mix (identifiers with underscores, letters and digits, ' x=') or a piece of a
               multi-byte character that does not decode on its own.
"""

from __future__ import annotations

import keyword
from typing import Any

import numpy as np

from colibri.tokens import token_text

CLASS_NAMES = ("letters", "digits", "punctuation", "whitespace", "keyword", "other", "special")

KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) - {"_"} | frozenset("""
    auto break case catch char const continue default delete do double else enum extern float
    for goto if inline int long namespace new private protected public register return short
    signed sizeof static struct switch template this throw try typedef union unsigned using
    virtual void volatile while abstract boolean byte extends final finally implements import
    instanceof interface native package super synchronized throws transient function let var
    typeof undefined null func go chan defer map range select type fallthrough fn impl mut pub
    crate mod trait use where loop match ref self Self unsafe async await dyn move
    """.split())


def classify(text: str, special: bool = False) -> int:
    """The index in CLASS_NAMES of a token whose text is `text`."""
    if special:
        return CLASS_NAMES.index("special")
    core = text.strip()
    if not core:
        return CLASS_NAMES.index("whitespace")
    if "\ufffd" in core:
        return CLASS_NAMES.index("other")
    if core in KEYWORDS:
        return CLASS_NAMES.index("keyword")
    if core.isdecimal():
        return CLASS_NAMES.index("digits")
    if core.isalpha():
        return CLASS_NAMES.index("letters")
    if not any(c.isalnum() for c in core):
        return CLASS_NAMES.index("punctuation")
    return CLASS_NAMES.index("other")


def special_ids(tokenizer: Any) -> set[int]:
    if tokenizer is None:
        return set()
    return {int(i) for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}


def token_classes(tokenizer: Any, ids: np.ndarray) -> np.ndarray:
    """int8 class index of each token id in `ids` (see the module docstring)."""
    special = special_ids(tokenizer)
    return np.array([classify(token_text(tokenizer, int(t)), int(t) in special) for t in ids],
                    dtype=np.int8)
