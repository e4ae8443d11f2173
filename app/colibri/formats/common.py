"""What the foreign-format readers share: findings, tensor entries, the file mapping, data scans.

The GGUF and safetensors readers judge raw bytes with the same problem model as `.colibri`
(`colibri.engine.Problem`: status code, severity, absolute byte offset, tensor, plain message)
and the engine's own status codes (colibri.h; docs/formats.md says which check gives which).
A reader opens a file in two steps: its validator walks the header with bounds-checked parsing
and never raises for bad bytes; only a file without errors is then handed to the libraries
(`gguf`, `safetensors`), which are not written for hostile input.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from colibri import errors
from colibri.engine import Problem, lib
from colibri.errors import ColibriFormatError, ColibriIOError

# The engine's status codes the readers report (colibri.h; append-only).
IO = int(lib.COL_ERR_IO)
TRUNCATED = int(lib.COL_ERR_TRUNCATED)
BAD_MAGIC = int(lib.COL_ERR_BAD_MAGIC)
BAD_VERSION = int(lib.COL_ERR_BAD_VERSION)
LIMIT = int(lib.COL_ERR_LIMIT)
HEADER = int(lib.COL_ERR_HEADER)
SECTION_BOUNDS = int(lib.COL_ERR_SECTION_BOUNDS)
TENSOR_BOUNDS = int(lib.COL_ERR_TENSOR_BOUNDS)
MISALIGNED = int(lib.COL_ERR_MISALIGNED)
SIZE_MISMATCH = int(lib.COL_ERR_SIZE_MISMATCH)
OVERLAP = int(lib.COL_ERR_OVERLAP)
MISSING_TENSOR = int(lib.COL_ERR_MISSING_TENSOR)
SHAPE = int(lib.COL_ERR_SHAPE)
DTYPE = int(lib.COL_ERR_DTYPE)
NAME = int(lib.COL_ERR_NAME)
NONFINITE = int(lib.COL_ERR_NONFINITE)
UNSUPPORTED = int(lib.COL_ERR_UNSUPPORTED)
UNKNOWN_TENSOR = int(lib.COL_ERR_UNKNOWN_TENSOR)

MAX_PROBLEMS = 1000  # a hostile file may have millions of broken entries; report the first ones


class Findings:
    """Problems collected during a walk, in the order found (errors and warnings together)."""

    def __init__(self) -> None:
        self.items: list[Problem] = []
        self.dropped = 0

    def add(self, severity: Literal["error", "warning"], code: int, offset: int, message: str,
            tensor: str = "") -> None:
        if len(self.items) >= MAX_PROBLEMS:
            self.dropped += 1
            return
        # the tensor is a field of its own, shown beside the message (as engine.Problem does)
        message = message.removeprefix(f"tensor '{tensor}': ") if tensor else message
        self.items.append(Problem(code, errors.status_name(code), severity, int(offset), tensor,
                                  message))

    def error(self, code: int, offset: int, message: str, tensor: str = "") -> None:
        self.add("error", code, offset, message, tensor)

    def warning(self, code: int, offset: int, message: str, tensor: str = "") -> None:
        self.add("warning", code, offset, message, tensor)

    @property
    def has_errors(self) -> bool:
        return any(p.severity == "error" for p in self.items)

    def result(self) -> list[Problem]:
        if self.dropped:
            last = self.items[-1]
            return self.items + [Problem(LIMIT, errors.status_name(LIMIT), "warning", last.offset,
                                         "", f"{self.dropped} more problem(s) not listed")]
        return list(self.items)


def raise_first_error(path: str, problems: list[Problem]) -> None:
    """Raise ColibriFormatError for the first error of `problems` (all of them attached)."""
    first = next(p for p in problems if p.severity == "error")
    raise ColibriFormatError(f"{path}: {first.message}", first.code, first.offset, first.tensor,
                             problems)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a foreign file. `dtype` is the format's own name (GGUF 'Q4_K', 'F32';
    safetensors 'BF16'); `shape` is row-major, outermost first (numpy order; a GGUF file stores
    it innermost first as `ne`); `offset` is absolute in `path`; `info_offset` is where the
    tensor's header entry starts (GGUF tensor info; the safetensors JSON header)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    path: str = ""
    info_offset: int = 0
    block_size: int = 1    # elements per block along the last dimension (1: plain dtype)
    type_size: int = 0     # bytes per block

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (the last dimension)."""
        last = self.shape[-1] if self.shape else 1
        return last // self.block_size * self.type_size

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "offset": self.offset, "nbytes": self.nbytes}


MAX_ARRAY_BYTES = (1 << 63) - 1  # numpy's bound on size x itemsize, zero dimensions skipped


def unholdable_shape(shape: Iterable[int]) -> bool:
    """True when no array of `shape` can exist, not even an empty one (numpy refuses non-zero
    dimensions whose product, times 8 bytes, passes 2^63), so a reader could not return it."""
    product = 8
    for d in shape:
        if d:
            product *= d
    return product > MAX_ARRAY_BYTES


