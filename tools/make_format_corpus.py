#!/usr/bin/env python3
"""Generate tests/corpus/formats/: damaged GGUF and safetensors files, one per error class.

Like tools/make_corpus.py for `.colibri`: one small valid file of each format, built here byte by
byte (so every offset is known from the construction, not read back from the validator), then
one file or checkpoint directory per broken thing, each with the finding the validator must
report first: status code name, absolute byte offset, tensor and a message substring. `--check`
runs `colibri.formats.validate` on every entry and fails on any difference.

    python tools/make_format_corpus.py           # write tests/corpus/formats/ (and check it)
    python tools/make_format_corpus.py --check   # only check the committed files
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))
OUT = ROOT / "tests" / "corpus" / "formats"


@dataclass
class Entry:
    file: str
    code: str
    offset: int
    message: str
    description: str
    tensor: str = ""
    severity: str = "error"
    nan_check: bool = False
    files: dict[str, bytes] = field(default_factory=dict, repr=False)  # a directory's files
    data: bytes = field(default=b"", repr=False)

    def manifest(self) -> dict:
        return {"file": self.file, "code": self.code, "severity": self.severity,
                "offset": self.offset, "tensor": self.tensor, "message": self.message,
                "nan_check": self.nan_check, "description": self.description}


# ---------------------------------------------------------------------------------------------
# GGUF, built by hand


def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


class Gguf:
    """A GGUF image with the offset of every structure recorded as it is built."""

    def __init__(self, kvs: list[tuple[str | bytes, int, bytes]],
                 tensors: list[tuple[str | bytes, list[int], int, bytes]], version: int = 3,
                 alignment: int = 32, offsets: list[int] | None = None,
                 counts: tuple[int, int] | None = None) -> None:
        out = bytearray(b"GGUF" + struct.pack("<I", version))
        n_t, n_kv = counts if counts is not None else (len(tensors), len(kvs))
        out += struct.pack("<QQ", n_t, n_kv)
        self.kv_at, self.info_at, self.type_at, self.offset_at = [], [], [], []
        for key, vtype, payload in kvs:
            self.kv_at.append(len(out))
            out += gstr(key) + struct.pack("<I", vtype) + payload
        rel = 0
        rels = []
        for i, (name, ne, gtype, data) in enumerate(tensors):
            self.info_at.append(len(out))
            out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n)
                                                                      for n in ne)
            self.type_at.append(len(out))
            out += struct.pack("<I", gtype)
            self.offset_at.append(len(out))
            r = offsets[i] if offsets is not None else rel
            rels.append(r)
            out += struct.pack("<Q", r)
            rel += -(-len(data) // alignment) * alignment
        self.data_offset = -(-len(out) // alignment) * alignment
        out += bytes(self.data_offset - len(out))
        for r, (_, _, _, data) in zip(rels, tensors):
            end = self.data_offset + r + len(data)
            if len(out) < end:
                out += bytes(end - len(out))
            out[self.data_offset + r:end] = data
        self.image = bytes(out)


U32, STRING, ARRAY, F32T = 4, 8, 9, 6


def base_kvs() -> list[tuple[str | bytes, int, bytes]]:
    return [("general.architecture", STRING, gstr("llama")),
            ("general.alignment", U32, struct.pack("<I", 32)),
            ("llama.block_count", U32, struct.pack("<I", 1)),
            ("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 3)
             + gstr("a") + gstr("b") + gstr("ab"))]


def base_tensors() -> list[tuple[str | bytes, list[int], int, bytes]]:
    rng = np.random.default_rng(5)
    f32 = rng.standard_normal(64).astype("<f4").tobytes()          # ne [32, 2]
    q8 = b"".join(struct.pack("<e", 0.01) + rng.integers(-127, 128, 32, dtype=np.int8).tobytes()
                  for _ in range(2))                                 # Q8_0 ne [32, 2]
    f16 = rng.standard_normal(8).astype("<f2").tobytes()            # ne [8]
    return [("blk.0.attn_q.weight", [32, 2], 0, f32), ("blk.0.ffn_up.weight", [32, 2], 8, q8),
            ("output_norm.weight", [8], 1, f16)]


def gguf_entries() -> list[Entry]:
    out: list[Entry] = []
    base = Gguf(base_kvs(), base_tensors())
    out.append(Entry("valid.gguf", "COL_OK", 0, "", "the clean base GGUF every other entry breaks",
                     nan_check=True, data=base.image))
    out.append(Entry("truncated_header.gguf", "COL_ERR_TRUNCATED", 10, "shorter than the 24-byte",
                     "cut inside the fixed header", data=base.image[:10]))
    img = bytearray(base.image)
    struct.pack_into("<I", img, 4, 4)
    out.append(Entry("bad_version.gguf", "COL_ERR_BAD_VERSION", 4, "GGUF version 4",
                     "a version this reader does not know", data=bytes(img)))
    img = bytearray(base.image)
    struct.pack_into(">I", img, 4, 3)
    out.append(Entry("big_endian.gguf", "COL_ERR_UNSUPPORTED", 4, "big-endian GGUF",
                     "a big-endian file (s390x)", data=bytes(img)))
    img = bytearray(base.image)
    struct.pack_into("<Q", img, 16, 1 << 40)
    out.append(Entry("kv_count_huge.gguf", "COL_ERR_LIMIT", 16, "kv_count 1099511627776",
                     "kv_count near 2^40", data=bytes(img)))
    img = bytearray(base.image)
    struct.pack_into("<Q", img, 8, 1 << 33)
    out.append(Entry("tensor_count_huge.gguf", "COL_ERR_LIMIT", 8, "tensor_count 8589934592",
                     "tensor_count near 2^33", data=bytes(img)))
    img = bytearray(base.image)
    struct.pack_into("<Q", img, base.kv_at[1], 1 << 50)
    out.append(Entry("key_length_beyond.gguf", "COL_ERR_TRUNCATED", base.kv_at[1],
                     "runs past the end of the file", "a key length of 2^50",
                     data=bytes(img)))
    kvs = base_kvs()
    kvs[2] = ("llama.block_count", 13, struct.pack("<I", 1))
    g = Gguf(kvs, base_tensors())
    out.append(Entry("unknown_value_type.gguf", "COL_ERR_DTYPE", g.kv_at[2] + 8 + 17,
                     "unknown value type 13", "metadata value type 13", data=g.image))
    kvs = base_kvs()
    kvs[3] = ("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 1 << 40))
    g = Gguf(kvs, base_tensors())
    count_at = g.kv_at[3] + 8 + len("tokenizer.ggml.tokens") + 4 + 4
    out.append(Entry("array_count_beyond.gguf", "COL_ERR_TRUNCATED", count_at,
                     "1099511627776 elements of type string", "an array count of 2^40",
                     data=g.image))
    nested = struct.pack("<IQ", U32, 1) + struct.pack("<I", 7)
    for _ in range(9):
        nested = struct.pack("<IQ", ARRAY, 1) + nested
    kvs = base_kvs() + [("deep", ARRAY, nested)]
    g = Gguf(kvs, base_tensors())
    deep_at = g.kv_at[4] + 8 + 4 + 4 + 9 * 12
    out.append(Entry("nested_too_deep.gguf", "COL_ERR_LIMIT", deep_at - 12 + 0,
                     "arrays nested deeper than 8", "arrays nested 10 deep", data=g.image))
    kvs = base_kvs() + [("llama.block_count", U32, struct.pack("<I", 2))]
    g = Gguf(kvs, base_tensors())
    out.append(Entry("duplicate_key.gguf", "COL_ERR_NAME", g.kv_at[4],
                     "duplicate metadata key 'llama.block_count'", "a key written twice",
                     data=g.image))
    kvs = base_kvs()
    kvs[1] = ("general.alignment", U32, struct.pack("<I", 48))
    g = Gguf(kvs, base_tensors())
    out.append(Entry("alignment_not_power_of_two.gguf", "COL_ERR_HEADER",
                     g.kv_at[1] + 8 + len("general.alignment") + 4, "48 is not a power of two",
                     "general.alignment 48", data=g.image))
    kvs = base_kvs()
    kvs[1] = ("general.alignment", STRING, gstr("32"))
    g = Gguf(kvs, base_tensors())
    out.append(Entry("alignment_wrong_type.gguf", "COL_ERR_HEADER",
                     g.kv_at[1] + 8 + len("general.alignment"), "has type string, expected u32",
                     "general.alignment as a string", data=g.image))
    tensors = base_tensors()
    tensors[2] = ("blk.0.attn_q.weight", [8], 1, tensors[2][3])
    g = Gguf(base_kvs(), tensors)
    out.append(Entry("duplicate_tensor.gguf", "COL_ERR_NAME", g.info_at[2],
                     "duplicate tensor name 'blk.0.attn_q.weight'", "two tensors, one name",
                     tensor="blk.0.attn_q.weight", data=g.image))
    tensors = base_tensors()
    long_name = "blk.0." + "x" * 70
    tensors[2] = (long_name, [8], 1, tensors[2][3])
    g = Gguf(base_kvs(), tensors)
    out.append(Entry("name_too_long.gguf", "COL_ERR_NAME", g.info_at[2], "at most 63",
                     "a 76-byte tensor name", tensor=long_name, data=g.image))
    tensors = base_tensors()
    tensors[2] = ("output_norm.weight", [8, 1, 1, 1, 1], 1, tensors[2][3])
    g = Gguf(base_kvs(), tensors)
    out.append(Entry("n_dims_5.gguf", "COL_ERR_LIMIT",
                     g.info_at[2] + 8 + len("output_norm.weight"), "n_dims 5 > 4",
                     "five dimensions", tensor="output_norm.weight", data=g.image))
    tensors = base_tensors()
    tensors[0] = ("blk.0.attn_q.weight", [32, 2], 4, tensors[0][3])
    g = Gguf(base_kvs(), tensors)
    out.append(Entry("unknown_ggml_type.gguf", "COL_ERR_DTYPE", g.type_at[0],
                     "unknown ggml type 4", "ggml type 4 (the removed Q4_2)",
                     tensor="blk.0.attn_q.weight", data=g.image))
    tensors = base_tensors()
    tensors[1] = ("blk.0.ffn_up.weight", [30, 2], 8, tensors[1][3])
    g = Gguf(base_kvs(), tensors)
    out.append(Entry("block_shape.gguf", "COL_ERR_SHAPE", g.info_at[1],
                     "ne[0] = 30 is not a multiple of Q8_0's block of 32", "a Q8_0 row of 30",
                     tensor="blk.0.ffn_up.weight", data=g.image))
    tensors = base_tensors() + [("blk.0.empty.weight", [0, 1 << 62], 0, b"")]
    g = Gguf(base_kvs(), tensors)
    out.append(Entry("empty_dimension_huge.gguf", "COL_ERR_LIMIT", g.info_at[3],
                     "describes more than 2^63 bytes", "ne [0, 2^62]: no elements, yet no "
                     "array of that shape can exist", tensor="blk.0.empty.weight", data=g.image))
    g = Gguf(base_kvs(), base_tensors(), offsets=[0, 260, 320])
    out.append(Entry("misaligned.gguf", "COL_ERR_MISALIGNED", g.offset_at[1] + 0,
                     "offset 260 is not a multiple of the alignment 32", "offset 260",
                     tensor="blk.0.ffn_up.weight", data=g.image))
    g = Gguf(base_kvs(), base_tensors(), offsets=[0, 128, 256])
    out.append(Entry("overlap.gguf", "COL_ERR_OVERLAP", g.offset_at[1],
                     "overlaps the tensor before it", "the second tensor inside the first",
                     tensor="blk.0.ffn_up.weight", data=g.image))
    g = Gguf(base_kvs(), base_tensors(), offsets=[0, 320, 416])
    out.append(Entry("gap.gguf", "COL_ERR_SECTION_BOUNDS", g.offset_at[1],
                     "llama.cpp expects 256", "64 unused bytes between two tensors",
                     tensor="blk.0.ffn_up.weight", data=g.image))
    cut = base.data_offset + 256 + 40
    out.append(Entry("truncated_data.gguf", "COL_ERR_TRUNCATED", cut,
                     "but tensor 'blk.0.ffn_up.weight' ends at byte", "the download stopped early",
                     tensor="blk.0.ffn_up.weight", data=base.image[:cut]))
    kvs = base_kvs()[1:]
    g = Gguf(kvs, base_tensors())
    out.append(Entry("no_architecture.gguf", "COL_ERR_HEADER", 24,
                     "no general.architecture key", "general.architecture missing",
                     severity="warning", data=g.image))
    g = Gguf(base_kvs(), base_tensors())
    out.append(Entry("trailing.gguf", "COL_ERR_SECTION_BOUNDS", g.data_offset + 384,
                     "belong to nothing", "bytes after the last tensor", severity="warning",
                     data=g.image + bytes(32)))
    tensors = base_tensors()
    vals = np.frombuffer(tensors[0][3], "<f4").copy()
    vals[5] = np.nan
    tensors[0] = (tensors[0][0], tensors[0][1], 0, vals.tobytes())
    g = Gguf(base_kvs(), tensors)
    out.append(Entry("nonfinite.gguf", "COL_ERR_NONFINITE", g.data_offset + 20,
                     "1 NaN/Inf value(s), the first at element 5", "a NaN in an f32 tensor",
                     tensor="blk.0.attn_q.weight", nan_check=True, data=g.image))
    return out


# ---------------------------------------------------------------------------------------------
# safetensors


def st_image(header: dict | str | bytes, data: bytes, pad: bool = True) -> tuple[bytes, bytes]:
    """(file bytes, header bytes) with the header padded with spaces to 8 bytes."""
    raw = header if isinstance(header, bytes) else (
        header if isinstance(header, str) else json.dumps(header)).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data, raw


def key_at(raw: bytes, name: str) -> int:
    return 8 + raw.index(json.dumps(name).encode())


def base_st() -> tuple[dict, bytes]:
    rng = np.random.default_rng(6)
    a = rng.standard_normal(8).astype("<f4").tobytes()
    b = rng.standard_normal(4).astype("<f2").tobytes()
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 32]},
              "b": {"dtype": "F16", "shape": [4], "data_offsets": [32, 40]}}
    return header, a + b


def st_entries() -> list[Entry]:
    out: list[Entry] = []
    header, data = base_st()
    img, raw = st_image(header, data)
    out.append(Entry("valid.safetensors", "COL_OK", 0, "", "the clean base file", nan_check=True,
                     data=img))
    out.append(Entry("header_length_beyond.safetensors", "COL_ERR_TRUNCATED", 0,
                     "does not fit in the file", "header length past the end",
                     data=struct.pack("<Q", 1 << 40) + img[8:]))
    bad = raw.replace(b'"shape": [4]', b'"shape": [4}')
    out.append(Entry("not_json.safetensors", "COL_ERR_HEADER", 8 + bad.index(b"}, \"data"),
                     "not valid JSON", "a bracket typo", data=struct.pack("<Q", len(bad)) + bad
                     + data))
    bad = raw.replace(b'"format"', b'"form\xff\xfe"')
    out.append(Entry("not_utf8.safetensors", "COL_ERR_HEADER", 8 + bad.index(b"\xff"),
                     "not UTF-8", "invalid UTF-8 in the header",
                     data=struct.pack("<Q", len(bad)) + bad + data))
    dup = json.dumps(header)[:-1] + ', "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    img2, raw2 = st_image(dup, data)
    out.append(Entry("duplicate_name.safetensors", "COL_ERR_NAME", key_at(raw2, "a"),
                     "name 'a' appears more than once", "a name written twice", tensor="a",
                     data=img2))
    h = json.loads(json.dumps(header))
    h["b"]["dtype"] = "F12"
    img2, raw2 = st_image(h, data)
    out.append(Entry("unknown_dtype.safetensors", "COL_ERR_DTYPE", key_at(raw2, "b"),
                     "dtype F12 not supported", "dtype F12", tensor="b", data=img2))
    h = json.loads(json.dumps(header))
    h["b"]["shape"] = [-4]
    img2, raw2 = st_image(h, data)
    out.append(Entry("bad_shape.safetensors", "COL_ERR_SHAPE", key_at(raw2, "b"),
                     "is not a list of non-negative integers", "a negative dimension",
                     tensor="b", data=img2))
    h = json.loads(json.dumps(header))
    h["e"] = {"dtype": "F32", "shape": [0, 1 << 62], "data_offsets": [0, 0]}
    img2, raw2 = st_image(h, data)
    out.append(Entry("empty_dimension_huge.safetensors", "COL_ERR_LIMIT", key_at(raw2, "e"),
                     "describes more than 2^63 bytes", "shape [0, 2^62]: no bytes, yet no "
                     "array of that shape can exist", tensor="e", data=img2))
    h = json.loads(json.dumps(header))
    h["b"]["shape"] = [3]
    img2, raw2 = st_image(h, data)
    out.append(Entry("size_mismatch.safetensors", "COL_ERR_SIZE_MISMATCH", key_at(raw2, "b"),
                     "8 bytes of data, but shape [3] of F16 needs 6", "shape and range disagree",
                     tensor="b", data=img2))
    h = json.loads(json.dumps(header))
    h["b"]["data_offsets"] = [32, 48]
    h["b"]["shape"] = [8]
    img2, raw2 = st_image(h, data)
    out.append(Entry("beyond_data.safetensors", "COL_ERR_TENSOR_BOUNDS", key_at(raw2, "b"),
                     "outside the data region of 40 bytes", "a range past the end", tensor="b",
                     data=img2))
    h = json.loads(json.dumps(header))
    h["b"]["data_offsets"] = [24, 32]
    img2, raw2 = st_image(h, data[:32])
    out.append(Entry("overlap.safetensors", "COL_ERR_OVERLAP", key_at(raw2, "b"),
                     "overlap the tensor before it", "two ranges sharing bytes", tensor="b",
                     data=img2))
    h = json.loads(json.dumps(header))
    h["b"]["data_offsets"] = [40, 48]
    img2, raw2 = st_image(h, data[:32] + bytes(8) + data[32:])
    out.append(Entry("gap.safetensors", "COL_ERR_SECTION_BOUNDS", key_at(raw2, "b"),
                     "leaving bytes [32, 40) of the data to no tensor", "8 unused bytes",
                     tensor="b", data=img2))
    img2, raw2 = st_image(header, data + bytes(16))
    out.append(Entry("trailing.safetensors", "COL_ERR_SECTION_BOUNDS", 8 + len(raw2) + 40,
                     "16 byte(s) after the last tensor", "bytes after the last tensor",
                     data=img2))
    h = json.loads(json.dumps(header))
    h["__metadata__"] = {"format": 1}
    img2, raw2 = st_image(h, data)
    out.append(Entry("metadata_not_strings.safetensors", "COL_ERR_HEADER",
                     key_at(raw2, "__metadata__"), "__metadata__ is not an object of strings",
                     "a number in __metadata__", data=img2))
    vals = np.frombuffer(data[:32], "<f4").copy()
    vals[6] = np.inf
    img2, raw2 = st_image(header, vals.tobytes() + data[32:])
    out.append(Entry("nonfinite.safetensors", "COL_ERR_NONFINITE", 8 + len(raw2) + 24,
                     "1 NaN/Inf value(s), the first at element 6", "an Inf in an f32 tensor",
                     tensor="a", nan_check=True, data=img2))

    # Checkpoints: an index and its shards.
    shard1, _ = st_image({"a": header["a"]}, data[:32])
    shard2, _ = st_image({"b": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}},
                         data[32:])
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")

    def index(weight_map: dict, total: int = 40) -> bytes:
        return json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                          indent=2).encode()

    good = {"a": names[0], "b": names[1]}
    out.append(Entry("sharded", "COL_OK", 0, "", "a valid two-shard checkpoint", nan_check=True,
                     files={"model.safetensors.index.json": index(good), names[0]: shard1,
                            names[1]: shard2}))
    out.append(Entry("missing_shard", "COL_ERR_MISSING_TENSOR", 0,
                     f"shard '{names[1]}' (listed for 1 tensor(s)) does not exist",
                     "the index lists a shard that is not there",
                     files={"model.safetensors.index.json": index(good), names[0]: shard1}))
    out.append(Entry("index_wrong_shard", "COL_ERR_MISSING_TENSOR", 0,
                     f"maps tensor 'b' to '{names[0]}', which does not contain it",
                     "the index points at the wrong shard", tensor="b",
                     files={"model.safetensors.index.json": index({"a": names[0], "b": names[0]}),
                            names[0]: shard1, names[1]: shard2}))
    out.append(Entry("shard_duplicate", "COL_ERR_NAME", 8 + st_image({"a": header["a"]},
                                                                      b"")[1].index(b'"a"'),
                     f"tensor 'a' also in {names[0]}", "one tensor in two shards", tensor="a",
                     files={"model.safetensors.index.json": index(good), names[0]: shard1,
                            names[1]: st_image({"a": header["a"]}, data[:32])[0]}))
    out.append(Entry("index_path_traversal", "COL_ERR_NAME", 0, "is not a file name",
                     "a shard name that leaves the directory",
                     files={"model.safetensors.index.json": index({"a": "../secret.safetensors"}),
                            names[0]: shard1}))
    out.append(Entry("index_not_json", "COL_ERR_HEADER", 0, "index is not valid UTF-8 JSON",
                     "a truncated index",
                     files={"model.safetensors.index.json": index(good)[:20], names[0]: shard1,
                            names[1]: shard2}))
    out.append(Entry("index_total_size", "COL_ERR_SIZE_MISMATCH", 0,
                     "total_size 4000, but the tensors hold 40 bytes",
                     "the index's total_size disagrees", severity="warning",
                     files={"model.safetensors.index.json": index(good, 4000), names[0]: shard1,
                            names[1]: shard2}))
    return out


def entries() -> list[Entry]:
    return gguf_entries() + st_entries()


def write() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    all_entries = entries()
    for e in all_entries:
        if e.files:
            (OUT / e.file).mkdir()
            for name, data in e.files.items():
                (OUT / e.file / name).write_bytes(data)
        else:
            (OUT / e.file).write_bytes(e.data)
    (OUT / "manifest.json").write_text(json.dumps([e.manifest() for e in all_entries],
                                                  indent=2) + "\n")


def check() -> int:
    from colibri import formats

    manifest = json.loads((OUT / "manifest.json").read_text())
    bad = 0
    for m in manifest:
        _, problems = formats.validate(OUT / m["file"], nan_check=m["nan_check"])
        errs = [p for p in problems if p.severity == "error"]
        first = errs[0] if errs else (problems[0] if problems else None)
        if m["code"] == "COL_OK":
            ok = problems == []
        else:
            ok = first is not None and (first.code_name, first.severity, first.offset,
                                        first.tensor) == (m["code"], m["severity"], m["offset"],
                                                          m["tensor"]) and (
                m["message"] in first.message)
        if not ok:
            bad += 1
            print(f"MISMATCH {m['file']}: expected {m['code']} {m['severity']} at "
                  f"{m['offset']} '{m['tensor']}' ~{m['message']!r}; got {first}")
    print(f"{len(manifest)} entries, {bad} mismatch(es)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if not args.check:
        write()
    return check()


if __name__ == "__main__":
    raise SystemExit(main())
