"""Atomic file writes: the one way Colibri writes anything a user keeps (converted models, dumps,
exports, sessions, autosaves, screenshots).

Write to a temporary file in the destination's directory, flush and fsync it, then `os.replace`
it over the target: a reader, or a crash, sees the old file or the new one, never half of one,
and an interrupted write leaves the previous file intact.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import IO


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> None:
    """Call `write(f)` on a temporary binary file (seekable), then rename it over `path`."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".colibri-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())  # the data is on disk before the name points at it
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_csv(path: str | os.PathLike[str], header: Sequence[str],
                     records: Iterable[Sequence[object]]) -> None:
    """A UTF-8 CSV file with a header row, written atomically."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(records)
    atomic_write_bytes(path, text.getvalue().encode("utf-8"))
