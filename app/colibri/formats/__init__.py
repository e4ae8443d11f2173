"""The model files users already have: GGUF and safetensors, beside Colibri's own `.colibri`.

`detect(path)` names a file's format from its content (never its extension; only a file named
`*.safetensors.index.json` without another format's magic is an index, broken or not);
`validate(path)` and `open_file(path)` dispatch on it. Each format's validator judges the raw
bytes first (`gguf_file.walk`, `safetensors_file.validate_header`, with the problem model of
`.colibri`); only a file without errors is read. docs/formats.md lists every check and its
status code.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Literal

from colibri.engine import Problem
from colibri.errors import ColibriFormatError, ColibriIOError

Format = Literal["colibri", "gguf", "safetensors"]

_IO = 1  # COL_ERR_IO


def detect(path: str | os.PathLike[str]) -> Format | None:
    """'colibri', 'gguf' or 'safetensors' (a .safetensors file, a shard index or a checkpoint
    directory) from the content of `path`; None when it is none of them. Reads at most 16
    bytes (an index: its JSON). Raises ColibriIOError when `path` cannot be read."""
    path = os.fspath(path)
    if os.path.isdir(path):
        try:
            names = os.listdir(path)
        except OSError as exc:
            raise ColibriIOError(f"{path}: cannot list: {exc.strerror}", _IO) from exc
        if any(n.endswith(".safetensors") for n in names) or (
                "model.safetensors.index.json" in names):
            return "safetensors"
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise ColibriIOError(f"{path}: cannot read: {exc.strerror}", _IO) from exc
    if head.startswith(b"COLI"):
        return "colibri"
    if head.startswith(b"GGUF"):
        return "gguf"
    if len(head) >= 9:
        (n,) = struct.unpack_from("<Q", head, 0)
        if n >= 2 and head[8:9] == b"{":  # a truncated file still says what it is
            return "safetensors"
    if path.endswith(".safetensors.index.json"):
        return "safetensors"  # a broken index is still one: its validator says what broke
    if head.lstrip()[:1] == b"{" and size < 64 << 20:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError, RecursionError):
            return None
        if isinstance(doc, dict) and isinstance(doc.get("weight_map"), dict):
            return "safetensors"
    return None


def _unreadable(path: str) -> str | None:
    if not os.path.exists(path):
        return f"{path}: no such file"
    if not os.access(path, os.R_OK):
        return f"{path}: permission denied"
    return None


def validate(path: str | os.PathLike[str], checksums: bool = False, nan_check: bool = False,
             ) -> tuple[Format | None, list[Problem]]:
    """(format, every problem) for any of the three formats. A file of no known format gives
    (None, [the .colibri validator's BAD_MAGIC finding]). The data checks read every tensor.
    Raises ColibriIOError when the path cannot be read."""
    from colibri import engine
    from colibri.formats import gguf_file, safetensors_file

    path = os.fspath(path)
    reason = _unreadable(path)
    if reason is not None:
        raise ColibriIOError(reason, _IO)
    fmt = detect(path)
    if fmt in ("gguf", "safetensors"):
        reader = gguf_file.GGUFFile if fmt == "gguf" else safetensors_file.Checkpoint
        try:
            f = reader.open(path)  # one walk: the problems of a valid file, or the error
        except ColibriFormatError as exc:
            return fmt, list(exc.problems)
        problems = f.problems
        if checksums or nan_check:
            problems += f.scan(checksums, nan_check).problems
        return fmt, problems
    if os.path.isdir(path):
        raise ColibriIOError(f"{path}: a directory without *.safetensors files", _IO)
    return fmt, engine.validate(path, checksums=checksums, nan_check=nan_check)


def open_file(path: str | os.PathLike[str]) -> Any:
    """The validated reader for `path`: `engine.Model` (.colibri), `gguf_file.GGUFFile` or
    `safetensors_file.Checkpoint`. Raises ColibriIOError / ColibriFormatError."""
    from colibri import engine
    from colibri.formats import gguf_file, safetensors_file

    path = os.fspath(path)
    reason = _unreadable(path)
    if reason is not None:
        raise ColibriIOError(reason, _IO)
    fmt = detect(path)
    if fmt == "gguf":
        return gguf_file.GGUFFile.open(path)
    if fmt == "safetensors":
        return safetensors_file.Checkpoint.open(path)
    if os.path.isdir(path):
        raise ColibriIOError(f"{path}: a directory without *.safetensors files", _IO)
    return engine.Model.open(path)


__all__ = ["Format", "detect", "open_file", "validate"]
