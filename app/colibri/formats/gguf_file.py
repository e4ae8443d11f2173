"""GGUF files (llama.cpp): a validator over the raw bytes, then a reader over the mapping.

Layout (little-endian; versions 2 and 3 differ from 1 in 64-bit counts and lengths, and 3 only
adds big-endian files, which this reader refuses):

    0   4  magic "GGUF"
    4   4  u32 version
    8   8  u64 tensor_count
    16  8  u64 kv_count
    24     kv_count key/values: string key, u32 value type, value
           tensor_count tensor infos: string name, u32 n_dims, u64 ne[n_dims] (innermost first),
           u32 ggml type, u64 offset (relative to the data section)
           padding to `general.alignment` (u32, default 32)
           data section: each tensor at its offset, padded to the alignment

A string is a u64 length and that many UTF-8 bytes; an array value is a u32 element type, a u64
count and the elements (arrays may nest). `walk` checks every length, count and offset against
the file before using it and never raises for bad bytes; it records each structure as a
`Region` for the hex view. llama.cpp's own loader (ggml/src/gguf.cpp) adds a rule the format
text does not state: tensors follow each other in table order, each padded to the alignment, so
a gap or a reordering is an error here too.

The `gguf` package supplies the ggml type table (block sizes) and dequantisation of every type.
Its `GGUFReader` is not used for reading: it builds numpy objects per array element and took 72 s
to open a file with a 151k-token vocabulary and merges (docs/formats.md); the walk below reads
the same file in well under a second and decodes big arrays lazily.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from colibri.engine import Problem
from colibri.formats.common import (
    BAD_MAGIC, BAD_VERSION, DTYPE, HEADER, LIMIT, MISALIGNED, NAME, OVERLAP, SECTION_BOUNDS,
    SHAPE, TENSOR_BOUNDS, TRUNCATED, UNSUPPORTED, Findings, Mapping, MappedTensorFile, ScanResult,
    TensorEntry,
    SCAN_CHUNK_BYTES, raise_first_error, scan_tensors, unholdable_shape,
)
from colibri.errors import ColibriFormatError
from colibri.inspection.hexsource import Region

MAGIC = b"GGUF"
HEADER_SIZE = 24
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4          # GGML_MAX_DIMS
MAX_NAME = 64         # GGML_MAX_NAME, terminating NUL included
MAX_ARRAY_DEPTH = 8   # nested arrays deeper than this are refused (LIMIT)
SMALL_ARRAY = 64      # arrays up to this many elements are decoded during the walk

# Metadata value types: id -> (name, struct code or None for string/array).
STRING, ARRAY = 8, 9
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("u8", "<B"), 1: ("i8", "<b"), 2: ("u16", "<H"), 3: ("i16", "<h"), 4: ("u32", "<I"),
    5: ("i32", "<i"), 6: ("f32", "<f"), 7: ("bool", "<B"), STRING: ("string", None),
    ARRAY: ("array", None), 10: ("u64", "<Q"), 11: ("i64", "<q"), 12: ("f64", "<d"),
}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
# Smallest encoding of one element of each type (strings and arrays: their length fields).
_MIN_SIZE = {k: (struct.calcsize(code) if code else (8 if k == STRING else 12))
             for k, (_, code) in VALUE_TYPES.items()}

# Plain (non-block) ggml types read as numpy arrays.
_PLAIN_NUMPY = {GGMLQuantizationType.F32: "<f4", GGMLQuantizationType.F16: "<f2",
                GGMLQuantizationType.F64: "<f8", GGMLQuantizationType.I8: "<i1",
                GGMLQuantizationType.I16: "<i2", GGMLQuantizationType.I32: "<i4",
                GGMLQuantizationType.I64: "<i8", GGMLQuantizationType.BF16: "<u2"}

# Types with no dequantiser in the gguf package: llama.cpp's activation types (Q8_1, Q8_K) are
# never meant for files, Q1_0 is newer than the package.
_NO_DEQUANTIZER = {GGMLQuantizationType.Q8_1, GGMLQuantizationType.Q8_K,
                   GGMLQuantizationType.Q1_0}


def type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type-{ggml_type}"


_U64 = struct.Struct("<Q")


class _Truncated(Exception):
    """A read ran past the end of the file (internal to the walk)."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


