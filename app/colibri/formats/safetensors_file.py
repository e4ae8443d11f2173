"""safetensors files and sharded Hugging Face checkpoints: validators, then readers.

A .safetensors file is a u64 little-endian header length N, N bytes of UTF-8 JSON, then the data.
The JSON object maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte
offsets relative to the data, which starts at 8 + N) and may hold "__metadata__", an object of
strings. The `safetensors` library refuses a file whose tensors do not tile the data exactly
(sorted by offset, each starting where the one before ends, the last ending at the file's end),
so gaps and trailing bytes are errors here too. A checkpoint is one file, several shards listed
by `model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map": {tensor: shard}}),
or a directory of shards.

`validate_header` judges the raw bytes (lengths, UTF-8, JSON, duplicate names, dtypes, shapes,
offsets) and never raises for bad input; only a file without errors is read, as numpy views over
the mapping (bf16 and float8 through `ml_dtypes`), or through the library's `safe_open`
(`Checkpoint.slice`, which the converter reads with).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from colibri.engine import Problem
from colibri.errors import ColibriIOError
from colibri.formats.common import (
    DTYPE, HEADER, IO, LIMIT, MISSING_TENSOR, NAME, OVERLAP, SECTION_BOUNDS, SHAPE,
    SIZE_MISMATCH, TENSOR_BOUNDS, TRUNCATED, UNKNOWN_TENSOR, Findings, Mapping, MappedTensorFile,
    ScanResult, SCAN_CHUNK_BYTES, TensorEntry, raise_first_error, scan_tensors, unholdable_shape,
)
from colibri.inspection.hexsource import Region

MAX_HEADER = 100 * 1024 * 1024   # the safetensors library's own limit
INDEX_NAME = "model.safetensors.index.json"

# dtype -> numpy dtype (bytes per element from it).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("<u1"), "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"), "U64": np.dtype("<u8"), "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8"),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
FLOAT_DTYPES = frozenset({"F16", "F32", "F64", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"})


@dataclass
class Header:
    """What the validator learnt from one file's header."""

    path: str
    size: int
    header_length: int = 0
    data_offset: int = 0
    metadata: dict[str, str] | None = None
    tensors: list[TensorEntry] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dups = []
    for key, value in pairs:
        if key in out:
            dups.append(key)
        out[key] = value
    if dups:
        out["\0duplicates"] = dups  # a key JSON text cannot produce unescaped
    return out


_KEY = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"\s*:\s*\{')


def _key_offsets(text: str, base: int) -> dict[str, int]:
    """Absolute offset of each key whose value is an object (the tensors, `__metadata__`) in
    one pass over the header; the first occurrence of a key wins."""
    ascii_only = text.isascii()
    out: dict[str, int] = {}
    for m in _KEY.finditer(text):
        key = m.group(1)
        if "\\" in key:
            try:
                key = json.loads(f'"{key}"')
            except ValueError:
                continue
        if key not in out:
            i = m.start()
            out[key] = base + (i if ascii_only else len(text[:i].encode("utf-8")))
    return out


def _key_offset(text: str, raw: bytes, name: str, base: int) -> int:
    """Absolute offset of `"name"` in the header (for a finding's offset), else the header's."""
    i = text.find(json.dumps(name, ensure_ascii=False))
    if i < 0:
        i = text.find(json.dumps(name))
    return base + (len(text[:i].encode("utf-8")) if i >= 0 else 0)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_header(buf: Any, size: int, path: str = "") -> Header:
    """Judge one file's bytes: header length, UTF-8, JSON, names, dtypes, shapes and offsets.
    Never raises for bad bytes; `Header.problems` holds every finding."""
    head = Header(path, size)
    found = Findings()
    try:
        _validate(buf, size, head, found)
    except RecursionError:
        found.error(HEADER, 8, "safetensors header is not valid JSON: nested too deeply")
    head.problems = found.result()
    head.regions.sort(key=lambda r: (r.start, -r.length))
    return head


