"""The hexdump: a custom-painted, virtualised view over a `HexSource`, with a value inspector.

Owns the Inspector's byte-level view. `_HexCanvas` paints only the rows on screen and reads them
with one bounded `source.read` per paint (a screenful, 16 bytes a row), so a 40 GB mapping
scrolls as fast as a 4 KB one; nothing walks the file. The vertical scrollbar is a QScrollBar
(int32): beyond 2**30 rows its value is mapped to the top row by a scale factor, while the
view keeps the exact top row as a Python int, so wheel and keys still move by single rows.

Regions (`colibri.inspection.hexsource.Region`) are tinted by kind; the range given to
`goto(offset, length)` (the selected tensor, a header field) is drawn stronger, and the
selection strongest. `QtValueInspector` decodes the bytes at the cursor in every type of
`colibri.inspection.values`. Ctrl+C copies the selection as hex; the context menu copies it as
values of any type. Copies are capped at `MAX_COPY_BYTES` so selecting a whole 10 GB tensor
cannot freeze the UI.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QPoint, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import (QAction, QColor, QContextMenuEvent, QFont, QFontDatabase,
                           QFontMetricsF, QGuiApplication, QKeyEvent, QKeySequence, QMouseEvent,
                           QPainter, QPaintEvent, QResizeEvent, QWheelEvent)
from PySide6.QtWidgets import (QAbstractScrollArea, QHeaderView, QInputDialog, QMenu, QMessageBox,
                               QTableWidget, QTableWidgetItem, QToolTip, QVBoxLayout, QWidget)

from colibri.inspection.hexsource import BytesSource, HexSource, Region, RegionIndex
from colibri.inspection.values import (MAX_INSPECT_BYTES, VALUE_TYPES, format_hex,
                                       format_values, inspect_bytes, parse_offset)

BYTES_PER_ROW = 16
SCROLL_MAX = 1 << 30          # scrollbar range used before scaling kicks in
MAX_COPY_BYTES = 16 << 20     # 16 MiB: larger selections are copied truncated, with a warning
WHEEL_ROWS = 3

REGION_COLOURS: dict[str, QColor] = {
    "header": QColor(255, 224, 160),
    "routing": QColor(200, 230, 255),
    "tensor_table": QColor(220, 210, 255),
    "tokenizer": QColor(210, 245, 210),
    "metadata": QColor(245, 220, 235),
    "tensor": QColor(235, 235, 235),
}
HIGHLIGHT_COLOUR = QColor(255, 214, 130)
SELECTION_COLOUR = QColor(64, 128, 255)
CURSOR_COLOUR = QColor(220, 40, 40)


def _printable(b: int) -> str:
    return chr(b) if 0x20 <= b < 0x7F else "."


class _HexCanvas(QAbstractScrollArea):
    """The painted rows. Geometry: offset column, two spaces, 16 hex pairs (an extra space after
    the eighth), two spaces, 16 ASCII characters; every column is a whole number of character
    cells, so one drawText per row suffices and hit-testing is arithmetic."""

    sig_cursor_moved = Signal("qlonglong")  # file offsets exceed int32

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        font.setStyleHint(QFont.StyleHint.Monospace)
        self.setFont(font)
        self.viewport().setFont(font)
        self._source: HexSource = BytesSource(b"")
        self._index = RegionIndex([])
        self._top_row = 0
        self._cursor = 0
        self._anchor = 0
        self._highlight: tuple[int, int] | None = None   # [start, end)
        self._offset_digits = 8
        self._dragging = False
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.viewport().setMouseTracking(True)
        self.verticalScrollBar().valueChanged.connect(self._on_scrollbar)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self._update_metrics()

    # -- geometry ---------------------------------------------------------------------------

    def _update_metrics(self) -> None:
        fm = QFontMetricsF(self.viewport().font())
        # average advance over many glyphs: fonts may have fractional advances
        self._cw = max(1.0, fm.horizontalAdvance("0" * 64) / 64)
        self._lh = max(1, int(math.ceil(fm.height())))
        self._ascent = fm.ascent()
        self._hex_col = self._offset_digits + 2
        self._ascii_col = self._hex_col + BYTES_PER_ROW * 3 + 1 + 1
        self._line_chars = self._ascii_col + BYTES_PER_ROW
        # a whole row (offset, 16 bytes, ASCII) always fits: a hexdump cut at byte 5 is useless
        scrollbar = self.verticalScrollBar().sizeHint().width()
        self.setMinimumWidth(int(math.ceil((self._line_chars + 1) * self._cw)) + scrollbar + 4)

    def _hex_char(self, i: int) -> int:
        """Character column of byte i (0..15) of a row in the hex area."""
        return self._hex_col + i * 3 + (1 if i >= 8 else 0)

    def total_rows(self) -> int:
        return (self._source.size() + BYTES_PER_ROW - 1) // BYTES_PER_ROW

    def visible_rows(self) -> int:
        """Rows that fit entirely in the viewport (at least 1)."""
        return max(1, self.viewport().height() // self._lh)

    def _max_top(self) -> int:
        return max(0, self.total_rows() - self.visible_rows())

    def _scale(self) -> float:
        """Top rows per scrollbar unit (1 unless the file has more than SCROLL_MAX rows)."""
        top = self._max_top()
        return top / SCROLL_MAX if top > SCROLL_MAX else 1.0

    def _sync_scrollbar(self) -> None:
        bar = self.verticalScrollBar()
        top, scale = self._max_top(), self._scale()
        bar.blockSignals(True)
        bar.setRange(0, top if scale == 1.0 else SCROLL_MAX)
        bar.setPageStep(max(1, int(self.visible_rows() / scale)) if scale != 1.0 else
                        self.visible_rows())
        bar.setSingleStep(1)
        bar.setValue(self._top_row if scale == 1.0 else int(round(self._top_row / scale)))
        bar.blockSignals(False)
        hbar = self.horizontalScrollBar()
        hbar.setRange(0, max(0, int((self._line_chars + 1) * self._cw) - self.viewport().width()))
        hbar.setPageStep(self.viewport().width())

    def _on_scrollbar(self, value: int) -> None:
        scale = self._scale()
        top = value if scale == 1.0 else int(round(value * scale))
        self._top_row = min(max(0, top), self._max_top())
        self.viewport().update()

    def set_top_row(self, row: int) -> None:
        self._top_row = min(max(0, int(row)), self._max_top())
        self._sync_scrollbar()
        self.viewport().update()

    def top_row(self) -> int:
        return self._top_row

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._top_row = min(self._top_row, self._max_top())
        self._sync_scrollbar()

    # -- model ------------------------------------------------------------------------------

    def set_source(self, source: HexSource) -> None:
        self._source = source
        size = source.size()
        self._offset_digits = max(8, len(f"{max(0, size - 1):x}"))
        self._update_metrics()
        self._top_row = 0
        self._cursor = self._anchor = 0
        self._highlight = None
        self._sync_scrollbar()
        self.viewport().update()
        self.sig_cursor_moved.emit(0)

    def source(self) -> HexSource:
        return self._source

    def set_regions(self, regions: list[Region]) -> None:
        self._index = RegionIndex(regions)
        self.viewport().update()

    def region_at(self, offset: int) -> Region | None:
        return self._index.at(offset)

    # -- cursor and selection ---------------------------------------------------------------

    def cursor_offset(self) -> int:
        return self._cursor

    def selection(self) -> tuple[int, int]:
        """[start, end) of the selection (at least the byte under the cursor)."""
        if self._source.size() == 0:
            return 0, 0
        lo, hi = sorted((self._anchor, self._cursor))
        return lo, hi + 1

    def highlight(self) -> tuple[int, int] | None:
        return self._highlight

    def set_cursor(self, offset: int, extend: bool = False) -> None:
        size = self._source.size()
        offset = min(max(0, int(offset)), max(0, size - 1))
        self._cursor = offset
        if not extend:
            self._anchor = offset
        self.ensure_visible(offset)
        self.viewport().update()
        self.sig_cursor_moved.emit(offset)

    def ensure_visible(self, offset: int) -> None:
        row = offset // BYTES_PER_ROW
        rows = self.visible_rows()
        if row < self._top_row:
            self.set_top_row(row)
        elif row >= self._top_row + rows:
            self.set_top_row(row - rows + 1)

    def goto(self, offset: int, length: int = 1) -> None:
        size = self._source.size()
        if size == 0:
            return
        offset = min(max(0, int(offset)), size - 1)
        length = max(1, min(int(length), size - offset))
        self._highlight = (offset, offset + length)
        self.set_top_row(offset // BYTES_PER_ROW)
        self._anchor = offset + length - 1
        self._cursor = offset
        self.viewport().update()
        self.sig_cursor_moved.emit(offset)

    # -- text -------------------------------------------------------------------------------

    def row_text(self, row: int, data: bytes) -> str:
        """One painted line: offset, hex pairs, ASCII (spaces where the file has ended)."""
        hex_cells = []
        for i in range(BYTES_PER_ROW):
            cell = f"{data[i]:02x}" if i < len(data) else "  "
            hex_cells.append(cell + (" " if i == 7 else ""))
        ascii_text = "".join(_printable(b) for b in data)
        return (f"{row * BYTES_PER_ROW:0{self._offset_digits}x}  " + " ".join(hex_cells)
                + "  " + ascii_text)

    def visible_lines(self) -> list[tuple[int, bytes]]:
        """(row, bytes) of the rows on screen, from one bounded read."""
        rows = self.visible_rows() + 1
        first = self._top_row
        last = min(self.total_rows(), first + rows)
        if last <= first:
            return []
        data = self._source.read(first * BYTES_PER_ROW, (last - first) * BYTES_PER_ROW)
        return [(r, data[(r - first) * BYTES_PER_ROW:(r - first + 1) * BYTES_PER_ROW])
                for r in range(first, last)]

    def visible_text(self) -> str:
        """The text of the rows on screen, one line per row, exactly as painted."""
        return "\n".join(self.row_text(r, d) for r, d in self.visible_lines())

    # -- painting ---------------------------------------------------------------------------

    def _fill_range(self, painter: QPainter, start: int, end: int, colour: QColor,
                    first_row: int, n_rows: int) -> None:
        """Tint bytes [start, end) in both the hex and ASCII areas of the rows on screen."""
        lo = max(start, first_row * BYTES_PER_ROW)
        hi = min(end, (first_row + n_rows) * BYTES_PER_ROW)
        if hi <= lo:
            return
        x0 = -self.horizontalScrollBar().value()
        row = lo // BYTES_PER_ROW
        while row * BYTES_PER_ROW < hi:
            a = max(lo, row * BYTES_PER_ROW) - row * BYTES_PER_ROW
            b = min(hi, (row + 1) * BYTES_PER_ROW) - row * BYTES_PER_ROW   # exclusive
            y = (row - first_row) * self._lh
            hx0 = x0 + self._hex_char(a) * self._cw
            hx1 = x0 + (self._hex_char(b - 1) + 2) * self._cw
            painter.fillRect(QRectF(hx0, y, hx1 - hx0, self._lh), colour)
            ax0 = x0 + (self._ascii_col + a) * self._cw
            painter.fillRect(QRectF(ax0, y, (b - a) * self._cw, self._lh), colour)
            row += 1

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self.viewport())
        painter.fillRect(self.viewport().rect(), self.palette().base())
        lines = self.visible_lines()
        if not lines:
            return
        first_row, n_rows = lines[0][0], len(lines)
        start, end = first_row * BYTES_PER_ROW, (first_row + n_rows) * BYTES_PER_ROW
        for region in self._index.in_range(start, end):
            colour = REGION_COLOURS.get(region.kind, QColor(240, 240, 240))
            self._fill_range(painter, region.start, region.end, colour, first_row, n_rows)
        if self._highlight is not None:
            self._fill_range(painter, *self._highlight, HIGHLIGHT_COLOUR, first_row, n_rows)
        sel_colour = QColor(SELECTION_COLOUR)
        sel_colour.setAlpha(70)
        self._fill_range(painter, *self.selection(), sel_colour, first_row, n_rows)
        x0 = -self.horizontalScrollBar().value()
        painter.setPen(self.palette().text().color())
        cw = self._cw
        for i, (row, data) in enumerate(lines):
            # each cell at its own column, so a font with fractional advances still lines up
            # with the tints and with hit-testing
            y = i * self._lh + self._ascent
            painter.drawText(QPointF(x0, y), f"{row * BYTES_PER_ROW:0{self._offset_digits}x}")
            for j, b in enumerate(data):
                painter.drawText(QPointF(x0 + self._hex_char(j) * cw, y), f"{b:02x}")
                painter.drawText(QPointF(x0 + (self._ascii_col + j) * cw, y), _printable(b))
        # cursor box around the byte under the cursor, in both areas
        crow = self._cursor // BYTES_PER_ROW
        if first_row <= crow < first_row + n_rows and self._source.size():
            col = self._cursor % BYTES_PER_ROW
            y = (crow - first_row) * self._lh
            painter.setPen(CURSOR_COLOUR)
            painter.drawRect(QRectF(x0 + self._hex_char(col) * self._cw, y, 2 * self._cw - 1,
                                    self._lh - 1))
            painter.drawRect(QRectF(x0 + (self._ascii_col + col) * self._cw, y, self._cw - 1,
                                    self._lh - 1))

    # -- input ------------------------------------------------------------------------------

    def offset_at(self, pos: QPoint) -> int | None:
        """File offset of the byte under a viewport position (None outside the bytes)."""
        x = pos.x() + self.horizontalScrollBar().value()
        char = int(x // self._cw)
        row = self._top_row + pos.y() // self._lh
        if char >= self._ascii_col:
            col = char - self._ascii_col
            if col >= BYTES_PER_ROW:
                return None
        elif char >= self._hex_col:
            rel = char - self._hex_col
            if rel >= 8 * 3 + 1:
                rel -= 1
            col = rel // 3
            if col >= BYTES_PER_ROW:
                col = BYTES_PER_ROW - 1
        else:
            col = 0
        offset = row * BYTES_PER_ROW + col
        if offset >= self._source.size():
            return None
        return offset

    def mousePressEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            offset = self.offset_at(event.position().toPoint())
            if offset is not None:
                extend = bool(event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
                self.set_cursor(offset, extend)
                self._dragging = True
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        if self._dragging and event.buttons() & Qt.MouseButton.LeftButton:
            offset = self.offset_at(event.position().toPoint())
            if offset is not None:
                self.set_cursor(offset, extend=True)
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        self._dragging = False
        super().mouseReleaseEvent(event)

    def wheelEvent(self, event: QWheelEvent) -> None:
        steps = event.angleDelta().y() / 120.0
        if steps:
            delta = int(round(steps * WHEEL_ROWS)) or (1 if steps > 0 else -1)
            self.set_top_row(self._top_row - delta)
        event.accept()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.matches(QKeySequence.StandardKey.Copy):
            self.copy_hex()
            return
        key = event.key()
        mods = event.modifiers()
        extend = bool(mods & Qt.KeyboardModifier.ShiftModifier)
        ctrl = bool(mods & Qt.KeyboardModifier.ControlModifier)
        page = self.visible_rows() * BYTES_PER_ROW
        size = self._source.size()
        cur = self._cursor
        moves = {
            Qt.Key.Key_Left: cur - 1, Qt.Key.Key_Right: cur + 1,
            Qt.Key.Key_Up: cur - BYTES_PER_ROW, Qt.Key.Key_Down: cur + BYTES_PER_ROW,
            Qt.Key.Key_PageUp: cur - page, Qt.Key.Key_PageDown: cur + page,
            Qt.Key.Key_Home: 0 if ctrl else cur - cur % BYTES_PER_ROW,
            Qt.Key.Key_End: size - 1 if ctrl else cur - cur % BYTES_PER_ROW + BYTES_PER_ROW - 1,
        }
        if key in moves:
            target = moves[key]
            if key in (Qt.Key.Key_Up, Qt.Key.Key_Down, Qt.Key.Key_PageUp, Qt.Key.Key_PageDown):
                if target < 0 or target >= size:
                    target = cur % BYTES_PER_ROW if target < 0 else size - 1
            self.set_cursor(target, extend)
            if key in (Qt.Key.Key_PageUp, Qt.Key.Key_PageDown):
                delta = -self.visible_rows() if key == Qt.Key.Key_PageUp else self.visible_rows()
                self.set_top_row(self._top_row + delta)
                self.ensure_visible(self._cursor)
            return
        super().keyPressEvent(event)

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            pos = event.pos()  # type: ignore[attr-defined]
            offset = self.offset_at(pos)
            region = self._index.at(offset) if offset is not None else None
            if offset is not None and region is not None:
                QToolTip.showText(event.globalPos(),  # type: ignore[attr-defined]
                                  f"0x{offset:x}: {region.label}\n"
                                  f"[0x{region.start:x}, 0x{region.end:x}) {region.kind}",
                                  self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        menu = self.build_context_menu()
        menu.exec(event.globalPos())

    def build_context_menu(self) -> QMenu:
        menu = QMenu(self)
        copy_hex = QAction("Copy as hex", menu)
        copy_hex.setShortcut(QKeySequence.StandardKey.Copy)
        copy_hex.triggered.connect(self.copy_hex)
        menu.addAction(copy_hex)
        values_menu = menu.addMenu("Copy as values")
        for name in VALUE_TYPES:
            action = QAction(name, values_menu)
            action.triggered.connect(lambda _checked=False, n=name: self.copy_values(n))
            values_menu.addAction(action)
        menu.addSeparator()
        goto = QAction("Go to offset…", menu)
        goto.triggered.connect(self._prompt_goto_from_menu)
        menu.addAction(goto)
        return menu

    def _prompt_goto_from_menu(self) -> None:
        parent = self.parent()
        if isinstance(parent, QtHexView):
            parent.prompt_goto()

    # -- copy -------------------------------------------------------------------------------

    def selected_bytes(self) -> tuple[bytes, bool]:
        """The selection's bytes (at most MAX_COPY_BYTES) and whether they were truncated."""
        start, end = self.selection()
        n = end - start
        return self._source.read(start, min(n, MAX_COPY_BYTES)), n > MAX_COPY_BYTES

    def copy_hex(self) -> str:
        data, truncated = self.selected_bytes()
        return self._to_clipboard(format_hex(data), truncated)

    def copy_values(self, type_name: str) -> str:
        data, truncated = self.selected_bytes()
        return self._to_clipboard(format_values(data, type_name), truncated)

    def _to_clipboard(self, text: str, truncated: bool) -> str:
        QGuiApplication.clipboard().setText(text)
        if truncated:
            QToolTip.showText(self.mapToGlobal(QPoint(0, 0)),
                              f"selection larger than {MAX_COPY_BYTES >> 20} MiB: copied the "
                              f"first {MAX_COPY_BYTES >> 20} MiB", self)
        return text


