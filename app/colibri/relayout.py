"""Re-laying out a `.colibri` file: its quantised (and bf16) tensors rewritten in rows or in panels
(docs/format.md, "Quantised panels", "bf16 panels"), without going back to the checkpoint.

The two layouts hold the same blocks in the same number of bytes, so every tensor keeps its
offset and size: the copy is the source file byte for byte except the rearranged tensors' data
and, in their table entries, the dtype and CRC-32 fields (and the header's two CRCs over them).
The values, header, routing, tokenizer and metadata are those of the source. The engine opens
and validates the source (the one reader of the format); `colibri.convert.layout_target` decides
which tensors change; the output is written atomically (colibri.files).
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import IO, Callable

import numpy as np

from colibri import fileformat as ff
from colibri.convert import ConversionError, check_layout, layout_target
from colibri.files import atomic_write

# Fields of a tensor table entry (docs/format.md, "Tensor table"): after the 64-byte name, the
# u32 dtype, and the u32 crc32 at 0x78.
_ENTRY_DTYPE, _ENTRY_CRC = ff.TENSOR_NAME_MAX, 0x78
_COPY_CHUNK = 64 << 20


# The dtypes a layout rearranges, by the names the engine reports.
_LAID_OUT = {**ff.QUANT_BY_NAME, **{name: code for code, name in ff.BF16_NAMES.items()}}


def _rearranged(data: np.ndarray, dtype: int, to: int, n: int) -> np.ndarray:
    """A tensor's stored bytes of `dtype` in the layout of `to` (one a row dtype, the other its
    panel dtype)."""
    if to == ff.DTYPE_BF16X16:
        return ff.bf16_to_panels(data, n)
    if dtype == ff.DTYPE_BF16X16:
        return ff.bf16_from_panels(data, n).reshape(-1)
    if to in ff.ROWS_OF:
        return ff.to_panels(data, ff.ROWS_OF[to], n)
    return ff.from_panels(data, to, n).reshape(-1)


def relayout(src: str | os.PathLike[str], out_path: str | os.PathLike[str], layout: str,
             progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Write the `.colibri` file `src` to `out_path` with its quantised and bf16 tensors in
    `layout` (one of LAYOUTS, as layout_target decides per tensor); returns the names of the tensors
    rearranged. `out_path` may be `src`. Raises ConversionError for a file the engine refuses or
    a rearranged tensor whose data does not match its table CRC; nothing is left at `out_path`
    on failure (an existing file there is left untouched)."""
    from colibri.engine import Model
    from colibri.errors import ColibriError
    check_layout(layout)
    try:
        model = Model.open(src)
    except ColibriError as exc:
        raise ConversionError(f"{os.fspath(src)}: {exc}") from exc
    with model:
        image = model.bytes()
        data_offset = model.sections["data"].offset
        if model.sections["tensor_table"].end > data_offset:
            raise ConversionError(f"{model.path}: the tensor table lies after the tensor data "
                                  "(files Colibri writes have it before)")
        head = bytearray(image[:data_offset])  # header, routing and table: patched, written last
        changes = []
        for info in sorted(model.tensors, key=lambda t: t.offset):
            dtype = _LAID_OUT.get(info.dtype)
            to = layout_target(info.name, info.shape, dtype, layout) if dtype else None
            if to is not None and to != dtype:
                changes.append((info, dtype, to))

        def stream(out: IO[bytes]) -> None:
            cursor = 0
            for done, (info, dtype, to) in enumerate(changes, 1):
                for start in range(cursor, info.offset, _COPY_CHUNK):
                    out.write(image[start:min(info.offset, start + _COPY_CHUNK)])
                data = image[info.offset:info.offset + info.nbytes]
                if zlib.crc32(data) & 0xFFFFFFFF != info.crc32:
                    raise ConversionError(f"{model.path}: tensor '{info.name}': data does not "
                                          f"match its CRC-32 0x{info.crc32:08X}")
                raw = _rearranged(data, dtype, to, info.shape[-1])
                out.write(raw.tobytes())
                entry = info.table_offset
                struct.pack_into("<I", head, entry + _ENTRY_DTYPE, to)
                struct.pack_into("<I", head, entry + _ENTRY_CRC, zlib.crc32(raw) & 0xFFFFFFFF)
                cursor = info.offset + info.nbytes
                if progress is not None:
                    progress(done, len(changes))
            for start in range(cursor, len(image), _COPY_CHUNK):
                out.write(image[start:min(len(image), start + _COPY_CHUNK)])
            ff.refresh_checksums(head)
            out.seek(0)
            out.write(head)

        atomic_write(out_path, stream)
    return [info.name for info, _, _ in changes]