def _validate(buf: Any, size: int, head: Header, found: Findings) -> None:
    if size == 0:
        found.error(TRUNCATED, 0, "file is empty")
        return
    if size < 8:
        found.error(TRUNCATED, size, f"file is {size} bytes, shorter than the 8-byte header "
                                     "length")
        return
    (n,) = struct.unpack_from("<Q", buf, 0)
    head.header_length = n
    head.regions.append(Region(0, 8, "header", f"header length = {n}"))
    if n > size - 8:
        found.error(TRUNCATED, 0, f"safetensors header length {n} does not fit in the file "
                                  f"({size} bytes)")
        return
    if n > MAX_HEADER:
        found.error(LIMIT, 0, f"header length {n} exceeds the safetensors limit of {MAX_HEADER} "
                              "bytes")
        return
    raw = bytes(buf[8:8 + n])
    head.data_offset = 8 + n
    head.regions.append(Region(8, n, "metadata", "JSON header"))
    if not raw.startswith(b"{"):
        found.error(HEADER, 8, "safetensors header is not valid JSON: it does not start with "
                               f"'{{' (first byte {raw[:1]!r})")
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        found.error(HEADER, 8 + exc.start, "safetensors header is not valid JSON: not UTF-8 "
                                           f"(byte {exc.start})")
        return
    try:
        doc = json.loads(text, object_pairs_hook=_reject_duplicates)
    except ValueError as exc:  # JSONDecodeError, and int() refusing huge numbers
        pos = getattr(exc, "pos", 0)
        found.error(HEADER, 8 + len(text[:pos].encode("utf-8")),
                    f"safetensors header is not valid JSON: {str(exc)[:200]}")
        return
    if not isinstance(doc, dict):
        found.error(HEADER, 8, "safetensors header is not a JSON object")
        return
    for dup in doc.pop("\0duplicates", []):
        found.error(NAME, _key_offset(text, raw, dup, 8), f"name '{dup}' appears more than once "
                                                          "in the header", dup)
    meta = doc.pop("__metadata__", None)
    if meta is not None:
        where = _key_offset(text, raw, "__metadata__", 8)
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            found.error(HEADER, where, "__metadata__ is not an object of strings")
        else:
            head.metadata = meta
    data_size = size - head.data_offset
    spans: list[tuple[int, int, str, int]] = []
    offsets = _key_offsets(text, 8)
    for name, entry in doc.items():
        where = offsets.get(name)
        if where is None:  # an entry that is not an object
            where = _key_offset(text, raw, name, 8)
        t = _entry(name, entry, where, data_size, head, found)
        if t is not None:
            spans.append(t)
    spans.sort()
    cursor = 0
    for begin, end, name, where in spans:
        if begin < cursor:
            found.error(OVERLAP, where, f"tensor '{name}': data_offsets [{begin}, {end}] overlap "
                                        f"the tensor before it (ends at {cursor})", name)
        elif begin > cursor:
            found.error(SECTION_BOUNDS, where, f"tensor '{name}': data starts at {begin}, leaving "
                                               f"bytes [{cursor}, {begin}) of the data to no "
                                               "tensor", name)
        cursor = max(cursor, end)
    if spans and cursor < data_size and not found.has_errors:
        found.error(SECTION_BOUNDS, head.data_offset + cursor,
                    f"{data_size - cursor} byte(s) after the last tensor belong to no tensor")


def _entry(name: str, entry: Any, where: int, data_size: int, head: Header,
           found: Findings) -> tuple[int, int, str, int] | None:
    if not isinstance(entry, dict):
        found.error(HEADER, where, f"tensor '{name}': header entry is not an object", name)
        return None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        found.error(DTYPE, where, f"tensor '{name}': dtype {str(dtype)[:40]} not supported "
                                  f"(known: {', '.join(DTYPES)})", name)
        return None
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        found.error(SHAPE, where, f"tensor '{name}': shape {str(shape)[:80]} is not a list of "
                                  "non-negative integers", name)
        return None
    if unholdable_shape(shape):
        found.error(LIMIT, where, f"tensor '{name}': shape {str(shape)[:80]} describes more "
                                  "than 2^63 bytes even without its empty dimensions", name)
        return None
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets)):
        found.error(HEADER, where, f"tensor '{name}': data_offsets {str(offsets)[:80]} is not "
                                   "[begin, end]", name)
        return None
    begin, end = offsets
    if begin > end:
        found.error(HEADER, where, f"tensor '{name}': data_offsets [{begin}, {end}] end before "
                                   "they begin", name)
        return None
    if end > data_size:
        found.error(TENSOR_BOUNDS, where, f"tensor '{name}': data_offsets [{begin}, {end}] "
                                          f"outside the data region of {data_size} bytes", name)
        return None
    expected = math.prod(shape) * DTYPES[dtype].itemsize
    if end - begin != expected:
        found.error(SIZE_MISMATCH, where, f"tensor '{name}': {end - begin} bytes of data, but "
                                          f"shape {shape} of {dtype} needs {expected}", name)
        return None
    absolute = head.data_offset + begin
    head.tensors.append(TensorEntry(name, dtype, tuple(shape), absolute, end - begin, head.path,
                                    where, 1, DTYPES[dtype].itemsize))
    if end > begin:
        head.regions.append(Region(absolute, end - begin, "tensor",
                                   f"{name} {dtype} {list(shape)}"))
    return begin, end, name, where


