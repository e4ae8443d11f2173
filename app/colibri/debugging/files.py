"""Atomic file writes for every debugger output (trace JSON, CSV, session files, autosave).

Write to a temporary file in the destination's directory, flush and fsync it, then `os.replace`
it over the target: a reader (or a crash) sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> None:
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".colibri-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
