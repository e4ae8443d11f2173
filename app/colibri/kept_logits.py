"""Logit rows kept in a file instead of the process's memory.

A run that keeps every position's logits (the Debugger's: a counterfactual compares them) holds
positions x vocabulary float32: 600 KB a position at a 150k vocabulary, 2.4 GB for 4,000
positions, beside a model that wants the same memory for its pages. `LogitFile` writes each
engine call's rows into an unnamed temporary file mapped shared, and hands back read-only views
of them: the rows live in the page cache, which the kernel writes back and drops under memory
pressure, where anonymous memory without swap could only grow. The file is unlinked at creation,
so nothing is left behind whatever ends the process. Its space is allocated before it is mapped
(a full disk would otherwise kill the process with SIGBUS at the first write to a page it
cannot hold); where that fails, the rows stay in memory as before.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


class LogitFile:
    """Rows of positions 0.. of one run ([vocab] float32 each), in a file that grows by doubling.
    `keep(first, rows)` writes positions first.. (over any written before: a rewound run's) and
    returns a read-only view of them, valid until those positions are written again; `slot`
    hands out the writable view for the engine to write into directly. Views taken
    before a growth stay valid (each keeps its own mapping of the same file). When the file
    cannot grow (no space), `keep` returns read-only copies in memory from then on and
    `in_memory` says so. One thread."""

    def __init__(self, vocab: int, *, directory: str | None = None,
                 initial_rows: int = 256) -> None:
        if vocab < 1 or initial_rows < 1:
            raise ValueError(f"vocab and initial_rows must be >= 1, got {vocab}, {initial_rows}")
        self.vocab = vocab
        self._initial = initial_rows
        self._file = tempfile.TemporaryFile(dir=directory)
        self._map: np.memmap | None = None
        self._capacity = 0   # rows the file and the current mapping hold
        self.in_memory = False

    @property
    def capacity(self) -> int:
        return self._capacity

    def slot(self, first: int, n: int) -> np.ndarray | None:
        """A writable view of positions first..first + n - 1 in the file, for the engine to
        write the logits into (then `sealed`); None when the rows are kept in memory."""
        if first < 0 or n < 0:
            raise ValueError(f"positions must be >= 0, got first {first}, n {n}")
        stop = first + n
        if stop > self._capacity and not self.in_memory:
            capacity = max(stop, 2 * self._capacity, self._initial)
            try:
                os.posix_fallocate(self._file.fileno(), 0, capacity * self.vocab * 4)
            except OSError:
                self.in_memory = True
            else:
                self._map = np.memmap(self._file, dtype=np.float32, mode="r+",
                                      shape=(capacity, self.vocab))
                self._capacity = capacity
        if self.in_memory:
            return None
        assert self._map is not None
        return self._map[first:stop]

    @staticmethod
    def sealed(view: np.ndarray) -> np.ndarray:
        """A read-only view of the same rows."""
        out = view.view()
        out.flags.writeable = False
        return out

    def keep(self, first: int, rows: np.ndarray) -> np.ndarray:
        """Write `rows` ([n, vocab] float32) as positions first..first + n - 1; their view."""
        if rows.ndim != 2 or rows.shape[1] != self.vocab:
            raise ValueError(f"expected rows of {self.vocab} logits, got shape {rows.shape}")
        view = self.slot(first, rows.shape[0])
        if view is None:
            copy = np.array(rows, dtype=np.float32)
            copy.flags.writeable = False
            return copy
        view[...] = rows
        return self.sealed(view)

    def close(self) -> None:
        """Drop this object's mapping and file handle; views still held keep their mappings."""
        self._map = None
        self._file.close()
