"""Byte sources and annotated regions for the hex view (Qt-free).

Owns the narrow interface the hexdump reads through (ImHex's provider, QHexView's buffer): a
`HexSource` answers `size()` and `read(offset, n)` and nothing else, so the view never knows
whether it shows a 40 GB mapping or eight bytes in a test. `MappedSource` reads the engine's
read-only mapping with no copy beyond the requested slice; `BytesSource` serves in-memory data;
`FileSource` reads any file with `os.pread` (a broken file the engine refuses to open, a sparse
test file). Reads are clamped at the end, so a view may ask for a full screen near the end.

It also owns the map of what each byte *is*: `regions_for(model)` lists header fields, routing
entries, tensor-table entries, tokenizer, metadata and every tensor's data range as `Region`s
(where each section lies comes from the engine, `Model.sections`; nothing is decoded here),
and `RegionIndex` finds the region under an offset (or those in a screenful) by bisection, so a
tooltip or a repaint costs O(log n) even for a million-tensor file.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import HeaderField, Model

from colibri.fileformat import TENSOR_ENTRY_SIZE, routing_entry_size

# Region kinds, in the order a legend shows them. Views colour by kind.
REGION_KINDS = ("header", "routing", "tensor_table", "tokenizer", "metadata", "tensor")


@runtime_checkable
class HexSource(Protocol):
    """What the hex view reads: a size and bounded reads, clamped at the end."""

    def size(self) -> int: ...

    def read(self, offset: int, n: int) -> bytes: ...


def _clamp(offset: int, n: int, size: int) -> tuple[int, int]:
    """[start, end) of a read of `n` bytes at `offset` inside [0, size)."""
    start = min(max(0, offset), size)
    return start, min(size, start + max(0, n))


class BytesSource:
    """An in-memory source (tests, small buffers)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = bytes(data)

    def size(self) -> int:
        return len(self._data)

    def read(self, offset: int, n: int) -> bytes:
        start, end = _clamp(offset, n, len(self._data))
        return self._data[start:end]


class MappedSource:
    """The whole mapped file of an open `Model`, through its zero-copy `Model.bytes()` view.
    Holds the model (and the view, which pins the mapping) for as long as the source lives."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._view: np.ndarray = model.bytes()

    @property
    def model(self) -> Model:
        return self._model

    def size(self) -> int:
        return int(self._view.shape[0])

    def read(self, offset: int, n: int) -> bytes:
        start, end = _clamp(offset, n, int(self._view.shape[0]))
        return self._view[start:end].tobytes()


class FileSource:
    """Any file on disk, read with positioned reads (no mapping, nothing validated). For files
    the engine refuses to open and for sparse test files."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        self._fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self._size = os.fstat(self._fd).st_size

    def size(self) -> int:
        return self._size

    def read(self, offset: int, n: int) -> bytes:
        start, end = _clamp(offset, n, self._size)
        if end <= start or self._fd < 0:
            return b""
        return os.pread(self._fd, end - start, start)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


@dataclass(frozen=True)
class Region:
    """A labelled byte range [start, start + length) of the file."""

    start: int
    length: int
    kind: str
    label: str

    @property
    def end(self) -> int:
        return self.start + self.length

    def contains(self, offset: int) -> bool:
        return self.start <= offset < self.start + self.length


def regions_for(model: Model, header_fields: list[HeaderField] | None = None) -> list[Region]:
    """Every annotated range of an open model, sorted by start: each fixed-header field, each
    routing entry, each tensor-table entry, the tokenizer and metadata sections, and each
    tensor's data. Ranges never overlap in a valid file. `header_fields`: the model's, when the
    caller already has them (`Model.header_fields()` otherwise)."""
    regions: list[Region] = []
    fields = model.header_fields() if header_fields is None else header_fields
    for f in fields:
        if not f.present:
            continue
        shown = f.value.hex(" ") if isinstance(f.value, bytes) and len(f.value) <= 8 else (
            "…" if isinstance(f.value, bytes) else f.value)
        regions.append(Region(f.offset, f.size, "header", f"header.{f.name} = {shown}"))
    hp = model.hparams
    sections = model.sections
    routing_offset = sections["routing"].offset
    entry = routing_entry_size(hp.version)
    for layer in range(hp.n_layers):
        info = model.routing(layer)
        regions.append(Region(routing_offset + layer * entry, entry,
                              "routing", f"routing[{layer}]: {info.kind}, top_k={info.top_k}"))
    for t in model.tensors:
        regions.append(Region(t.table_offset, TENSOR_ENTRY_SIZE, "tensor_table",
                              f"table[{t.index}]: {t.name}"))
        if t.nbytes:
            shape = "x".join(map(str, t.shape))
            regions.append(Region(t.offset, t.nbytes, "tensor", f"{t.name} {t.dtype} [{shape}]"))
    for name in ("tokenizer", "metadata"):
        section = sections[name]
        if section.size:
            regions.append(Region(section.offset, section.size, name, name))
    regions.sort(key=lambda r: (r.start, -r.length))
    return regions


class RegionIndex:
    """Regions sorted by start, with a running maximum of ends so overlapping regions (if any)
    are still found; `at` returns the innermost (shortest) region holding an offset."""

    def __init__(self, regions: list[Region]) -> None:
        self._regions = sorted(regions, key=lambda r: (r.start, -r.length))
        self._starts = [r.start for r in self._regions]
        self._max_end: list[int] = []
        running = -1
        for r in self._regions:
            running = max(running, r.end)
            self._max_end.append(running)

    def __len__(self) -> int:
        return len(self._regions)

    @property
    def regions(self) -> list[Region]:
        return list(self._regions)

    def at(self, offset: int) -> Region | None:
        best: Region | None = None
        i = bisect.bisect_right(self._starts, offset) - 1
        while i >= 0 and self._max_end[i] > offset:
            r = self._regions[i]
            if r.contains(offset) and (best is None or r.length < best.length):
                best = r
            i -= 1
        return best

    def in_range(self, start: int, end: int) -> list[Region]:
        """Regions intersecting [start, end), in start order."""
        if end <= start or not self._regions:
            return []
        first = bisect.bisect_right(self._starts, start) - 1
        while first >= 0 and self._max_end[first] > start:
            first -= 1
        first += 1
        out = []
        for i in range(first, len(self._regions)):
            r = self._regions[i]
            if r.start >= end:
                break
            if r.end > start:
                out.append(r)
        return out


__all__ = ["BytesSource", "FileSource", "HexSource", "MappedSource", "REGION_KINDS", "Region",
           "RegionIndex", "regions_for"]