class Mapping:
    """A read-only mapping of a whole file; views over it are numpy arrays with no copy. An
    empty file has no mapping (mmap refuses size 0) and reads as empty."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise ColibriIOError(f"{path}: cannot open: {exc.strerror}", IO) from exc
        try:
            st = os.fstat(fd)
            self.size = int(st.st_size)
            self.identity = (self.size, int(st.st_mtime_ns), int(st.st_ino))
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.size else None
        except (OSError, ValueError) as exc:
            raise ColibriIOError(f"{path}: cannot map: {exc}", IO) from exc
        finally:
            os.close(fd)

    @property
    def buffer(self) -> mmap.mmap | bytes:
        return self._mm if self._mm is not None else b""

    def view(self, offset: int, nbytes: int, dtype: np.dtype | type = np.uint8) -> np.ndarray:
        """A read-only numpy view of bytes [offset, offset + nbytes) (checked against the size)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(f"{self.path}: bytes [{offset}, {offset + nbytes}) outside the file "
                             f"({self.size} bytes)")
        dt = np.dtype(dtype)
        if self._mm is None or nbytes == 0:
            return np.zeros(0, dtype=dt)
        return np.frombuffer(self._mm, dtype=dt, count=nbytes // dt.itemsize, offset=offset)

    def read(self, offset: int, n: int) -> bytes:
        """Bytes at [offset, offset + n) clamped to the file (the hex view's `read`)."""
        start = min(max(0, offset), self.size)
        end = min(self.size, start + max(0, n))
        return bytes(self.buffer[start:end])


class MappedTensorFile:
    """What a validated, mapped file with a tensor table offers whatever its format: its size and
    identity, the hex source's `read`, and each tensor's entry by name (GGUFFile and
    SafetensorsFile build on it)."""

    def __init__(self, mapping: Mapping, tensors: Iterable[TensorEntry]) -> None:
        self._map = mapping
        self.path = mapping.path
        self._by_name = {t.name: t for t in tensors}

    @property
    def size(self) -> int:
        return self._map.size

    @property
    def identity(self) -> tuple[int, int, int]:
        """(size, mtime_ns, inode) when it was opened."""
        return self._map.identity

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def tensor_info(self, name: str) -> TensorEntry:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self.path}") from None

    def bytes(self) -> np.ndarray:
        """The whole file as a read-only uint8 view."""
        return self._map.view(0, self._map.size)

    def read(self, offset: int, n: int) -> bytes:
        return self._map.read(offset, n)


# ---------------------------------------------------------------------------------------------
# Data scans (--checksums, --nan-check), with progress and cancel for the Inspector


@dataclass
class ScanResult:
    """What a data scan found: problems, the CRC-32 of each tensor's bytes read (checksums),
    and whether it ran to the end (False when cancelled)."""

    problems: list[Problem] = field(default_factory=list)
    crc32: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    complete: bool = True


ProgressFn = Callable[[int, int, str], None]
ChunkFn = Callable[[TensorEntry], Iterator[tuple[np.ndarray, np.ndarray | None]]]

SCAN_CHUNK_BYTES = 16 << 20  # bytes per progress step; also bounds dequantised memory


def scan_tensors(tensors: Iterable[TensorEntry], chunks: ChunkFn, checksums: bool,
                 nan_check: bool, progress: ProgressFn | None = None,
                 cancelled: Callable[[], bool] | None = None) -> ScanResult:
    """Read every tensor's bytes (CRC-32 with `checksums`) and scan its values for NaN/Inf
    (`nan_check`). `chunks(t)` yields (raw bytes, float values or None) in file order. Progress
    is byte-weighted; cancellation is checked between chunks."""
    items = list(tensors)
    total = sum(t.nbytes for t in items) or 1
    result = ScanResult()
    done = 0
    if progress is not None:
        progress(0, total, "")
    for t in items:
        crc = 0
        bad = 0
        first_bad = -1
        seen = 0
        for raw, values in chunks(t):
            if cancelled is not None and cancelled():
                result.complete = False
                return result
            if checksums:
                crc = zlib.crc32(raw, crc)
            if nan_check and values is not None:
                finite = np.isfinite(values)
                if not finite.all():
                    if first_bad < 0:
                        first_bad = seen + int(np.argmin(finite.reshape(-1)))
                    bad += int(finite.size - np.count_nonzero(finite))
                seen += values.size
            done += raw.nbytes
            result.bytes_read += raw.nbytes
            if progress is not None:
                progress(done, total, t.name)
        if checksums:
            result.crc32[t.name] = crc & 0xFFFFFFFF
        if bad:
            # The offset of the block holding the first bad value.
            block = first_bad // t.block_size
            offset = t.offset + block * t.type_size if t.block_size > 1 else (
                t.offset + first_bad * (t.nbytes // max(t.n_elements, 1)))
            result.problems.append(Problem(
                NONFINITE, errors.status_name(NONFINITE), "error", offset, t.name,
                f"tensor '{t.name}': {bad} NaN/Inf value(s), the first at element {first_bad}"))
    return result
