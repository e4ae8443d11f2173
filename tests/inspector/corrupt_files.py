"""The Inspector's corpus of broken files: one per class the engine's test corpus covers.

`corrupt_cases(image)` takes a valid tiny Mixtral image (the `tiny_image` fixture) and returns a
`CorruptCase` per problem class, each with the exact code the engine reports, the tensor
concerned and whether only the data checks (checksums / NaN scan) find it. The edits mirror
engine_c/tests/test_format.c; after editing a header or table byte the header and table CRCs are
refreshed so the file reports the intended problem, not a checksum error.
"""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from colibri.fileformat import refresh_checksums


@dataclass(frozen=True)
class CorruptCase:
    name: str
    data: bytes
    code: str            # e.g. "COL_ERR_BAD_MAGIC"
    tensor: str = ""     # the tensor the problem names ("" when none)
    data_check: bool = False   # found only by the data checks (checksums / NaN scan)

    def write(self, directory: Path) -> Path:
        path = directory / f"{self.name}.colibri"
        path.write_bytes(self.data)
        return path


def _entry(image: bytearray, name: str) -> int:
    """File offset of tensor `name`'s 128-byte table entry."""
    (count,) = struct.unpack_from("<I", image, 0x14)
    (table,) = struct.unpack_from("<Q", image, 0x28)
    for i in range(count):
        e = table + 128 * i
        if bytes(image[e:e + 64]).rstrip(b"\0").decode("ascii") == name:
            return e
    raise KeyError(name)


def _u64(image: bytearray, offset: int) -> int:
    return int(struct.unpack_from("<Q", image, offset)[0])


def _edited(image: bytearray, edit: list[tuple[int, str, int]]) -> bytes:
    out = bytearray(image)
    for offset, code, value in edit:
        struct.pack_into(code, out, offset, value)
    refresh_checksums(out)
    return bytes(out)


def corrupt_cases(image: bytearray) -> list[CorruptCase]:
    """Every corrupt-file class, built from a valid tiny Mixtral f32 image."""
    img = bytearray(image)
    size = len(img)
    cases = [
        CorruptCase("not_colibri_random", bytes(random.Random(7).randrange(256)
                                                for _ in range(1024)), "COL_ERR_BAD_MAGIC"),
        CorruptCase("not_colibri_zip", b"PK\x03\x04" + bytes(range(20)) * 40,
                    "COL_ERR_BAD_MAGIC"),
        CorruptCase("truncated", bytes(img[:size // 2]), "COL_ERR_TRUNCATED"),
        CorruptCase("bad_version", _edited(img, [(4, "<I", 3)]), "COL_ERR_BAD_VERSION"),
    ]
    e = _entry(img, "output")
    cases.append(CorruptCase("tensor_out_of_bounds",
                             _edited(img, [(e + 0x68, "<Q", (size + 63) // 64 * 64 + 64)]),
                             "COL_ERR_TENSOR_BOUNDS", "output"))
    cases.append(CorruptCase("misaligned", _edited(img, [(e + 0x68, "<Q", _u64(img, e + 0x68) + 4)]),
                             "COL_ERR_MISALIGNED", "output"))
    e = _entry(img, "layers.0.attn_k")
    cases.append(CorruptCase("size_mismatch",
                             _edited(img, [(e + 0x70, "<Q", _u64(img, e + 0x70) - 4)]),
                             "COL_ERR_SIZE_MISMATCH", "layers.0.attn_k"))
    k_data = _u64(img, e + 0x68)
    e = _entry(img, "layers.0.attn_v")
    cases.append(CorruptCase("overlap", _edited(img, [(e + 0x68, "<Q", k_data)]),
                             "COL_ERR_OVERLAP", "layers.0.attn_v"))
    e = _entry(img, "layers.0.moe_w3")
    missing = bytearray(img)
    missing[e + 14] = ord("9")
    refresh_checksums(missing)
    cases.append(CorruptCase("missing_tensor", bytes(missing), "COL_ERR_MISSING_TENSOR",
                             "layers.0.moe_w3"))
    e = _entry(img, "layers.0.moe_gate")
    n_experts, d_model = _u64(img, e + 0x48), _u64(img, e + 0x50)
    cases.append(CorruptCase("transposed_gate",
                             _edited(img, [(e + 0x48, "<Q", d_model), (e + 0x50, "<Q", n_experts)]),
                             "COL_ERR_SHAPE", "layers.0.moe_gate"))
    e = _entry(img, "layers.0.moe_w2")
    flipped = bytearray(img)
    flipped[_u64(img, e + 0x68) + 5] ^= 0x40
    cases.append(CorruptCase("checksum_mismatch", bytes(flipped), "COL_ERR_CHECKSUM",
                             "layers.0.moe_w2", data_check=True))
    e = _entry(img, "layers.0.attn_q")
    nan = bytearray(img)
    struct.pack_into("<f", nan, _u64(img, e + 0x68) + 12, float("nan"))
    # Keep the CRC right so the only finding is the NaN.
    start, nbytes = _u64(nan, e + 0x68), _u64(nan, e + 0x70)
    struct.pack_into("<I", nan, e + 0x78, zlib.crc32(bytes(nan[start:start + nbytes])))
    refresh_checksums(nan)
    cases.append(CorruptCase("nan", bytes(nan), "COL_ERR_NONFINITE", "layers.0.attn_q",
                             data_check=True))
    return cases


CASE_NAMES = ("not_colibri_random", "not_colibri_zip", "truncated", "bad_version",
              "tensor_out_of_bounds", "misaligned", "size_mismatch", "overlap", "missing_tensor",
              "transposed_gate", "checksum_mismatch", "nan")
