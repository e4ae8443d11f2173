"""The value inspector's decoding and the copy formats, against struct and numpy."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from colibri.inspection.values import (VALUE_TYPES, format_hex, format_values, inspect_bytes,
                                       parse_offset)


def test_every_integer_type_decodes_little_endian():
    data = bytes([0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F])
    shown = inspect_bytes(data)
    for name, code in (("u8", "<B"), ("i8", "<b"), ("u16", "<H"), ("i16", "<h"), ("u32", "<I"),
                       ("i32", "<i"), ("u64", "<Q"), ("i64", "<q")):
        assert shown[name] == str(struct.unpack_from(code, data)[0]), name


def test_float_types_decode_to_their_values():
    assert inspect_bytes(struct.pack("<f", 0.1) + b"\0" * 4)["f32"] == "0.1"
    assert inspect_bytes(struct.pack("<d", -2.5))["f64"] == "-2.5"
    assert inspect_bytes(struct.pack("<e", 1.5))["f16"] == "1.5"
    assert inspect_bytes(struct.pack("<H", 0x3FC0))["bf16"] == "1.5"


def test_types_past_the_end_read_not_available():
    shown = inspect_bytes(b"\x01\x02\x03")
    assert shown["u16"] == "513"
    assert shown["u32"] == shown["f32"] == shown["u64"] == shown["f64"] == "n/a"
    assert set(shown) == set(VALUE_TYPES)


def test_format_hex_sixteen_bytes_per_line():
    assert format_hex(bytes(range(18))) == (
        "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f\n10 11")


def test_format_values_as_f32():
    values = np.array([1.0, -2.25, 3e-9], dtype="<f4")
    assert format_values(values.tobytes() + b"\x01", "f32") == "1, -2.25, 3e-09"


def test_format_values_as_bf16_widens_exactly():
    assert format_values(struct.pack("<2H", 0x3F80, 0xC000), "bf16") == "1, -2"


@pytest.mark.parametrize("text,value", [("4096", 4096), ("0x1000", 4096), ("0X1F_00", 0x1F00),
                                        ("1000h", 4096), (" 12 ", 12)])
def test_parse_offset(text, value):
    assert parse_offset(text) == value


@pytest.mark.parametrize("text", ["", "zz", "-5", "0x"])
def test_parse_offset_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_offset(text)
