"""A GGUF file's tokenizer as a Hugging Face `tokenizer.json`, built with the `tokenizers` library.

GGUF stores a vocabulary as arrays: `tokenizer.ggml.tokens`, `.token_type` (1 normal, 2 unknown,
3 control, 4 user-defined, 5 unused, 6 byte), `.scores` and, for byte-level BPE, `.merges`
("left right" strings), plus `tokenizer.ggml.model` and `.pre`:

* model "llama" is SentencePiece BPE with byte fallback (Llama, Mistral, Mixtral). llama.cpp
  merges the adjacent pair whose concatenation is a token with the highest score, so the merges
  are every (left, right) split of a normal token into two tokens, ranked by that token's score
  (then id), which is how transformers turns a SentencePiece model into a tokenizer.json; the
  pre-tokenizer is Metaspace ("▁" for spaces, one prepended when `add_space_prefix`, default
  on), the decoder undoes it.
* model "gpt2" is byte-level BPE with explicit merges; `pre` names the split regular expression
  (llama.cpp's llama-vocab.cpp); the ones known here are below, others fall back to GPT-2's with
  a note.

Control tokens become special added tokens, user-defined ones plain added tokens; a bos token
is prepended when `tokenizer.ggml.add_bos_token` says so, as llama.cpp does.
"""

from __future__ import annotations

from typing import Any

from colibri.formats.gguf_file import GGUFFile

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                 r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp pre-tokenizer names -> split regex, or regexes applied in turn (each isolating its
# matches), as llama-vocab.cpp has them (None: GPT-2's, through ByteLevel's own regex).
PRE_REGEX: dict[str, str | tuple[str, ...] | None] = {
    "default": None, "gpt-2": None, "gpt2": None, "olmo": None, "starcoder": None,
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "llama-bpe": _LLAMA3_REGEX,
    "glm4": _LLAMA3_REGEX,  # GLM-4.5's
    "deepseek-v3": (
        '\\p{N}{1,3}',
        '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L'
        '}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+'),
    "deepseek-llm": (  # DeepSeek-V2's
        '[\r\n]',
        '\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af'
        '\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1'
        '\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-'
        '\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15'
        '\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d'
        '\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb'
        '\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d'
        '\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e'
        '\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-'
        '\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17'
        '\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-'
        '\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-'
        '\U0001e943]+',
        '\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+',
        '\\s+$',
        '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
        '\\p{N}+'),
}
# Pre-tokenizers whose words found whole in the vocabulary are not merged further (llama.cpp's
# ignore_merges, as their tokenizer.json files say).
IGNORE_MERGES = ("llama-bpe", "glm4")


class TokenizerError(ValueError):
    """The GGUF vocabulary cannot be expressed as a tokenizer.json (the message says why)."""


def _added(token_id: int, content: str, special: bool) -> dict[str, Any]:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": not special, "special": special}


def tokenizer_json(f: GGUFFile, notes: list[str]) -> str | None:
    """The tokenizer.json text for `f`'s vocabulary, or None when the file has none. Appends to
    `notes` anything approximated. Raises TokenizerError for an inconsistent vocabulary."""
    from tokenizers import Tokenizer

    model = f.get("tokenizer.ggml.model")
    if model is None or model == "none":
        return None
    tokens = f.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
    types = f.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise TokenizerError(f"{len(types)} token types for {len(tokens)} tokens")
    if model == "llama":
        doc = _spm(f, tokens, types)
    elif model == "gpt2":
        doc = _bpe(f, tokens, types, notes)
    else:
        raise TokenizerError(f"tokenizer model {model!r} not supported (supported: llama, gpt2)")
    bos = f.get("tokenizer.ggml.bos_token_id")
    add_bos = f.get("tokenizer.ggml.add_bos_token", model == "llama")
    if add_bos and isinstance(bos, int) and 0 <= bos < len(tokens):
        name = tokens[bos]
        doc["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": name, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": name, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": name, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {name: {"id": name, "ids": [bos], "tokens": [name]}}}
    import json
    text = json.dumps(doc, ensure_ascii=False)
    try:
        Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception
        raise TokenizerError(f"the vocabulary does not make a loadable tokenizer: {exc}") from exc
    return text


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate token text keeps its first id
    return vocab


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    return [_added(i, t, ty in (CONTROL, UNKNOWN)) for i, (t, ty) in enumerate(zip(tokens, types))
            if ty in (CONTROL, USER_DEFINED, UNKNOWN)]


def _spm(f: GGUFFile, tokens: list[str], types: list[int]) -> dict[str, Any]:
    scores = f.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    if len(scores) != len(tokens):
        raise TokenizerError(f"{len(scores)} scores for {len(tokens)} tokens")
    vocab = _vocab(tokens)
    mergeable = {t for t, ty in zip(tokens, types) if ty in (NORMAL, USER_DEFINED)}
    ranked = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty != NORMAL or len(t) < 2:
            continue
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-float(scores[i]), i, len(left), len(right), left, right))
    ranked.sort()
    unk = f.get("tokenizer.ggml.unknown_token_id")
    prefix = f.get("tokenizer.ggml.add_space_prefix", True)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first" if prefix else "never", "split": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            *([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])]},
        "model": {"type": "BPE", "dropout": None,
                  "unk_token": tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens)
                  else None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": BYTE in types, "ignore_merges": False,
                  "vocab": vocab, "merges": [[r[4], r[5]] for r in ranked]},
    }


def _bpe(f: GGUFFile, tokens: list[str], types: list[int], notes: list[str]) -> dict[str, Any]:
    merges = f.get("tokenizer.ggml.merges") or []
    pairs = []
    for i, m in enumerate(merges):
        parts = m.split(" ") if isinstance(m, str) else []
        if len(parts) != 2:
            raise TokenizerError(f"tokenizer.ggml.merges[{i}] = {m!r} is not 'left right'")
        pairs.append(parts)
    pre = f.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_REGEX:
        notes.append(f"tokenizer: pre-tokenizer {pre!r} not known here; GPT-2's split used")
    regex = PRE_REGEX.get(pre)
    if regex is None:
        pre_tokenizer: dict[str, Any] = {"type": "ByteLevel", "add_prefix_space": False,
                                         "trim_offsets": True, "use_regex": True}
    else:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            *({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated",
               "invert": False} for r in ((regex,) if isinstance(regex, str) else regex)),
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": None, "pre_tokenizer": pre_tokenizer, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": pre in IGNORE_MERGES,
                  "vocab": _vocab(tokens), "merges": pairs},
    }


__all__ = ["TokenizerError", "tokenizer_json"]