@dataclass(frozen=True)
class ArrayValue:
    """A metadata array: element type, count, where its elements start. Large arrays are not
    decoded by the walk; `GGUFFile.array(key)` decodes them on demand."""

    element_type: int
    count: int
    offset: int          # first element
    end: int             # one past the last byte
    values: list[Any] | None = None   # decoded when count <= SMALL_ARRAY and not nested deeper

    @property
    def element_type_name(self) -> str:
        return VALUE_TYPES[self.element_type][0]


@dataclass(frozen=True)
class KeyValue:
    """One metadata key/value: `offset` of the key's length field, `value_offset` of the value
    (after its type), `end` one past its last byte."""

    key: str
    type: int
    value: Any           # int, float, bool, str or ArrayValue
    offset: int
    value_offset: int
    end: int

    @property
    def type_name(self) -> str:
        return VALUE_TYPES[self.type][0]


@dataclass
class Layout:
    """Everything the walk learnt: header fields, metadata, tensors, regions and problems."""

    size: int
    version: int = 0
    tensor_count: int = 0
    kv_count: int = 0
    alignment: int = DEFAULT_ALIGNMENT
    info_end: int = 0
    data_offset: int = 0
    kvs: list[KeyValue] | None = None
    tensors: list[TensorEntry] | None = None
    ne: dict[str, tuple[int, ...]] | None = None
    regions: list[Region] | None = None
    problems: list[Problem] | None = None


class _Cursor:
    """Bounds-checked little-endian reads from a buffer of known size."""

    def __init__(self, buf: Any, size: int, pos: int = 0) -> None:
        self.buf, self.size, self.pos = buf, size, pos

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise _Truncated(self.pos, f"{what} needs {n} bytes at 0x{self.pos:X}, but the file "
                                       f"ends at 0x{self.size:X}")

    def unpack(self, code: str, what: str) -> Any:
        n = struct.calcsize(code)
        self.need(n, what)
        (value,) = struct.unpack_from(code, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", what))

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", what))

    def raw_string(self, what: str) -> tuple[int, bytes]:
        start = self.pos
        n = self.u64(f"{what} length")
        if n > self.size - self.pos:
            raise _Truncated(start, f"{what} length {n} at 0x{start:X} runs past the end of the "
                                    f"file (0x{self.size:X})")
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return start, data


def _decode(data: bytes) -> tuple[str, bool]:
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), False


