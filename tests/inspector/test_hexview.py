"""The hexdump widget on real files: goto shows the file's bytes, the value inspector decodes the
cursor, keys and copy work, and a 40 GB sparse file scrolls to its end at once."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication

from colibri.engine import Model
from colibri.inspection.hexsource import BytesSource, FileSource, MappedSource, regions_for
from colibri.inspection.values import format_hex
from colibri.inspector.hexview import BYTES_PER_ROW, QtHexView


@pytest.fixture
def hexview(qtbot):
    view = QtHexView()
    view.resize(900, 400)
    qtbot.addWidget(view)
    view.show()
    return view


def _hex_of_lines(text: str) -> bytes:
    """The bytes shown in the hex columns of painted lines."""
    out = bytearray()
    for line in text.splitlines():
        cells = line[:line.rindex("  ")].split()[1:]  # drop the offset, keep hex pairs
        out += bytes(int(c, 16) for c in cells)
    return bytes(out)


def _open(tiny_model_path, **options):
    model = Model.open(tiny_model_path(**options))
    return model, MappedSource(model)


def test_goto_tensor_offset_shows_that_tensors_bytes(hexview, tiny_model_path):
    model, source = _open(tiny_model_path)
    hexview.set_source(source)
    hexview.set_regions(regions_for(model))
    info = model.tensor_info("layers.1.moe_w1")
    hexview.goto(info.offset, info.nbytes)
    text = hexview.visible_text()
    first = text.splitlines()[0]
    assert first.startswith(f"{info.offset:08x}  ")
    shown = _hex_of_lines(text)
    file_bytes = tiny_model_path().read_bytes()
    assert len(shown) >= 16 * 4
    assert shown == file_bytes[info.offset:info.offset + len(shown)]


def test_value_inspector_decodes_the_tensors_first_value(hexview, tiny_model_path):
    model, source = _open(tiny_model_path)
    hexview.set_source(source)
    info = model.tensor_info("layers.0.attn_k")
    hexview.goto(info.offset, info.nbytes)
    assert hexview.cursor_offset() == info.offset
    first = model.tensor("layers.0.attn_k").flat[0]
    assert np.float32(hexview.inspector.value("f32")) == first  # shortest repr round-trips


def test_value_inspector_follows_the_cursor(hexview, qtbot):
    hexview.set_source(BytesSource(bytes(range(64))))
    with qtbot.waitSignal(hexview.sig_cursor_moved) as blocker:
        hexview.set_cursor(5)
    assert blocker.args == [5]
    assert hexview.inspector.value("u8") == "5"
    assert hexview.inspector.value("u16") == str(5 + 6 * 256)


def test_ascii_column_shows_printable_bytes(hexview):
    hexview.set_source(BytesSource(b"COLI\x00\x01" + b"x" * 10))
    assert hexview.visible_text().splitlines()[0].endswith("  COLI..xxxxxxxxxx")


def test_arrow_keys_move_and_shift_selects(hexview, qtbot):
    hexview.set_source(BytesSource(bytes(256)))
    hexview.canvas.setFocus()
    qtbot.keyClick(hexview.canvas, Qt.Key.Key_Down)
    qtbot.keyClick(hexview.canvas, Qt.Key.Key_Right)
    assert hexview.cursor_offset() == BYTES_PER_ROW + 1
    qtbot.keyClick(hexview.canvas, Qt.Key.Key_Right, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClick(hexview.canvas, Qt.Key.Key_Right, Qt.KeyboardModifier.ShiftModifier)
    assert hexview.selection() == (17, 20)
    qtbot.keyClick(hexview.canvas, Qt.Key.Key_End, Qt.KeyboardModifier.ControlModifier)
    assert hexview.cursor_offset() == 255


def test_ctrl_c_copies_the_selection_as_hex(hexview, qtbot):
    data = bytes(range(100))
    hexview.set_source(BytesSource(data))
    hexview.goto(10, 20)
    qtbot.keyClick(hexview.canvas, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == format_hex(data[10:30])


def test_copy_as_f32_values(hexview, tiny_model_path):
    model, source = _open(tiny_model_path)
    hexview.set_source(source)
    info = model.tensor_info("output_norm")
    hexview.goto(info.offset, 8)
    text = hexview.copy_values("f32")
    assert [np.float32(v) for v in text.split(", ")] == list(model.tensor("output_norm")[:2])


def test_mouse_click_moves_the_cursor(hexview, qtbot):
    hexview.set_source(BytesSource(bytes(256)))
    canvas = hexview.canvas
    x = int((canvas._hex_char(3) + 0.5) * canvas._cw)
    y = int(2.5 * canvas._lh)
    qtbot.mouseClick(canvas.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(x, y))
    assert hexview.cursor_offset() == 2 * BYTES_PER_ROW + 3


def test_region_under_offset_for_tooltips(hexview, tiny_model_path):
    model, source = _open(tiny_model_path)
    hexview.set_source(source)
    hexview.set_regions(regions_for(model))
    assert hexview.region_at(0x0C).label == "header.num_layers = 2"


def test_end_of_a_huge_sparse_file_is_instant(hexview, tmp_path):
    size = 40 << 30   # 2.7e9 rows: beyond QScrollBar's int32 range
    path = tmp_path / "huge.bin"
    with open(path, "wb") as handle:
        handle.truncate(size)
        handle.seek(size - 16)
        handle.write(b"THE END 01234567")
    hexview.set_source(FileSource(path))
    start = time.perf_counter()
    hexview.goto(size - 1)
    hexview.canvas.viewport().repaint()
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5
    assert hexview.visible_text().splitlines()[-1].endswith("THE END 01234567")
    bar = hexview.canvas.verticalScrollBar()
    assert 0 < bar.maximum() < 2**31 and bar.value() == bar.maximum()


def test_scrollbar_drag_on_a_huge_file_maps_to_rows(hexview, tmp_path):
    size = 40 << 30
    path = tmp_path / "huge.bin"
    with open(path, "wb") as handle:
        handle.truncate(size)
    hexview.set_source(FileSource(path))
    bar = hexview.canvas.verticalScrollBar()
    bar.setValue(bar.maximum() // 2)
    top = hexview.top_offset()
    assert abs(top - size // 2) < size // 1000
