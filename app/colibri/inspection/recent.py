"""The recent-files list: most recent first, no duplicates, bounded, paths made absolute.

Pure logic so it is testable without Qt; the main window persists `paths` in QSettings (a list
of strings) and rebuilds its Open Recent menu from it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

DEFAULT_LIMIT = 10


class RecentFiles:
    """An ordered list of file paths, most recent first, at most `limit` long."""

    def __init__(self, paths: Iterable[object] = (), limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._paths: list[str] = []
        # Oldest first so that add() leaves the given order intact; ignore junk from settings.
        for p in reversed([p for p in paths if isinstance(p, str) and p]):
            self.add(p)

    @staticmethod
    def _norm(path: str | os.PathLike[str]) -> str:
        return os.path.abspath(os.fspath(path))

    @property
    def paths(self) -> list[str]:
        return list(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._paths))

    def __contains__(self, path: object) -> bool:
        return isinstance(path, (str, os.PathLike)) and self._norm(path) in self._paths

    def add(self, path: str | os.PathLike[str]) -> None:
        """Put `path` first (moving it if already listed) and drop the oldest beyond the limit."""
        p = self._norm(path)
        if p in self._paths:
            self._paths.remove(p)
        self._paths.insert(0, p)
        del self._paths[self.limit:]

    def remove(self, path: str | os.PathLike[str]) -> None:
        p = self._norm(path)
        if p in self._paths:
            self._paths.remove(p)

    def clear(self) -> None:
        self._paths.clear()

    def existing(self) -> list[str]:
        """The listed paths that still exist (the menu shows only these)."""
        return [p for p in self._paths if os.path.exists(p)]