class _Walker:
    def __init__(self, buf: Any, size: int) -> None:
        self.cur = _Cursor(buf, size)
        self.buf, self.size = buf, size
        self.found = Findings()
        self.layout = Layout(size=size, kvs=[], tensors=[], ne={}, regions=[])

    # -- metadata values ------------------------------------------------------------------------

    def value(self, vtype: int, where: str, depth: int) -> Any:
        cur = self.cur
        name, code = VALUE_TYPES[vtype]
        if code is not None:
            value = cur.unpack(code, where)
            if vtype == 7:
                if value not in (0, 1):
                    self.found.warning(HEADER, cur.pos - 1,
                                       f"{where}: bool byte {value}, expected 0 or 1")
                return bool(value)
            return value
        if vtype == STRING:
            start, data = cur.raw_string(where)
            text, ok = _decode(data)
            if not ok:
                self.found.warning(HEADER, start, f"{where}: string is not valid UTF-8")
            return text
        return self.array(where, depth + 1)

    def array(self, where: str, depth: int) -> ArrayValue:
        cur = self.cur
        if depth > MAX_ARRAY_DEPTH:
            raise _Limit(cur.pos, f"{where}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        type_offset = cur.pos
        etype = cur.u32(f"{where} element type")
        if etype not in VALUE_TYPES:
            raise _BadType(type_offset, f"{where}: unknown array element type {etype}")
        count_offset = cur.pos
        count = cur.u64(f"{where} count")
        need = count * _MIN_SIZE[etype]
        if need > self.size - cur.pos:
            raise _Truncated(count_offset, f"{where}: {count} elements of type "
                                           f"{VALUE_TYPES[etype][0]} need at least {need} bytes "
                                           f"at 0x{cur.pos:X}, but the file ends at "
                                           f"0x{self.size:X}")
        first = cur.pos
        code = VALUE_TYPES[etype][1]
        if code is not None:  # fixed size: one bounds check covers all
            size = struct.calcsize(code)
            values = None
            if count <= SMALL_ARRAY:
                values = [self.value(etype, where, depth) for _ in range(count)]
            else:
                cur.pos += count * size
                if etype == 7:
                    bad = np.frombuffer(self.buf, np.uint8, count, first) > 1
                    if bad.any():
                        self.found.warning(HEADER, first + int(np.argmax(bad)),
                                           f"{where}: bool byte not 0 or 1")
            return ArrayValue(etype, count, first, cur.pos, values)
        if etype == STRING:
            pos = self._skip_strings(cur.pos, count, where)
            values = None
            if count <= SMALL_ARRAY:
                values, p = [], cur.pos
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", self.buf, p)
                    values.append(_decode(bytes(self.buf[p + 8:p + 8 + n]))[0])
                    p += 8 + n
            cur.pos = pos
            return ArrayValue(etype, count, first, pos, values)
        nested = [self.array(f"{where}[{i}]", depth + 1) for i in range(count)]
        return ArrayValue(etype, count, first, cur.pos, nested if count <= SMALL_ARRAY else None)

    def _skip_strings(self, pos: int, count: int, where: str) -> int:
        """The end of `count` strings from `pos`, each length checked against the file; the
        hot loop of a big vocabulary (150 000 tokens and merges), kept to one check a string."""
        unpack, buf, size = _U64.unpack_from, self.buf, self.size
        start = pos
        try:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
                if pos > size:
                    break
        except struct.error:  # the length itself is past the end
            pos = size + 1
        if pos <= size:
            return pos
        # Find which string broke, for the message (only on a bad file).
        p = start
        for i in range(count):
            if p + 8 > size:
                raise _Truncated(p, f"{where}[{i}]: string length at 0x{p:X} past the end of "
                                    f"the file (0x{size:X})")
            (n,) = unpack(buf, p)
            if n > size - p - 8:
                raise _Truncated(p, f"{where}[{i}]: string length {n} at 0x{p:X} runs past the "
                                    f"end of the file (0x{size:X})")
            p += 8 + n
        raise _Truncated(p, f"{where}: strings run past the end of the file")

    # -- sections -------------------------------------------------------------------------------

    def header(self) -> bool:
        found, cur, lay = self.found, self.cur, self.layout
        if self.size == 0:
            found.error(TRUNCATED, 0, "file is empty")
            return False
        if self.size < 4 or bytes(self.buf[0:4]) != MAGIC:
            head = bytes(self.buf[0:4])
            found.error(BAD_MAGIC, 0, f"magic {head!r}, expected \"GGUF\"")
            return False
        if self.size < HEADER_SIZE:
            found.error(TRUNCATED, self.size, f"file is {self.size} bytes, shorter than the "
                                               f"{HEADER_SIZE}-byte GGUF header")
            return False
        cur.pos = 4
        lay.version = cur.u32("version")
        if lay.version not in (2, 3):
            swapped = int.from_bytes(lay.version.to_bytes(4, "little"), "big")
            if swapped in (2, 3):
                found.error(UNSUPPORTED, 4, f"big-endian GGUF (version {swapped}) is not "
                                            "supported")
            elif lay.version == 1:
                found.error(BAD_VERSION, 4, "GGUF version 1 (32-bit counts, 2023) is not "
                                            "supported; convert the model again")
            else:
                found.error(BAD_VERSION, 4, f"GGUF version {lay.version}, expected 2 or 3")
            return False
        lay.tensor_count = cur.u64("tensor_count")
        lay.kv_count = cur.u64("kv_count")
        regions = lay.regions
        assert regions is not None
        regions += [Region(0, 4, "header", "magic 'GGUF'"),
                    Region(4, 4, "header", f"version = {lay.version}"),
                    Region(8, 8, "header", f"tensor_count = {lay.tensor_count}"),
                    Region(16, 8, "header", f"kv_count = {lay.kv_count}")]
        room = self.size - HEADER_SIZE
        if lay.kv_count * 13 > room:  # key length, type, at least one byte of value
            found.error(LIMIT, 16, f"kv_count {lay.kv_count} cannot fit in the {room} bytes "
                                   "after the header")
            return False
        if lay.tensor_count * 24 > room:  # name length, n_dims, type, offset
            found.error(LIMIT, 8, f"tensor_count {lay.tensor_count} cannot fit in the {room} "
                                  "bytes after the header")
            return False
        return True

    def metadata(self) -> None:
        found, cur, lay = self.found, self.cur, self.layout
        assert lay.kvs is not None and lay.regions is not None
        seen: dict[str, int] = {}
        for i in range(lay.kv_count):
            start = cur.pos
            _, raw = cur.raw_string(f"key of key/value {i}")
            key, ok = _decode(raw)
            if not ok or not key:
                found.error(NAME, start, f"key/value {i}: key {raw[:64]!r} is "
                                         f"{'empty' if not raw else 'not valid UTF-8'}")
            type_offset = cur.pos
            vtype = cur.u32(f"type of '{key}'")
            if vtype not in VALUE_TYPES:
                raise _BadType(type_offset, f"metadata '{key}': unknown value type {vtype}")
            value_offset = cur.pos
            value = self.value(vtype, f"metadata '{key}'", 0)
            if key in seen:
                found.error(NAME, start, f"duplicate metadata key '{key}' (first at "
                                         f"0x{seen[key]:X})")
            else:
                seen[key] = start
            kv = KeyValue(key, vtype, value, start, value_offset, cur.pos)
            lay.kvs.append(kv)
            lay.regions.append(Region(start, cur.pos - start, "metadata",
                                      f"{key}: {_short(kv)}"))
        align = next((kv for kv in lay.kvs if kv.key == "general.alignment"), None)
        if align is not None:
            if align.type != 4:
                found.error(HEADER, align.value_offset - 4, "general.alignment has type "
                                                            f"{align.type_name}, expected u32")
            elif align.value == 0 or align.value & (align.value - 1):
                found.error(HEADER, align.value_offset, f"general.alignment {align.value} is not "
                                                        "a power of two")
            else:
                lay.alignment = int(align.value)
        arch = next((kv for kv in lay.kvs if kv.key == "general.architecture"), None)
        if arch is None:
            found.warning(HEADER, HEADER_SIZE, "no general.architecture key (llama.cpp needs it "
                                               "to load a model)")
        elif arch.type != STRING:
            found.error(HEADER, arch.value_offset - 4, "general.architecture has type "
                                                       f"{arch.type_name}, expected string")

    def tensor_infos(self) -> list[tuple[str, int, tuple[int, ...], int, int, int]]:
        """(name, info offset, ne, ggml type, relative offset, type offset) per tensor."""
        found, cur, lay = self.found, self.cur, self.layout
        assert lay.regions is not None
        infos = []
        seen: dict[str, int] = {}
        for i in range(lay.tensor_count):
            start = cur.pos
            _, raw = cur.raw_string(f"name of tensor {i}")
            name, ok = _decode(raw)
            if not ok:
                found.error(NAME, start, f"tensor {i}: name {raw[:64]!r} is not valid UTF-8",
                            name)
            elif not name:
                found.error(NAME, start, f"tensor {i} has an empty name")
            elif len(raw) >= MAX_NAME:
                found.error(NAME, start, f"tensor name of {len(raw)} bytes; llama.cpp allows at "
                                         f"most {MAX_NAME - 1}", name)
            if name in seen:
                found.error(NAME, start, f"duplicate tensor name '{name}' (first at "
                                         f"0x{seen[name]:X})", name)
            else:
                seen[name] = start
            dims_offset = cur.pos
            n_dims = cur.u32(f"n_dims of '{name}'")
            if n_dims > MAX_DIMS:
                raise _Limit(dims_offset, f"tensor '{name}': n_dims {n_dims} > {MAX_DIMS}", name)
            ne = tuple(cur.u64(f"ne[{d}] of '{name}'") for d in range(n_dims))
            type_offset = cur.pos
            ggml_type = cur.u32(f"type of '{name}'")
            offset = cur.u64(f"offset of '{name}'")
            infos.append((name, start, ne, ggml_type, offset, type_offset))
            lay.regions.append(Region(start, cur.pos - start, "tensor_table",
                                      f"tensor info: {name} {type_name(ggml_type)} "
                                      f"ne={list(ne)} offset={offset}"))
        return infos

    def tensors(self, infos: list[tuple[str, int, tuple[int, ...], int, int, int]]) -> None:
        found, lay = self.found, self.layout
        assert lay.tensors is not None and lay.ne is not None and lay.regions is not None
        lay.info_end = self.cur.pos
        lay.data_offset = -(-lay.info_end // lay.alignment) * lay.alignment
        if lay.data_offset > lay.info_end:
            lay.regions.append(Region(lay.info_end, min(lay.data_offset, self.size) - lay.info_end,
                                      "header", "padding to the data section"))
        data_size = self.size - lay.data_offset
        if infos and data_size < 0:
            found.error(TRUNCATED, self.size, f"file ends at 0x{self.size:X}, before its data "
                                              f"section at 0x{lay.data_offset:X}")
        expected = 0       # where llama.cpp expects the next tensor (padded running size)
        truncated = False
        for name, start, ne, ggml_type, rel, type_offset in infos:
            sizes = GGML_QUANT_SIZES.get(_quant_type(ggml_type))
            if sizes is None:
                found.error(DTYPE, type_offset, f"tensor '{name}': unknown ggml type {ggml_type}",
                            name)
                continue
            block, tsize = sizes
            dims_ok = True
            for d, n in enumerate(ne):
                if n >= 1 << 63:
                    found.error(LIMIT, start, f"tensor '{name}': ne[{d}] = {n} is negative as "
                                              "int64", name)
                    dims_ok = False
            count = math.prod(ne) if ne else 1
            if dims_ok and count >= 1 << 63:
                found.error(LIMIT, start, f"tensor '{name}': element count overflows int64",
                            name)
                dims_ok = False
            if dims_ok and unholdable_shape(ne):
                found.error(LIMIT, start, f"tensor '{name}': ne={list(ne)} describes more than "
                                          "2^63 bytes even without its empty dimensions", name)
                dims_ok = False
            if not dims_ok:
                continue
            row = ne[0] if ne else 1
            if row % block:
                found.error(SHAPE, start, f"tensor '{name}': ne[0] = {row} is not a multiple of "
                                          f"{type_name(ggml_type)}'s block of {block}", name)
                continue
            nbytes = count // block * tsize
            absolute = lay.data_offset + rel
            entry = TensorEntry(name, type_name(ggml_type), tuple(reversed(ne)) or (1,), absolute,
                                nbytes, info_offset=start, block_size=block, type_size=tsize)
            lay.tensors.append(entry)
            lay.ne[name] = ne
            if _quant_type(ggml_type) in _NO_DEQUANTIZER:
                found.warning(UNSUPPORTED, type_offset, f"tensor '{name}': values of ggml type "
                                                        f"{type_name(ggml_type)} cannot be read "
                                                        "here (no dequantiser)", name)
            if rel % lay.alignment:
                found.error(MISALIGNED, type_offset + 4, f"tensor '{name}': offset {rel} is not a "
                                                         f"multiple of the alignment "
                                                         f"{lay.alignment}", name)
            if absolute + nbytes > self.size:
                if not truncated and data_size >= 0:
                    found.error(TRUNCATED, self.size, f"file is {self.size} bytes but tensor "
                                                      f"'{name}' ends at byte {absolute + nbytes}",
                                name)
                    truncated = True
                found.error(TENSOR_BOUNDS, type_offset + 4,
                            f"tensor '{name}': data [0x{absolute:X}, 0x{absolute + nbytes:X}) "
                            f"beyond the end of the file (0x{self.size:X})", name)
            elif rel < expected:
                found.error(OVERLAP, type_offset + 4, f"tensor '{name}': offset {rel} overlaps "
                                                      f"the tensor before it (ends at {expected})",
                            name)
            elif rel != expected:
                found.error(SECTION_BOUNDS, type_offset + 4,
                            f"tensor '{name}': offset {rel}, but llama.cpp expects {expected} "
                            "(tensors back to back in table order, each padded to the alignment)",
                            name)
            expected = max(expected, rel + -(-nbytes // lay.alignment) * lay.alignment)
            if nbytes and absolute < self.size:
                lay.regions.append(Region(absolute, min(nbytes, self.size - absolute), "tensor",
                                          f"{name} {entry.dtype} {list(entry.shape)}"))
        end = lay.data_offset + expected
        if infos and not found.has_errors and self.size > end:
            found.warning(SECTION_BOUNDS, end, f"{self.size - end} byte(s) after the last "
                                               "tensor belong to nothing")

    def run(self) -> Layout:
        lay = self.layout
        try:
            if self.header():
                self.cur.pos = HEADER_SIZE
                self.metadata()
                infos = self.tensor_infos()
                self.tensors(infos)
        except _Truncated as exc:
            self.found.error(TRUNCATED, exc.offset, exc.message)
        except _Limit as exc:
            self.found.error(LIMIT, exc.offset, exc.message, exc.tensor)
        except _BadType as exc:
            self.found.error(DTYPE, exc.offset, exc.message)
        lay.problems = self.found.result()
        assert lay.regions is not None
        lay.regions.sort(key=lambda r: (r.start, -r.length))
        return lay


class _Limit(Exception):
    def __init__(self, offset: int, message: str, tensor: str = "") -> None:
        super().__init__(message)
        self.offset, self.message, self.tensor = offset, message, tensor


class _BadType(Exception):
    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset, self.message = offset, message


def _quant_type(ggml_type: int) -> GGMLQuantizationType | None:
    try:
        return GGMLQuantizationType(ggml_type)
    except ValueError:
        return None


def _short(kv: KeyValue) -> str:
    value = kv.value
    if isinstance(value, ArrayValue):
        return f"{value.element_type_name}[{value.count}]"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def walk(buf: Any, size: int | None = None) -> Layout:
    """Validate a GGUF image held in `buf` (bytes, mmap): every structure bounds-checked before
    it is used. Never raises for bad bytes; problems are in `Layout.problems`."""
    return _Walker(buf, len(buf) if size is None else size).run()


def validate_bytes(data: bytes | bytearray | memoryview) -> list[Problem]:
    return walk(data).problems or []


# ---------------------------------------------------------------------------------------------
# Reading a validated file


class GGUFFile(MappedTensorFile):
    """A GGUF file that passed the validator, mapped read-only. Open with `GGUFFile.open`."""

    format = "gguf"

    def __init__(self, mapping: Mapping, layout: Layout) -> None:
        super().__init__(mapping, layout.tensors or [])
        self.layout = layout
        self._kv = {kv.key: kv for kv in layout.kvs or []}
        self._starts: dict[int, list[int]] = {}   # array offset -> its elements' offsets so far

    @classmethod
    def open(cls, path: str) -> GGUFFile:
        """Map and validate `path`. Raises ColibriIOError when it cannot be read and
        ColibriFormatError (first error; every problem in `.problems`) when it is invalid."""
        mapping = Mapping(path)
        layout = walk(mapping.buffer, mapping.size)
        if any(p.severity == "error" for p in layout.problems or []):
            raise_first_error(path, layout.problems or [])
        return cls(mapping, layout)

    # -- description ----------------------------------------------------------------------------

    @property
    def problems(self) -> list[Problem]:
        return list(self.layout.problems or [])

    @property
    def architecture(self) -> str:
        value = self.get("general.architecture")
        return value if isinstance(value, str) else ""

    @property
    def keys(self) -> list[str]:
        return list(self._kv)

    @property
    def key_values(self) -> list[KeyValue]:
        return list(self.layout.kvs or [])

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value: scalars and strings as Python values, arrays as lists (decoded on
        demand; see `array` for numeric arrays as numpy)."""
        kv = self._kv.get(key)
        if kv is None:
            return default
        if isinstance(kv.value, ArrayValue):
            return self.array_list(kv.value)
        return kv.value

    def array(self, key: str) -> np.ndarray:
        """A numeric metadata array as a read-only numpy view (no copy)."""
        kv = self._kv[key]
        value = kv.value
        if not isinstance(value, ArrayValue) or value.element_type not in _NUMPY:
            raise TypeError(f"metadata '{key}' is not a numeric array")
        return self._map.view(value.offset, value.end - value.offset,
                              np.dtype(_NUMPY[value.element_type]))

    def array_list(self, value: ArrayValue) -> list[Any]:
        if value.values is not None:
            return [self.array_list(v) if isinstance(v, ArrayValue) else v for v in value.values]
        buf = self._map.buffer
        if value.element_type in _NUMPY:
            out = np.frombuffer(buf, np.dtype(_NUMPY[value.element_type]), value.count,
                                value.offset).tolist()
            return [bool(v) for v in out] if value.element_type == 7 else out
        if value.element_type == STRING:
            strings, pos = [], value.offset
            for _ in range(value.count):
                (n,) = struct.unpack_from("<Q", buf, pos)
                strings.append(bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8", "replace"))
                pos += 8 + n
            return strings
        # Nested arrays too long to keep: walk them again (already validated).
        walker = _Walker(buf, self._map.size)
        walker.cur.pos = value.offset
        out_nested = []
        for i in range(value.count):
            inner = walker.array(f"[{i}]", 1)
            out_nested.append(self.array_list(inner))
        return out_nested

    def array_items(self, value: ArrayValue, start: int, count: int,
                    ) -> list[tuple[int, int, Any]]:
        """(offset, end, value) of elements [start, start + count) of a metadata array: numbers,
        strings, or nested arrays as `ArrayValue`s. The file was validated, so the elements are
        read without checks; the offsets of variable-size elements are found once, as far as
        they are asked for (a 151 000-token vocabulary is walked only as far as it is shown)."""
        stop = min(value.count, start + max(0, count))
        if start >= stop:
            return []
        buf, etype = self._map.buffer, value.element_type
        if etype in _NUMPY:
            dt = np.dtype(_NUMPY[etype])
            items = np.frombuffer(buf, dt, stop - start, value.offset + start * dt.itemsize)
            values = [bool(v) for v in items.tolist()] if etype == 7 else items.tolist()
            return [(value.offset + (start + i) * dt.itemsize,
                     value.offset + (start + i + 1) * dt.itemsize, v)
                    for i, v in enumerate(values)]
        starts = self._element_starts(value, stop)
        out: list[tuple[int, int, Any]] = []
        for i in range(start, stop):
            pos, end = starts[i], starts[i + 1]
            if etype == STRING:
                item: Any = _decode(bytes(buf[pos + 8:end]))[0]
            else:
                walker = _Walker(buf, self._map.size)
                walker.cur.pos = pos
                item = walker.array(f"[{i}]", 1)
            out.append((pos, end, item))
        return out

    def _element_starts(self, value: ArrayValue, stop: int) -> list[int]:
        """Offsets of elements 0..stop of a string or nested array (stop + 1 entries; the last
        is where element `stop` starts, or the array's end)."""
        starts = self._starts.setdefault(value.offset, [value.offset])
        if len(starts) > stop:
            return starts
        buf, unpack = self._map.buffer, _U64.unpack_from
        pos = starts[-1]
        walker = _Walker(buf, self._map.size) if value.element_type == ARRAY else None
        while len(starts) <= stop:
            if walker is None:
                pos += 8 + unpack(buf, pos)[0]
            else:
                walker.cur.pos = pos
                walker.array("", 1)
                pos = walker.cur.pos
            starts.append(pos)
        return starts

    def metadata(self, max_items: int = SMALL_ARRAY) -> dict[str, Any]:
        """Every key/value for display or JSON; arrays longer than `max_items` summarised as
        {"type", "count", "first"}."""
        out: dict[str, Any] = {}
        for kv in self.layout.kvs or []:
            value = kv.value
            if isinstance(value, ArrayValue) and value.count > max_items:
                head = self.array_list(ArrayValue(value.element_type, min(value.count, 8),
                                                  value.offset, value.end)
                                       ) if value.element_type != ARRAY else []
                out[kv.key] = {"type": f"{value.element_type_name}[]", "count": value.count,
                               "first": head}
            else:
                out[kv.key] = self.get(kv.key)
        return out

    @property
    def tensors(self) -> list[TensorEntry]:
        return list(self.layout.tensors or [])

    def ne(self, name: str) -> tuple[int, ...]:
        """The tensor's dimensions as GGUF stores them (innermost first)."""
        return (self.layout.ne or {})[name]

    def ggml_type(self, name: str) -> GGMLQuantizationType:
        return GGMLQuantizationType[self.tensor_info(name).dtype]

    # -- data -----------------------------------------------------------------------------------

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view [rows..., row bytes] over the mapping."""
        t = self.tensor_info(name)
        data = self._map.view(t.offset, t.nbytes)
        if not t.shape or t.n_elements == 0:
            return data
        return data.reshape(*t.shape[:-1], t.row_bytes)

    def tensor(self, name: str) -> np.ndarray:
        """Plain types (F32, F16, BF16 as uint16 bits, F64, I8..I64) as a typed read-only view
        of `shape`; block types as `raw`."""
        t = self.tensor_info(name)
        code = _PLAIN_NUMPY.get(self.ggml_type(name))
        if code is None:
            return self.raw(name)
        return self._map.view(t.offset, t.nbytes, np.dtype(code)).reshape(t.shape)

    def tensor_f32(self, name: str, rows: slice | None = None) -> np.ndarray:
        """float32 values of the tensor (dequantised with the `gguf` package for block types),
        optionally only rows `rows` of its 2-D [rows, last dim] view."""
        t = self.tensor_info(name)
        qtype = self.ggml_type(name)
        flat_rows = self.raw(name).reshape(-1, t.row_bytes) if t.n_elements else None
        if flat_rows is None:
            return np.zeros(t.shape, np.float32)
        part = flat_rows if rows is None else flat_rows[rows]
        values = _dequantize(part, qtype, t)
        if rows is None:
            return values.reshape(t.shape)
        return values

    def decode_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """float32 values [n, columns] of whole rows of tensor `name` as `tensor` or `raw` gives
        them (a slice of either: typed values or row bytes)."""
        rows = np.ascontiguousarray(rows)
        t = self.tensor_info(name)
        raw = rows.view(np.uint8).reshape(-1, t.row_bytes)
        return _dequantize(raw, self.ggml_type(name), t)

    @property
    def regions(self) -> list[Region]:
        return list(self.layout.regions or [])

    def scan(self, checksums: bool = True, nan_check: bool = False, progress: Any = None,
             cancelled: Any = None) -> ScanResult:
        """Read every tensor (CRC-32 of its bytes) and/or scan its dequantised values for
        NaN/Inf, in chunks of whole rows, with progress and cancel (common.scan_tensors)."""
        def chunks(t: TensorEntry) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
            if t.nbytes == 0:
                return
            rows = self.raw(t.name).reshape(-1, t.row_bytes)
            step = max(1, SCAN_CHUNK_BYTES // max(t.row_bytes, 1))
            qtype = self.ggml_type(t.name)
            readable = _is_float(qtype) and qtype not in _NO_DEQUANTIZER
            for first in range(0, rows.shape[0], step):
                part = rows[first:first + step]
                values = _dequantize(part, qtype, t) if nan_check and readable else None
                yield part.reshape(-1), values
        return scan_tensors(self.tensors, chunks, checksums, nan_check, progress, cancelled)


def _is_float(qtype: GGMLQuantizationType) -> bool:
    return qtype not in (GGMLQuantizationType.I8, GGMLQuantizationType.I16,
                         GGMLQuantizationType.I32, GGMLQuantizationType.I64)


def _dequantize(rows: np.ndarray, qtype: GGMLQuantizationType, tensor: TensorEntry
                ) -> np.ndarray:
    """float32 values of whole rows of `tensor`'s raw bytes [n_rows, row bytes]."""
    code = _PLAIN_NUMPY.get(qtype)
    if qtype == GGMLQuantizationType.BF16:
        bits = np.ascontiguousarray(rows).view("<u2")
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if code is not None:
        return np.ascontiguousarray(rows).view(code).astype(np.float32)
    if qtype in _NO_DEQUANTIZER:
        raise ColibriFormatError(f"values of ggml type {qtype.name} cannot be read here (no "
                                 "dequantiser)", UNSUPPORTED, tensor.offset, tensor.name)
    return np.asarray(gguf_dequantize(np.ascontiguousarray(rows), qtype), dtype=np.float32)


def validate(path: str) -> list[Problem]:
    """Every problem of the GGUF file at `path` ([] for a clean file); ColibriIOError when it
    cannot be read."""
    mapping = Mapping(path)
    return walk(mapping.buffer, mapping.size).problems or []


__all__ = ["ArrayValue", "DEFAULT_ALIGNMENT", "GGUFFile", "HEADER_SIZE", "KeyValue", "Layout",
           "VALUE_TYPES", "type_name", "validate", "validate_bytes", "walk"]