class QtValueInspector(QTableWidget):
    """The bytes at the cursor decoded as every type of `colibri.inspection.values`, two types a
    row (unsigned and signed of one width, then the floats), so it sits under the hexdump in six
    short rows instead of widening the window."""

    COLUMNS = 2   # type/value pairs per row

    def __init__(self, parent: QWidget | None = None) -> None:
        names = list(VALUE_TYPES)
        rows = (len(names) + self.COLUMNS - 1) // self.COLUMNS
        super().__init__(rows, 2 * self.COLUMNS, parent)
        self.setHorizontalHeaderLabels(["type", "value (LE)"] * self.COLUMNS)
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        header = self.horizontalHeader()
        for column in range(2 * self.COLUMNS):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents
                                        if column % 2 == 0 else QHeaderView.ResizeMode.Stretch)
        self._cells: dict[str, QTableWidgetItem] = {}
        for i, name in enumerate(names):
            row, column = divmod(i, self.COLUMNS)
            label = QTableWidgetItem(name)
            label.setForeground(self.palette().placeholderText())
            value = QTableWidgetItem("")
            self.setItem(row, 2 * column, label)
            self.setItem(row, 2 * column + 1, value)
            self._cells[name] = value
        self.resizeRowsToContents()
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        height = self.horizontalHeader().sizeHint().height() + 2 * self.frameWidth() + sum(
            self.rowHeight(r) for r in range(rows))
        self.setFixedHeight(height)
        self._offset = 0

    def show_bytes(self, offset: int, data: bytes) -> None:
        self._offset = offset
        for name, text in inspect_bytes(data).items():
            self._cells[name].setText(text)
            self._cells[name].setToolTip(f"{name} at 0x{offset:X}: {text}")

    def value(self, type_name: str) -> str:
        """The text shown for `type_name`."""
        return self._cells[type_name].text()


