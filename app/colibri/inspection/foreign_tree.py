"""The metadata of a GGUF file or safetensors checkpoint as a tree, walked as it is shown (Qt-free).

`metadata_tree(doc)` is the root `MetaNode` of a `ForeignDocument`. Every node has a key, a type,
a short value, and the byte range it comes from (`file` indexes `doc.file_paths()`; -1 offset:
none), so selecting it shows those bytes in the hexdump, as the `.colibri` header view does.
Children are produced on demand, `fetch(n)` at a time from a generator that resumes where it
stopped: a 151 000-token vocabulary or a 20 000-tensor JSON header costs only the rows shown.

GGUF: the fixed header; every key/value (arrays expand to their elements, strings and nested
arrays located one after the other as far as they are shown: `GGUFFile.array_items`); every
tensor info with its fields (name, n_dims, ne, type, offset); the data section. safetensors:
per file, the header length, the JSON header (`__metadata__` and every tensor's dtype, shape
and data_offsets) and the data; for a sharded checkpoint, the index as JSON too. JSON nodes are
found by stepping through the validated text with the json module's own decoder (`raw_decode`
from each value's first character), so each member's key offset and value span are exact.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from json.decoder import scanstring
from typing import Any

import numpy as np

from colibri.formats.gguf_file import VALUE_TYPES, ArrayValue, GGUFFile, KeyValue
from colibri.inspection.values import format_scalar

FETCH = 500          # children produced per fetch
VALUE_CHARS = 160    # a value's text is cut here
PREVIEW_ITEMS = 6    # elements of a long array or object shown in its parent's row

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class MetaNode:
    """One row of the tree (see the module docstring)."""

    def __init__(self, key: str, type: str, value: str, offset: int = -1, size: int = 0,
                 file: int = 0, children: Callable[[], Iterator[MetaNode]] | None = None,
                 count: int | None = None) -> None:
        self.key, self.type, self.value = key, type, value
        self.offset, self.size, self.file = offset, size, file
        self.count = count                 # number of children when known up front
        self.parent: MetaNode | None = None
        self.row = 0
        self.children: list[MetaNode] = []
        self._make = children
        self._iter: Iterator[MetaNode] | None = None
        self._done = children is None or count == 0

    def has_children(self) -> bool:
        return not self._done or bool(self.children)

    @property
    def exhausted(self) -> bool:
        return self._done

    def fetch(self, n: int = FETCH) -> list[MetaNode]:
        """The next up to `n` children (also appended to `children`)."""
        if self._done:
            return []
        if self._iter is None:
            assert self._make is not None
            self._iter = self._make()
        out = []
        for child in self._iter:
            child.parent, child.row = self, len(self.children)
            self.children.append(child)
            out.append(child)
            if len(out) >= n:
                break
        else:
            self._done = True
        return out

    def fetch_all(self) -> list[MetaNode]:
        while not self._done:
            self.fetch()
        return self.children

    def child(self, key: str) -> MetaNode:
        """The child called `key`, fetching as far as needed (KeyError when there is none)."""
        for c in self.children:
            if c.key == key:
                return c
        while not self._done:
            for c in self.fetch():
                if c.key == key:
                    return c
        raise KeyError(key)

    def __repr__(self) -> str:
        return f"MetaNode({self.key!r}, {self.type!r}, {self.value!r}, 0x{self.offset:X})"


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _cut(text: str) -> str:
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def _text(value: Any, vtype: int | str = "") -> str:
    """A scalar as the CLI shows it (f32 through float32's shortest repr)."""
    if isinstance(value, str):
        return _cut(json.dumps(value, ensure_ascii=False))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_scalar(np.float32(value) if vtype in (6, "f32") else np.float64(value))
    return str(value)


# ---------------------------------------------------------------------------------------------
# GGUF


def _gguf_array(f: GGUFFile, value: ArrayValue) -> Iterator[MetaNode]:
    start = 0
    while start < value.count:
        items = f.array_items(value, start, FETCH)
        for i, (pos, end, item) in enumerate(items, start):
            yield _gguf_value(f, f"[{i}]", value.element_type, item, pos, end)
        start += len(items)


def _gguf_value(f: GGUFFile, key: str, vtype: int, value: Any, offset: int,
                end: int) -> MetaNode:
    if isinstance(value, ArrayValue):
        head = f.array_items(value, 0, PREVIEW_ITEMS) if value.element_type != 9 else []
        shown = ", ".join(_text(v, value.element_type) for _p, _e, v in head)
        more = ", …" if value.count > len(head) else ""
        return MetaNode(key, f"{value.element_type_name}[{value.count}]",
                        _cut(f"[{shown}{more}]") if head or not value.count else
                        f"{value.count} arrays", offset, end - offset,
                        children=lambda: _gguf_array(f, value), count=value.count)
    return MetaNode(key, VALUE_TYPES[vtype][0], _text(value, vtype), offset, end - offset)


def _gguf_kv(f: GGUFFile, kv: KeyValue) -> MetaNode:
    node = _gguf_value(f, kv.key, kv.type, kv.value, kv.value_offset, kv.end)
    node.offset, node.size = kv.offset, kv.end - kv.offset   # the key/value, key included
    return node


def _gguf_tensor_info(f: GGUFFile, name: str) -> MetaNode:
    t = f.tensor_info(name)
    ne = f.ne(name)
    n = len(name.encode("utf-8"))
    at = t.info_offset
    dims = at + 12 + n
    fields = [MetaNode("name", "string", _text(name), at, 8 + n),
              MetaNode("n_dims", "u32", str(len(ne)), at + 8 + n, 4)]
    fields += [MetaNode(f"ne[{d}]", "u64", str(v), dims + 8 * d, 8) for d, v in enumerate(ne)]
    fields += [MetaNode("type", "u32", f"{f.ggml_type(name).value} ({t.dtype})",
                        dims + 8 * len(ne), 4),
               MetaNode("offset", "u64", f"{t.offset - f.layout.data_offset} (absolute "
                        f"0x{t.offset:X}, {t.nbytes:,} bytes)", dims + 8 * len(ne) + 4, 8)]
    return MetaNode(name, f"{t.dtype} {list(t.shape)}", f"data at 0x{t.offset:X}, "
                    f"{t.nbytes:,} bytes", at, 24 + n + 8 * len(ne),
                    children=lambda: iter(fields), count=len(fields))


def _gguf_tree(f: GGUFFile) -> MetaNode:
    lay = f.layout
    kvs, tensors = f.key_values, f.tensors
    header = [MetaNode("magic", "char[4]", "'GGUF'", 0, 4),
              MetaNode("version", "u32", str(lay.version), 4, 4),
              MetaNode("tensor_count", "u64", str(lay.tensor_count), 8, 8),
              MetaNode("kv_count", "u64", str(lay.kv_count), 16, 8)]
    kv_end = kvs[-1].end if kvs else 24
    nodes = [MetaNode("header", "GGUF", f"version {lay.version}", 0, 24,
                      children=lambda: iter(header), count=len(header)),
             MetaNode("key/values", _count(len(kvs), "key"), f.architecture or "", 24,
                      kv_end - 24,
                      children=lambda: (_gguf_kv(f, kv) for kv in kvs), count=len(kvs))]
    info_start = kv_end
    nodes.append(MetaNode("tensor infos", _count(len(tensors), "tensor"),
                          f"alignment {lay.alignment}", info_start, lay.info_end - info_start,
                          children=lambda: (_gguf_tensor_info(f, t.name) for t in tensors),
                          count=len(tensors)))
    data = max(0, f.size - lay.data_offset)
    nodes.append(MetaNode("data", _count(data, "byte"), f"from 0x{lay.data_offset:X}",
                          lay.data_offset, data))
    return MetaNode("", "", "", children=lambda: iter(nodes), count=len(nodes))


# ---------------------------------------------------------------------------------------------
# JSON (safetensors headers, the shard index)


class _Json:
    """A validated JSON text and where its characters are in a file (byte offsets)."""

    def __init__(self, text: str, base: int, file: int) -> None:
        self.text, self.base, self.file = text, base, file
        self._bytes_before: np.ndarray | None = None   # for non-ASCII text

    def at(self, i: int) -> int:
        """The file offset of character `i`."""
        if self.text.isascii():
            return self.base + i
        if self._bytes_before is None:
            points = np.frombuffer(self.text.encode("utf-32-le"), dtype="<u4")
            sizes = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
            self._bytes_before = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        return self.base + int(self._bytes_before[i])

    def members(self, pos: int) -> Iterator[tuple[str, int, int, int, Any]]:
        """(key, member start, value start, value end, value) of the object or array opening
        at `pos`, one at a time ('[i]' keys for an array's elements)."""
        text = self.text
        is_object = text[pos] == "{"
        closing = "}" if is_object else "]"
        pos = _WS.match(text, pos + 1).end()
        i = 0
        while text[pos] != closing:
            start = pos
            if is_object:
                key, pos = scanstring(text, pos + 1)
                pos = _WS.match(text, pos).end()
                pos = _WS.match(text, pos + 1).end()   # past the colon
            else:
                key = f"[{i}]"
            value, end = _DECODER.raw_decode(text, pos)
            yield key, start, pos, end, value
            i += 1
            pos = _WS.match(text, end).end()
            if text[pos] == ",":
                pos = _WS.match(text, pos + 1).end()

    def node(self, key: str, start: int, value_start: int, end: int, value: Any) -> MetaNode:
        offset = self.at(start)
        size = self.at(end) - offset
        if isinstance(value, (dict, list)):
            kind = (f"object{{{len(value)}}}" if isinstance(value, dict)
                    else f"array[{len(value)}]")
            return MetaNode(key, kind, _preview(value), offset, size, self.file,
                            children=lambda: self.children(value_start), count=len(value))
        kind = {str: "string", bool: "bool", type(None): "null"}.get(type(value), "number")
        return MetaNode(key, kind, _text(value), offset, size, self.file)

    def children(self, pos: int) -> Iterator[MetaNode]:
        for key, start, value_start, end, value in self.members(pos):
            yield self.node(key, start, value_start, end, value)


def _preview(value: dict[str, Any] | list[Any]) -> str:
    """The first few members of an object or array, as compact JSON."""
    if isinstance(value, dict):
        items = [f"{json.dumps(k, ensure_ascii=False)}: {_short_json(v)}"
                 for k, v in list(value.items())[:PREVIEW_ITEMS]]
        return _cut("{" + ", ".join(items) + (", …}" if len(value) > len(items) else "}"))
    items = [_short_json(v) for v in value[:PREVIEW_ITEMS]]
    return _cut("[" + ", ".join(items) + (", …]" if len(value) > len(items) else "]"))


def _short_json(value: Any) -> str:
    if isinstance(value, dict):
        return "{…}" if value else "{}"
    if isinstance(value, list) and len(value) > PREVIEW_ITEMS:
        return "[…]"
    return json.dumps(value, ensure_ascii=False)


def _shard_nodes(shard: Any, file: int) -> list[MetaNode]:
    head = shard.header
    n = head.header_length
    text = bytes(shard.read(8, n)).decode("utf-8")
    doc = _Json(text, 8, file)
    data = shard.size - head.data_offset
    meta = " and __metadata__" if head.metadata is not None else ""
    tensors = _count(len(head.tensors), "tensor")
    return [MetaNode("header length", "u64", f"{n:,}", 0, 8, file),
            MetaNode("header", "JSON object", tensors + meta, 8, n, file,
                     children=lambda: doc.children(0),
                     count=len(head.tensors) + (head.metadata is not None)),
            MetaNode("data", _count(data, "byte"), tensors, head.data_offset, data, file)]


def _safetensors_tree(ckpt: Any, index_file: int | None, index_path: str | None) -> MetaNode:
    files = ckpt.files
    if len(files) == 1 and index_path is None:
        nodes = _shard_nodes(files[0], 0)
    else:
        nodes = [MetaNode(os.path.basename(f.path), "safetensors",
                          f"{_count(len(f.tensors), 'tensor')}, {_count(f.size, 'byte')}", 0,
                          f.size, i,
                          children=lambda f=f, i=i: iter(_shard_nodes(f, i)), count=3)
                 for i, f in enumerate(files)]
        if index_path is not None and index_file is not None:
            with open(index_path, "rb") as handle:
                raw = handle.read()
            index = _Json(raw.decode("utf-8"), 0, index_file)
            top = _WS.match(index.text).end()
            nodes.append(MetaNode(os.path.basename(index_path), "index",
                                  f"{_count(len(ckpt.tensors), 'tensor')} in "
                                  f"{_count(len(files), 'shard')}", 0,
                                  len(raw), index_file,
                                  children=lambda: (index.node(*m) for m in index.members(top))))
    return MetaNode("", "", "", children=lambda: iter(nodes), count=len(nodes))


def metadata_tree(doc: Any) -> MetaNode:
    """The root of `doc`'s metadata tree (no children when the file did not open)."""
    f = doc.file
    if f is None:
        return MetaNode("", "", "", count=0)
    if doc.format == "gguf":
        return _gguf_tree(f)
    paths = doc.file_paths()
    index_path = getattr(f.layout, "index_path", None)
    index_file = paths.index(index_path) if index_path in paths else None
    return _safetensors_tree(f, index_file, index_path if index_file is not None else None)


__all__ = ["FETCH", "MetaNode", "metadata_tree"]
