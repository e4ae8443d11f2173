"""Decoding raw bytes as numbers, for the value inspector and "copy as" (Qt-free).

Owns one table of little-endian scalar types (u8..u64, i8..i64, f16, bf16, f32, f64) and three
uses of it: `inspect_bytes` decodes every type at a cursor (a type whose bytes run past the end
of the data reads 'n/a'), `format_hex` and `format_values` render a selected byte range as text
for the clipboard, and `parse_offset` reads a go-to-offset entry (decimal or 0x hex). The file
format is little-endian everywhere (docs/format.md), so no byte-order switch is offered.
"""

from __future__ import annotations

import numpy as np

# name -> (numpy dtype or 'bf16', size in bytes), in the order the inspector lists them.
VALUE_TYPES: dict[str, tuple[str, int]] = {
    "u8": ("<u1", 1), "i8": ("<i1", 1), "u16": ("<u2", 2), "i16": ("<i2", 2),
    "u32": ("<u4", 4), "i32": ("<i4", 4), "u64": ("<u8", 8), "i64": ("<i8", 8),
    "f16": ("<f2", 2), "bf16": ("bf16", 2), "f32": ("<f4", 4), "f64": ("<f8", 8),
}
NOT_AVAILABLE = "n/a"
MAX_INSPECT_BYTES = max(size for _, size in VALUE_TYPES.values())


def type_size(type_name: str) -> int:
    if type_name not in VALUE_TYPES:
        raise ValueError(f"unknown value type {type_name!r}; expected one of {', '.join(VALUE_TYPES)}")
    return VALUE_TYPES[type_name][1]


def decode_array(data: bytes, type_name: str) -> np.ndarray:
    """The whole elements of `type_name` in `data` (a trailing partial element is dropped);
    bf16 is widened exactly to float32."""
    type_size(type_name)
    code, size = VALUE_TYPES[type_name]
    n = len(data) // size
    if code == "bf16":
        bits = np.frombuffer(data, dtype="<u2", count=n)
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(data, dtype=code, count=n)


def format_scalar(value: np.generic | int | float) -> str:
    """One value as text: integers exactly, floats with the shortest repr that round-trips in
    their own precision (numpy's), so a stored 0.1f reads 0.1, not 0.10000000149."""
    if isinstance(value, (np.floating, float)):
        if not np.isfinite(value):
            return str(float(value))
        if value == 0 or 1e-4 <= abs(float(value)) < 1e16:
            return np.format_float_positional(value, unique=True, trim="-")
        return np.format_float_scientific(value, unique=True, trim="-")
    return str(int(value))


def inspect_bytes(data: bytes) -> dict[str, str]:
    """Every type decoded at the start of `data` (the bytes from the cursor on; at most 8 are
    used). Types longer than the available bytes read 'n/a'."""
    out: dict[str, str] = {}
    for name, (_code, size) in VALUE_TYPES.items():
        if len(data) < size:
            out[name] = NOT_AVAILABLE
        else:
            out[name] = format_scalar(decode_array(data[:size], name)[0])
    return out


def format_hex(data: bytes, per_line: int = 16) -> str:
    """`data` as lower-case hex bytes separated by spaces, `per_line` bytes per line."""
    lines = [data[i:i + per_line].hex(" ") for i in range(0, len(data), per_line)]
    return "\n".join(lines)


def format_values(data: bytes, type_name: str, per_line: int = 8) -> str:
    """`data` decoded as little-endian `type_name` values, comma-separated, `per_line` values
    per line. Trailing bytes that do not fill a whole value are ignored."""
    values = [format_scalar(v) for v in decode_array(data, type_name)]
    lines = [", ".join(values[i:i + per_line]) for i in range(0, len(values), per_line)]
    return "\n".join(lines)


def parse_offset(text: str) -> int:
    """A non-negative offset typed by a user: decimal (`4096`), hex with 0x (`0x1000`) or with an
    h suffix (`1000h`); underscores and spaces ignored. Raises ValueError otherwise."""
    cleaned = text.strip().replace("_", "").replace(" ", "").lower()
    if not cleaned:
        raise ValueError("empty offset")
    try:
        if cleaned.startswith("0x"):
            value = int(cleaned[2:], 16)
        elif cleaned.endswith("h"):
            value = int(cleaned[:-1], 16)
        else:
            value = int(cleaned, 10)
    except ValueError:
        raise ValueError(f"not an offset: {text!r} (use decimal or 0x hex)") from None
    if value < 0:
        raise ValueError(f"negative offset: {text!r}")
    return value


__all__ = ["MAX_INSPECT_BYTES", "NOT_AVAILABLE", "VALUE_TYPES", "decode_array", "format_hex",
           "format_scalar", "format_values", "inspect_bytes", "parse_offset", "type_size"]