def validate_file(path: str) -> Header:
    """Validate the file at `path`; ColibriIOError when it cannot be read."""
    mapping = Mapping(path)
    return validate_header(mapping.buffer, mapping.size, path)


# ---------------------------------------------------------------------------------------------
# One validated file


class SafetensorsFile(MappedTensorFile):
    """A .safetensors file that passed the validator, mapped read-only."""

    format = "safetensors"

    def __init__(self, mapping: Mapping, header: Header) -> None:
        super().__init__(mapping, header.tensors)
        self.header = header
        self._library: Any = None

    @classmethod
    def open(cls, path: str) -> SafetensorsFile:
        mapping = Mapping(path)
        header = validate_header(mapping.buffer, mapping.size, path)
        if any(p.severity == "error" for p in header.problems):
            raise_first_error(path, header.problems)
        header.tensors.sort(key=lambda t: t.offset)
        return cls(mapping, header)

    @property
    def problems(self) -> list[Problem]:
        return list(self.header.problems)

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.header.metadata or {})

    @property
    def tensors(self) -> list[TensorEntry]:
        return list(self.header.tensors)

    def tensor(self, name: str) -> np.ndarray:
        """A read-only numpy view of the tensor over the mapping, in its own dtype."""
        t = self.tensor_info(name)
        return self._map.view(t.offset, t.nbytes, DTYPES[t.dtype]).reshape(t.shape)

    def tensor_f32(self, name: str) -> np.ndarray:
        return self.tensor(name).astype(np.float32)

    def library(self) -> Any:
        """The `safetensors` library's handle on this (validated) file, opened once."""
        if self._library is None:
            from safetensors import safe_open
            self._library = safe_open(self.path, framework="np")
        return self._library

    @property
    def regions(self) -> list[Region]:
        return list(self.header.regions)

    def chunks(self, t: TensorEntry, values: bool) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        data = self._map.view(t.offset, t.nbytes)
        step = max(t.type_size, SCAN_CHUNK_BYTES // t.type_size * t.type_size)
        for first in range(0, t.nbytes, step):
            part = data[first:first + step]
            floats = (part.view(DTYPES[t.dtype]).astype(np.float32)
                      if values and t.dtype in FLOAT_DTYPES else None)
            yield part, floats

    def scan(self, checksums: bool = True, nan_check: bool = False, progress: Any = None,
             cancelled: Any = None) -> ScanResult:
        return scan_tensors(self.tensors, lambda t: self.chunks(t, nan_check), checksums,
                            nan_check, progress, cancelled)


# ---------------------------------------------------------------------------------------------
# Checkpoints: one file, an index and its shards, or a directory of shards


@dataclass
class CheckpointLayout:
    """Which files make a checkpoint, and what is wrong with it as a whole."""

    root: str                               # the directory
    index_path: str | None
    shard_paths: list[str]
    weight_map: dict[str, str] | None
    index_metadata: dict[str, Any] | None
    problems: list[Problem] = field(default_factory=list)


def _shard_problem(path: str, p: Problem) -> Problem:
    return Problem(p.code, p.code_name, p.severity, p.offset, p.tensor,
                   f"{os.path.basename(path)}: {p.message}")


def _read_index(index_path: str, found: Findings) -> tuple[dict[str, str] | None,
                                                           dict[str, Any] | None]:
    try:
        with open(index_path, "rb") as f:
            raw = f.read(MAX_HEADER + 1)
    except OSError as exc:
        raise ColibriIOError(f"{index_path}: cannot read: {exc.strerror}", IO) from exc
    if len(raw) > MAX_HEADER:
        found.error(LIMIT, 0, f"index larger than {MAX_HEADER} bytes")
        return None, None
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        found.error(HEADER, 0, f"index is not valid UTF-8 JSON: {str(exc)[:200]}")
        return None, None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        found.error(HEADER, 0, "index has no \"weight_map\" object")
        return None, None
    weight_map = doc["weight_map"]
    for dup in weight_map.pop("\0duplicates", []):
        found.error(NAME, 0, f"index lists tensor '{dup}' more than once", dup)
    bad = [k for k, v in weight_map.items() if not isinstance(v, str)]
    for name in bad[:10]:
        found.error(HEADER, 0, f"index maps tensor '{name}' to {weight_map[name]!r}, not a file "
                               "name", name)
    clean = {k: v for k, v in weight_map.items() if isinstance(v, str)}
    for shard in sorted(set(clean.values())):
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            found.error(NAME, 0, f"index names shard {shard!r}, which is not a file name in the "
                                 "index's directory")
    meta = doc.get("metadata")
    return clean, meta if isinstance(meta, dict) else None


def checkpoint_layout(path: str) -> CheckpointLayout:
    """The files of the checkpoint at `path` (a .safetensors file, an index, or a directory)
    and the problems of the checkpoint as a whole (index, missing shards). Raises
    ColibriIOError when `path` cannot be read."""
    found = Findings()
    if os.path.isdir(path):
        root = path
        index_path: str | None = os.path.join(path, INDEX_NAME)
        if not os.path.isfile(index_path):
            index_path = None
    elif path.endswith(".json"):
        root, index_path = os.path.dirname(path) or ".", path
    else:
        return CheckpointLayout(os.path.dirname(path) or ".", None, [path], None, None)
    weight_map = meta = None
    if index_path is not None:
        weight_map, meta = _read_index(index_path, found)
        shards = sorted(set(weight_map.values())) if weight_map else []
        shard_paths = []
        for shard in shards:
            full = os.path.join(root, shard)
            if os.path.basename(shard) != shard:
                continue
            if not os.path.isfile(full):
                count = sum(1 for v in (weight_map or {}).values() if v == shard)
                found.error(MISSING_TENSOR, 0, f"shard '{shard}' (listed for {count} tensor(s)) "
                                               "does not exist")
            else:
                shard_paths.append(full)
    else:
        try:
            names = sorted(n for n in os.listdir(root) if n.endswith(".safetensors"))
        except OSError as exc:
            raise ColibriIOError(f"{root}: cannot list: {exc.strerror}", IO) from exc
        if not names:
            raise ColibriIOError(f"{root}: no *.safetensors files and no {INDEX_NAME}", IO)
        shard_paths = [os.path.join(root, n) for n in names]
    return CheckpointLayout(root, index_path, shard_paths, weight_map, meta, found.result())


class Checkpoint:
    """A whole checkpoint (one file, index + shards, or a directory), every file validated.
    Tensor names are unique across shards; `tensor_info(name).path` says which file holds one."""

    format = "safetensors"

    def __init__(self, layout: CheckpointLayout, files: list[SafetensorsFile],
                 problems: list[Problem]) -> None:
        self.layout = layout
        self.files = files
        self._problems = problems
        self._by_name: dict[str, tuple[SafetensorsFile, TensorEntry]] = {}
        for f in files:
            for t in f.tensors:
                self._by_name.setdefault(t.name, (f, t))

    @classmethod
    def open(cls, path: str) -> Checkpoint:
        """Open and validate every file of the checkpoint at `path`. Raises ColibriIOError
        when it cannot be read and ColibriFormatError for the first error of any file."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise ColibriIOError(f"{path}: no such file or directory", IO)
        layout, problems, files = _check_checkpoint(path)
        if any(p.severity == "error" for p in problems):
            raise_first_error(path, problems)
        return cls(layout, files, problems)

    @property
    def path(self) -> str:
        return self.layout.index_path or (self.layout.shard_paths[0]
                                          if len(self.layout.shard_paths) == 1
                                          else self.layout.root)

    @property
    def problems(self) -> list[Problem]:
        return list(self._problems)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.layout.index_metadata is not None:
            out["index"] = self.layout.index_metadata
        for f in self.files:
            if f.header.metadata:
                out[os.path.basename(f.path)] = f.metadata
        return out

    @property
    def tensors(self) -> list[TensorEntry]:
        return [t for f in self.files for t in f.tensors]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def file_of(self, name: str) -> SafetensorsFile:
        return self._lookup(name)[0]

    def _lookup(self, name: str) -> tuple[SafetensorsFile, TensorEntry]:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self.path}") from None

    def tensor_info(self, name: str) -> TensorEntry:
        return self._lookup(name)[1]

    def tensor(self, name: str) -> np.ndarray:
        return self._lookup(name)[0].tensor(name)

    def tensor_f32(self, name: str) -> np.ndarray:
        return self._lookup(name)[0].tensor_f32(name)

    def slice(self, name: str) -> Any:
        """The `safetensors` library's lazy slice of a tensor (index it to read a part)."""
        return self._lookup(name)[0].library().get_slice(name)

    def scan(self, checksums: bool = True, nan_check: bool = False, progress: Any = None,
             cancelled: Any = None) -> ScanResult:
        owners = {id(t): f for f in self.files for t in f.tensors}
        return scan_tensors(self.tensors, lambda t: owners[id(t)].chunks(t, nan_check),
                            checksums, nan_check, progress, cancelled)


def _check_checkpoint(path: str) -> tuple[CheckpointLayout, list[Problem], list[SafetensorsFile]]:
    layout = checkpoint_layout(path)
    problems = list(layout.problems)
    files: list[SafetensorsFile] = []
    owner: dict[str, str] = {}
    found = Findings()  # problems of the checkpoint as a whole
    multi = len(layout.shard_paths) > 1 or layout.index_path is not None
    for shard in layout.shard_paths:
        mapping = Mapping(shard)
        header = validate_header(mapping.buffer, mapping.size, shard)
        problems += [_shard_problem(shard, p) if multi else p for p in header.problems]
        if any(p.severity == "error" for p in header.problems):
            continue
        header.tensors.sort(key=lambda t: t.offset)
        files.append(SafetensorsFile(mapping, header))
        base = os.path.basename(shard)
        for t in header.tensors:
            if t.name in owner:
                found.error(NAME, t.info_offset, f"{base}: tensor '{t.name}' also in "
                                                 f"{owner[t.name]}", t.name)
            else:
                owner[t.name] = base
    if layout.weight_map is not None:
        checked = {os.path.basename(f.path) for f in files}
        for name, shard in layout.weight_map.items():
            if shard in checked and owner.get(name) != shard:
                found.error(MISSING_TENSOR, 0, f"index maps tensor '{name}' to '{shard}', which "
                                               "does not contain it", name)
        for name, base in owner.items():
            if name not in layout.weight_map:
                found.warning(UNKNOWN_TENSOR, 0, f"{base}: tensor '{name}' is not in the index",
                              name)
        total = (layout.index_metadata or {}).get("total_size")
        if _is_int(total) and not found.has_errors:
            actual = sum(t.nbytes for f in files for t in f.tensors)
            if total != actual:
                found.warning(SIZE_MISMATCH, 0, f"index metadata total_size {total}, but the "
                                                f"tensors hold {actual} bytes")
    return layout, problems + found.result(), files


def validate(path: str) -> list[Problem]:
    """Every problem of the checkpoint at `path` (a file, an index or a directory)."""
    if not os.path.exists(path):
        raise ColibriIOError(f"{path}: no such file or directory", IO)
    return _check_checkpoint(os.fspath(path))[1]


__all__ = ["Checkpoint", "CheckpointLayout", "DTYPES", "Header", "SafetensorsFile",
           "checkpoint_layout", "validate", "validate_file", "validate_header"]
