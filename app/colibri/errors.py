"""The exceptions of the Python binding, and the one function that maps C status codes to them.

Errors are values in C (`col_status`, 0 = OK) and exceptions here. Every wrapper in `engine.py`
hands a non-zero status to `raise_for_status`, which picks the class from the code alone:

    COL_ERR_IO                                  -> ColibriIOError      (also an OSError)
    COL_ERR_FILE_CHANGED                        -> ColibriFileChangedError (an IOError: reopen)
    COL_ERR_NOMEM                               -> ColibriMemoryError  (also a MemoryError)
    COL_ERR_INVALID_ARG, CONTEXT_FULL, BAD_TOKEN -> ColibriValueError   (also a ValueError)
    every file-format code (TRUNCATED..ROUTING, UNKNOWN_TENSOR) -> ColibriFormatError
    anything else                               -> ColibriError

This module is pure Python: it imports the compiled extension only to name a code, and falls back
to `COL_STATUS_<n>` without it, so `colibri.errors` is importable before the engine is built.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from colibri.engine import Problem

# The col_status values the mapping needs (colibri.h; append-only, so safe to restate).
COL_OK = 0
COL_ERR_IO = 1
COL_ERR_NOMEM = 2
COL_ERR_INVALID_ARG = 3
COL_ERR_TRUNCATED = 4
COL_ERR_ROUTING = 21
COL_ERR_CONTEXT_FULL = 22
COL_ERR_BAD_TOKEN = 23
COL_ERR_UNKNOWN_TENSOR = 24
COL_ERR_FILE_CHANGED = 25

_FORMAT_CODES = frozenset(range(COL_ERR_TRUNCATED, COL_ERR_ROUTING + 1)) | {COL_ERR_UNKNOWN_TENSOR}
_VALUE_CODES = frozenset({COL_ERR_INVALID_ARG, COL_ERR_CONTEXT_FULL, COL_ERR_BAD_TOKEN})


@functools.cache
def status_name(code: int) -> str:
    """`"COL_ERR_SHAPE"` for 15; taken from the engine's enum, `COL_STATUS_<n>` if unknown."""
    try:
        from colibri._colibri_cffi import ffi
    except ImportError:
        return f"COL_STATUS_{code}"
    name = ffi.typeof("col_status").elements.get(code)
    return name if name is not None else f"COL_STATUS_{code}"


class ColibriError(Exception):
    """Any failure reported by the engine. `code` is the col_status value, `code_name` its name."""

    def __init__(self, message: str, code: int = COL_ERR_INVALID_ARG) -> None:
        super().__init__(message)
        self.code: int = code
        self.code_name: str = status_name(code)
        self.message: str = message

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"


class ColibriFormatError(ColibriError):
    """The file breaks docs/format.md. `offset` is the absolute byte offset concerned, `tensor`
    the tensor's name ("" when none applies), `problems` every finding known (may be just one)."""

    def __init__(self, message: str, code: int, offset: int = 0, tensor: str = "",
                 problems: Sequence[Problem] = ()) -> None:
        super().__init__(message, code)
        self.offset: int = offset
        self.tensor: str = tensor
        self.problems: list[Problem] = list(problems)

    def __str__(self) -> str:
        where = f" (tensor '{self.tensor}')" if self.tensor else ""
        return f"{self.code_name} at 0x{self.offset:X}{where}: {self.message}"


class ColibriIOError(ColibriError, OSError):
    """The file cannot be opened, read or mapped."""


class ColibriFileChangedError(ColibriIOError):
    """The mapped file was truncated or rewritten while open. Nothing read from it after the
    change was used; close the model and reopen the path (the Inspector offers to)."""


class ColibriMemoryError(ColibriError, MemoryError):
    """The engine could not allocate what it needed."""


class ColibriValueError(ColibriError, ValueError):
    """An argument the engine refuses: bad token id, full context, bad configuration."""


def raise_for_status(status: int, message: str = "", *, offset: int = 0, tensor: str = "",
                     problems: Sequence[Problem] = ()) -> None:
    """Return quietly for COL_OK; otherwise raise the ColibriError subclass for `status`.
    `offset`, `tensor` and `problems` only matter for format errors."""
    if status == COL_OK:
        return
    _raise(status, message or status_name(status), offset, tensor, problems)


def _raise(status: int, message: str, offset: int, tensor: str,
           problems: Sequence[Problem]) -> NoReturn:
    if status in _FORMAT_CODES:
        raise ColibriFormatError(message, status, offset, tensor, problems)
    if status == COL_ERR_IO:
        raise ColibriIOError(message, status)
    if status == COL_ERR_FILE_CHANGED:
        raise ColibriFileChangedError(message, status)
    if status == COL_ERR_NOMEM:
        raise ColibriMemoryError(message, status)
    if status in _VALUE_CODES:
        raise ColibriValueError(message, status)
    raise ColibriError(message, status)