class QtHexView(QWidget):
    """Hexdump of a `HexSource` with region colours, go-to, copy and a value inspector."""

    sig_cursor_moved = Signal("qlonglong")  # file offsets exceed int32

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.canvas = _HexCanvas(self)
        self.inspector = QtValueInspector(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.canvas, 1)
        layout.addWidget(self.inspector)
        self.canvas.sig_cursor_moved.connect(self._on_cursor)
        self.setFocusProxy(self.canvas)
        self._on_cursor(0)

    def _on_cursor(self, offset: int) -> None:
        self.inspector.show_bytes(offset, self.canvas.source().read(offset, MAX_INSPECT_BYTES))
        self.sig_cursor_moved.emit(offset)

    # -- public API -------------------------------------------------------------------------

    def set_source(self, source: HexSource | None) -> None:
        self.canvas.set_source(source if source is not None else BytesSource(b""))

    def source(self) -> HexSource:
        return self.canvas.source()

    def set_regions(self, regions: list[Region]) -> None:
        self.canvas.set_regions(regions)

    def goto(self, offset: int, length: int = 1) -> None:
        """Scroll so `offset` is on the top row, put the cursor there, select and highlight
        [offset, offset + length)."""
        self.canvas.goto(offset, length)

    def prompt_goto(self) -> int | None:
        """Ask for an offset (decimal or 0x hex) and go there; returns it, or None."""
        text, ok = QInputDialog.getText(self, "Go to offset",
                                        f"Offset (decimal or 0x hex, file size "
                                        f"0x{self.source().size():x}):")
        if not ok:
            return None
        try:
            offset = parse_offset(text)
        except ValueError as exc:
            QMessageBox.warning(self, "Go to offset", str(exc))
            return None
        if offset >= self.source().size():
            QMessageBox.warning(self, "Go to offset",
                                f"0x{offset:x} is past the end (0x{self.source().size():x})")
            return None
        self.goto(offset)
        return offset

    def cursor_offset(self) -> int:
        return self.canvas.cursor_offset()

    def set_cursor(self, offset: int, extend: bool = False) -> None:
        self.canvas.set_cursor(offset, extend)

    def selection(self) -> tuple[int, int]:
        return self.canvas.selection()

    def visible_text(self) -> str:
        return self.canvas.visible_text()

    def top_offset(self) -> int:
        return self.canvas.top_row() * BYTES_PER_ROW

    def copy_hex(self) -> str:
        return self.canvas.copy_hex()

    def copy_values(self, type_name: str) -> str:
        return self.canvas.copy_values(type_name)

    def region_at(self, offset: int) -> Region | None:
        return self.canvas.region_at(offset)


__all__ = ["BYTES_PER_ROW", "MAX_COPY_BYTES", "QtHexView", "QtValueInspector", "REGION_COLOURS"]
