"""The tensor table: a lazy item model over `TensorRow`s that sorts, filters and fetches rows
on demand.

Owns the Qt side of `colibri.inspection.tensors`. `TensorTableModel` orders the rows itself (the
name pattern of `tensors.name_matches`, substring or glob; a sort on raw values, so numbers sort
as numbers) in plain Python over the row list, then hands them to the view in chunks of
`FETCH_ROWS` through `canFetchMore`/`fetchMore` (Spyder's array editor does the same), so a
checkpoint of 20 000 tensors costs one chunk when it opens and the rest as the user scrolls. A
sort proxy would call back into Python for every comparison: 4 s for 19 200 rows on this
machine. With a grouping ('layer' or 'expert') it becomes a two-level tree whose top rows are
the groups, each group's rows fetched the same way (in chunks of `FETCH_GROUP_ROWS`); a
group stays while any of its rows matches, and groups start expanded only when they hold at
most `EXPAND_ALL_ROWS` rows (a sort or a filter keeps those the user expanded). `QtTensorTable` puts a filter line edit and a grouping combo over the rows and
reports the selected tensor as `sig_tensor_selected(name)` and its byte range (an expert's
slice when the row is one) as `sig_range_selected(offset, nbytes)`. Flat rows are shown by a
QTableView, which lays out no row (measured on 20 000 rows: a fetch at the end 9 ms of UI
thread, a sort 19 ms, where a QTreeView took 40 and 37 ms, growing with the rows fetched);
groups by a QTreeView. Only the view shown holds the model. A paint of the table is most of
what the UI thread does while a user scrolls or sorts, so both views paint their rows
themselves, one call into the model per row (`_RowPainter`; docs/formats.md has the figures);
a size hint goes through the delegate, which fills a cell from one call (`_CellDelegate`). The
model sorts all rows once a column and keeps the order, so a filter or a regrouping sorts
nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
from PySide6.QtCore import (QAbstractItemModel, QByteArray, QItemSelectionModel, QModelIndex,
                            QPoint, QRect, Qt, Signal)
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPaintEvent, QPalette, QResizeEvent
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel,
                               QLineEdit, QStackedWidget, QStyle, QStyledItemDelegate,
                               QStyleOptionFocusRect, QStyleOptionViewItem, QTableView, QTreeView,
                               QVBoxLayout, QWidget)

from colibri.inspection import tensors as T
from colibri.inspection.tensors import TensorRow
from colibri.inspector.table_model import Index

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

# What identifies a tensor and where its bytes are come first, so they show beside the hexdump
# without scrolling; layer, expert and kind (also readable from the name) follow.
COLUMNS = ("name", "dtype", "shape", "offset", "bytes", "check", "layer", "expert", "kind")
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ROW_ROLE = Qt.ItemDataRole.UserRole + 2          # the TensorRow of a leaf, None for a group
FETCH_ROWS = 200                                 # rows handed to the view per fetchMore
# ... and a group's rows: the tree fetches a chunk each time it lays out an expanded group, and
# lays out every row fetched, a call into Python each (docs/formats.md)
FETCH_GROUP_ROWS = 50
EXPAND_ALL_ROWS = 512   # rows up to which grouping shows every group expanded
# Roles as plain ints: each enum member read from Python costs a descriptor call.
_DISPLAY = int(Qt.ItemDataRole.DisplayRole)
_TOOLTIP = int(Qt.ItemDataRole.ToolTipRole)
_FOREGROUND = int(Qt.ItemDataRole.ForegroundRole)
_ALIGNMENT = int(Qt.ItemDataRole.TextAlignmentRole)
_SORT = int(SORT_ROLE)
_ROW = int(ROW_ROLE)
_ALIGN_RIGHT_FLAGS = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
_ALIGN_RIGHT = int(_ALIGN_RIGHT_FLAGS)
_ROLES = frozenset((_DISPLAY, _TOOLTIP, _FOREGROUND, _ALIGNMENT, _SORT, _ROW))
_CHECK_COLUMN = COLUMNS.index("check")
_BYTES_COLUMN = COLUMNS.index("bytes")
_RIGHT_ALIGNED = frozenset(COLUMNS.index(c) for c in ("layer", "expert", "offset", "bytes"))
_NUMERIC_COLUMNS = frozenset(("layer", "expert", "shape", "offset", "bytes"))   # int sort keys
# The columns that can answer a role (all but these two roles: every column), so that asks for
# a colour or an alignment of other columns return before looking up their row.
_ALL_COLUMNS = frozenset(range(len(COLUMNS)))
_ROLE_COLUMNS = {_FOREGROUND: frozenset({_CHECK_COLUMN}), _ALIGNMENT: _RIGHT_ALIGNED}
CHECK_COLOURS = {"ok": QColor(40, 140, 60), "bad": QColor(200, 40, 40),
                 "unchecked": QColor(130, 130, 130)}


# What a cell shows: its text, whether it is right-aligned, its text colour (None: the palette's).
Cell = tuple[str, bool, QColor | None]


def _fmt_bytes(n: int) -> str:
    return f"{n:,}"


def _int64s(values: Iterable[int], count: int) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=count)


def _check_grouping(grouping: str | None) -> None:
    if grouping is not None and grouping not in T.GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}")


class TensorTableModel(QAbstractItemModel):
    """Flat (grouping 'none') or two-level (groups, then rows) lazy model of tensor rows.

    The shown rows are `_groups`: the filtered and sorted rows as (label, rows) pairs, one
    unlabelled pair when flat; `_loaded[g]` of group g's rows are in the model so far. Internal
    ids: a top-level item has id 0; a row inside group g has id g + 1."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._rows: list[TensorRow] = []
        self._groups: list[T.Group] = [("", [])]
        self._loaded: list[int] = [0]
        self._grouping = "none"
        self._pattern = ""
        self._sort_column = COLUMNS.index("offset")
        self._sort_order = Qt.SortOrder.AscendingOrder
        self._status: dict[str, str] = {}
        self._group_bytes: dict[int, int] = {}   # a group's bytes, by its row
        self._labels = T.RowLabels([])           # the rows' labels, read once for filtering
        self._orders: dict[tuple[int, bool], list[int]] = {}   # see _order

    # -- content ----------------------------------------------------------------------------

    def set_rows(self, rows: list[TensorRow], grouping: str | None = None) -> None:
        _check_grouping(grouping)
        self._labels = T.RowLabels(rows)
        self._rows = self._labels.rows
        self._orders = {}
        self._arrange(grouping)

    def set_grouping(self, grouping: str) -> None:
        _check_grouping(grouping)
        self._arrange(grouping)

    def grouping(self) -> str:
        return self._grouping

    def set_pattern(self, pattern: str) -> None:
        """Show only rows whose label matches `pattern` (substring, or glob with `*?[`)."""
        self._pattern = pattern
        self._arrange()

    def pattern(self) -> str:
        return self._pattern

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        # QTreeView.sortByColumn asks twice (itself and through the header's indicator)
        if not 0 <= column < len(COLUMNS) or (column, order) == (self._sort_column,
                                                                 self._sort_order):
            return
        self._sort_column, self._sort_order = column, order
        self._arrange()

    def sorting(self) -> tuple[int, Qt.SortOrder]:
        """The column the rows are sorted by, and the order."""
        return self._sort_column, self._sort_order

    def _arrange(self, grouping: str | None = None) -> None:
        """Filter, sort and group every row, then reset (flat, with the first chunk loaded);
        `grouping` replaces the current one."""
        self.beginResetModel()   # views still see the old arrangement until here
        if grouping is not None:
            self._grouping = grouping
        reverse = self._sort_order == Qt.SortOrder.DescendingOrder
        filtered = bool(self._pattern.strip())
        if self._grouping == "expert":   # an expert's slices sort by their own byte ranges
            rows = self._labels.matching(self._pattern) if filtered else self._rows
            groups = [(label, self._in_order(members, reverse))
                      for label, members in T.group_rows(rows, "expert")]
        else:   # all rows sorted once a column: a stable sort orders any subset the same way
            shown = self._order(reverse)
            if filtered:
                mask = self._labels.mask(self._pattern)
                shown = list(compress(shown, map(mask.__getitem__, shown)))
            groups = [("", list(map(self._rows.__getitem__, shown)))] \
                if self._grouping == "none" else T.group_by_layer(self._rows, shown)
        self._groups = groups
        # flat, the first chunk; grouped, none: the tree's layout fetches a chunk of each
        # expanded group itself, and rows loaded before it would be laid out too
        first = self._chunk() if self._grouping == "none" else 0
        self._loaded = [min(first, len(members)) for _label, members in self._groups]
        self._group_bytes = {}
        self.endResetModel()

    def _order(self, reverse: bool) -> list[int]:
        """The positions of all rows in the sort's order, kept for each column and direction
        (a filter or a regrouping sorts nothing again)."""
        key = (self._sort_column, reverse)
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = self._positions_in_order(self._rows, reverse)
        return order

    def _in_order(self, rows: list[TensorRow], reverse: bool) -> list[TensorRow]:
        return list(map(rows.__getitem__, self._positions_in_order(rows, reverse)))

    def _positions_in_order(self, rows: list[TensorRow], reverse: bool) -> list[int]:
        """The positions of `rows` sorted by the sort column (stable: ties keep their order)."""
        name = COLUMNS[self._sort_column]
        if name not in _NUMERIC_COLUMNS:
            return T.stable_order(list(map(self._key_function(name), rows)), reverse)
        if name == "offset":   # file order across a checkpoint's shards: by shard, then offset
            keys = _int64s(map(attrgetter("shard"), rows), len(rows)) << 56 | \
                _int64s(map(attrgetter("offset"), rows), len(rows))
        else:
            keys = _int64s(map(self._key_function(name), rows), len(rows))
        return T.stable_order(keys, reverse)

    def set_check_status(self, status: dict[str, str]) -> None:
        self._status = dict(status)
        self._orders = {key: order for key, order in self._orders.items()
                        if key[0] != _CHECK_COLUMN}
        col = _CHECK_COLUMN
        for g, loaded in enumerate(self._loaded):
            if loaded:
                parent = QModelIndex() if self._grouping == "none" else self.index(g, 0)
                self.dataChanged.emit(self.index(0, col, parent),
                                      self.index(loaded - 1, col, parent))

    def check_of(self, row: TensorRow) -> str:
        return self._status.get(row.name, row.check)

    def _group_of(self, index: Index) -> int | None:
        """The group whose rows `index` is among (None for a group header)."""
        if self._grouping == "none":
            return 0
        gid = index.internalId()
        return None if gid == 0 else gid - 1

    def row_at(self, index: Index) -> TensorRow | None:
        """The tensor row of an index (None for a group header or an invalid index)."""
        if not index.isValid():
            return None
        g = self._group_of(index)
        if g is None or g >= len(self._groups):
            return None
        rows = self._groups[g][1]
        return rows[index.row()] if index.row() < self._loaded[g] else None

    def find(self, name: str, expert: int | None = None) -> QModelIndex:
        """The index (column 0) showing tensor `name` (and expert slice `expert`, else the
        first slice), fetching rows up to it; invalid when filtered out or absent."""
        fallback: tuple[int, int] | None = None
        for g, (_label, rows) in enumerate(self._groups):
            for i, r in enumerate(rows):
                if r.name == name:
                    if r.expert == expert:
                        return self._fetched_index(g, i)
                    if fallback is None:
                        fallback = (g, i)
        return self._fetched_index(*fallback) if fallback is not None else QModelIndex()

    def _fetched_index(self, group: int, row: int) -> QModelIndex:
        parent = QModelIndex() if self._grouping == "none" else self.index(group, 0)
        while self._loaded[group] <= row:
            self.fetchMore(parent)
        return self.index(row, 0, parent)

    def shown_rows(self) -> list[TensorRow]:
        """Every row the table shows (filtered and sorted), fetched by the view or not."""
        return [r for _label, rows in self._groups for r in rows]

    def shown_count(self) -> int:
        return sum(len(rows) for _label, rows in self._groups)

    def group_labels(self) -> list[str]:
        """The groups' labels in display order (one empty label when flat)."""
        return [label for label, _rows in self._groups]

    def leaf_rows(self) -> list[TensorRow]:
        """Every row given, as `set_rows` received them (expert groups: every slice)."""
        if self._grouping == "expert":
            return [r for _label, rows in T.group_rows(self._rows, "expert") for r in rows]
        return list(self._rows)

    def total_count(self) -> int:
        return len(self._rows)

    # -- QAbstractItemModel -----------------------------------------------------------------

    def index(self, row: int, column: int, parent: Index = QModelIndex()) -> QModelIndex:
        # bounds checked here, not by hasIndex(), whose rowCount and columnCount would be two
        # more calls into Python for each cell a paint draws
        if row < 0 or not 0 <= column < len(COLUMNS):
            return QModelIndex()
        if not parent.isValid():
            rows = self._loaded[0] if self._grouping == "none" else len(self._groups)
            return self.createIndex(row, column, 0) if row < rows else QModelIndex()
        g = self._children_of(parent)
        if g is None or row >= self._loaded[g]:
            return QModelIndex()
        return self.createIndex(row, column, g + 1)

    def parent(self, index: Index = QModelIndex()) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        gid = index.internalId()
        if gid == 0:
            return QModelIndex()
        return self.createIndex(gid - 1, 0, 0)

    def _children_of(self, parent: Index) -> int | None:
        """The group whose rows are `parent`'s children (None: `parent` has none)."""
        if not parent.isValid():
            return 0 if self._grouping == "none" else None
        if self._grouping == "none" or parent.internalId() != 0 or parent.column() != 0:
            return None
        return parent.row()

    def rowCount(self, parent: Index = QModelIndex()) -> int:
        if not parent.isValid() and self._grouping != "none":
            return len(self._groups)
        g = self._children_of(parent)
        return 0 if g is None else self._loaded[g]

    def columnCount(self, parent: Index = QModelIndex()) -> int:
        return len(COLUMNS)

    def hasChildren(self, parent: Index = QModelIndex()) -> bool:
        if not parent.isValid():
            return bool(self._groups[0][1]) if self._grouping == "none" else bool(self._groups)
        g = self._children_of(parent)
        return g is not None and bool(self._groups[g][1])

    def _chunk(self) -> int:
        return FETCH_ROWS if self._grouping == "none" else FETCH_GROUP_ROWS

    def canFetchMore(self, parent: Index) -> bool:
        g = self._children_of(parent)
        return g is not None and self._loaded[g] < len(self._groups[g][1])

    def fetchMore(self, parent: Index) -> None:
        g = self._children_of(parent)
        if g is None:
            return
        loaded, total = self._loaded[g], len(self._groups[g][1])
        more = min(self._chunk(), total - loaded)
        if more <= 0:
            return
        self.beginInsertRows(parent, loaded, loaded + more - 1)
        self._loaded[g] = loaded + more
        self.endInsertRows()

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            if 0 <= section < len(COLUMNS):
                return COLUMNS[section]
        return None

    def cell(self, index: Index) -> Cell | None:
        """What a tensor row's cell shows: its text, whether it is right-aligned and its text
        colour (None: the palette's); None for a group header or an invalid index."""
        row = self.row_at(index)
        return None if row is None else self._cell_of(row, index.column())

    def row_cells(self, index: Index, columns: list[int]) -> list[Cell] | None:
        """What `columns` of `index`'s row show (each as `cell` answers); None for a group
        header or an invalid index."""
        row = self.row_at(index)
        return None if row is None else [self._cell_of(row, col) for col in columns]

    def group_cells(self, index: Index, columns: list[int]) -> list[Cell] | None:
        """What `columns` of a group header's row show (as `row_cells` answers, left-aligned
        in the palette's colour); None for any other index."""
        if not self._is_group(index):
            return None
        return [(self._group_text(index.row(), col), False, None) for col in columns]

    def _is_group(self, index: Index) -> bool:
        return index.isValid() and self._grouping != "none" and index.internalId() == 0 \
            and index.row() < len(self._groups)

    def _group_text(self, group: int, col: int) -> str:
        label, rows = self._groups[group]
        if col == 0:
            return f"{label} ({len(rows)})"
        if col == _BYTES_COLUMN:   # summed once an arrangement: a paint asks again
            total = self._group_bytes.get(group)
            if total is None:
                total = self._group_bytes[group] = sum(map(attrgetter("nbytes"), rows))
            return _fmt_bytes(total)
        return ""

    def _cell_of(self, row: TensorRow, col: int) -> Cell:
        colour = (CHECK_COLOURS.get(self.check_of(row), QColor(0, 0, 0))
                  if col == _CHECK_COLUMN else None)
        return self._display(row, COLUMNS[col]), col in _RIGHT_ALIGNED, colour

    def data(self, index: Index, role: int = _DISPLAY) -> Any:
        if role not in _ROLES or not index.isValid():   # roles no cell answers
            return None
        col = index.column()
        if col not in _ROLE_COLUMNS.get(role, _ALL_COLUMNS):   # painting's most asked Nones
            return None
        row = self.row_at(index)
        if row is None:  # a group header
            if not self._is_group(index):
                return None
            if role == _DISPLAY:
                return self._group_text(index.row(), col) or None
            if role == _SORT:
                return index.row()
            return None
        if role == _DISPLAY:
            return self._display(row, COLUMNS[col])
        if role == _ALIGNMENT:   # only the right-aligned columns get here
            return _ALIGN_RIGHT
        if role == _FOREGROUND:  # only the check column gets here
            return QBrush(CHECK_COLOURS.get(self.check_of(row), QColor(0, 0, 0)))
        if role == _SORT:
            return self._sort_key(row, COLUMNS[col])
        if role == _ROW:
            return row
        return (f"{row.label}\n{row.dtype} {row.shape_text}\n"      # the tooltip
                f"bytes [0x{row.offset:x}, 0x{row.offset + row.nbytes:x})")

    def _display(self, row: TensorRow, name: str) -> str:
        if name == "name":
            return row.label
        if name == "layer":
            return "" if row.layer is None else str(row.layer)
        if name == "expert":
            if row.expert is not None:
                return str(row.expert)
            if row.expert_of is not None:
                return str(row.expert_of)
            return f"×{row.n_experts}" if row.n_experts else ""
        if name == "kind":
            return row.kind
        if name == "dtype":
            return row.dtype
        if name == "shape":
            return row.shape_text
        if name == "offset":
            return f"0x{row.offset:x}"
        if name == "bytes":
            return _fmt_bytes(row.nbytes)
        return self.check_of(row)

    def _sort_key(self, row: TensorRow, name: str) -> Any:
        return self._key_function(name)(row)

    def _key_function(self, name: str) -> Callable[[TensorRow], Any]:
        """The sort key of column `name`: raw values, so numbers sort as numbers."""
        if name == "name":
            return attrgetter("label")
        if name == "layer":
            return lambda r: -1 if r.layer is None else r.layer
        if name == "expert":
            def expert(r: TensorRow) -> int:
                e = r.expert if r.expert is not None else r.expert_of
                return -1 if e is None else e
            return expert
        if name == "shape":
            return lambda r: T.element_count(r.shape)
        if name == "offset":   # file order across a checkpoint's shards, as one int
            return lambda r: (r.shard << 56) | r.offset
        if name == "bytes":
            return attrgetter("nbytes")
        if name == "check":
            return self.check_of
        return attrgetter(name)


class _CellDelegate(QStyledItemDelegate):
    """Fills a tensor row's cell from one `TensorTableModel.cell` call; the stock delegate
    asks seven roles through the model's multiData, about 20 calls between Python and Qt
    per cell, and those were half of a paint's CPU on a 20 000-tensor table."""

    def __init__(self, model: TensorTableModel, parent: QWidget) -> None:
        super().__init__(parent)
        self._model = model

    def initStyleOption(self, option: QStyleOptionViewItem,  # noqa: N802 (Qt API)
                        index: Index) -> None:
        cell = self._model.cell(index)
        if cell is None:   # a group header: the stock way
            super().initStyleOption(option, index)
            return
        text, right_aligned, colour = cell
        option.index = index
        option.features = option.features | QStyleOptionViewItem.ViewItemFeature.HasDisplay
        option.text = text
        if right_aligned:
            option.displayAlignment = _ALIGN_RIGHT_FLAGS
        if colour is not None:
            palette = option.palette
            palette.setColor(QPalette.ColorRole.Text, colour)
            option.palette = palette


class _RowPainter:
    """Paints a view's tensor rows a row at a time, as `TensorTableModel.row_cells` answers them
    and the delegate would show them: each column's text elided to fit at the style's text
    margin, right-aligned where the model says, in the check's colour unless the row is
    selected; the row's background alternating or highlighted. The stock paint calls into
    Python twice for each cell (the model's `index`, the delegate) and has the style lay out
    each cell's text, about three times this paint's cost (docs/formats.md). `begin` reads what
    a paint needs once; `row` paints one row. No grid is drawn (the views show none)."""

    WIDTHS_KEPT = 50_000

    def __init__(self, view: QTableView | QTreeView) -> None:
        self._view = view
        self._widths: dict[str, int] = {}   # right-aligned text -> its width in the view's font
        self._elided: dict[tuple[str, int], str] = {}         # (left-aligned text, room) -> shown
        self._elided_right: dict[tuple[str, int], str] = {}   # (right-aligned text, room) -> shown
        self._widths_font = QFont()
        self.columns: list[int] = []        # the columns a paint crosses, and their spans
        self._spans: list[tuple[int, int]] = []
        self._first = 0

    def begin(self, area: QRect) -> bool:
        """Read what a paint of `area` (viewport coordinates) needs; False when no column
        crosses it."""
        view = self._view
        header = view.horizontalHeader() if isinstance(view, QTableView) else view.header()
        self.columns, self._spans = [], []
        for col in range(header.count()):
            x, width = header.sectionViewportPosition(col), header.sectionSize(col)
            if width > 0 and not header.isSectionHidden(col) and x < area.right() + 1 \
                    and x + width > area.left():
                self.columns.append(col)
                self._spans.append((x, width))
        if not self.columns:
            return False
        self._first = header.logicalIndex(0)   # the column a tree indents
        self._left = min(x for x, _w in self._spans)
        self._width = max(x + w for x, w in self._spans) - self._left
        palette = view.palette()
        self._text = palette.color(QPalette.ColorRole.Text)
        self._highlight = palette.brush(QPalette.ColorRole.Highlight)
        self._highlighted_text = palette.color(QPalette.ColorRole.HighlightedText)
        self._alternate = palette.brush(QPalette.ColorRole.AlternateBase)
        self._metrics = view.fontMetrics()
        # the style's own margin (QCommonStyle's for an item view's text)
        self._margin = view.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None,
                                                view) + 1
        if view.font() != self._widths_font or len(self._widths) + len(self._elided) > \
                self.WIDTHS_KEPT:
            self._widths, self._elided, self._elided_right = {}, {}, {}
            self._widths_font = QFont(view.font())
        return True

    def row(self, painter: QPainter, y: int, height: int, cells: list[Cell], selected: bool,
            alternate: bool, indent: int = 0) -> None:
        """Paint one row of `cells` (those of `columns`) at `y`; the text of the column shown
        first starts `indent` pixels further in (a tree's indentation)."""
        if selected:
            painter.fillRect(self._left, y, self._width, height, self._highlight)
        elif alternate:
            painter.fillRect(self._left, y, self._width, height, self._alternate)
        metrics, margin = self._metrics, self._margin
        baseline = y + (height - metrics.height()) // 2 + metrics.ascent()
        for col, (x, width), (text, right_aligned, colour) in zip(self.columns, self._spans,
                                                                  cells):
            if not text:
                continue
            if col == self._first and indent:
                x, width = x + indent, width - indent
            room = width - 2 * margin
            if right_aligned:   # placed by its width
                text, text_width = self._fitted_right(text, room)
                offset = width - margin - text_width
            else:   # one elision call for a text not seen before, none to measure it
                key = (text, room)
                fitted = self._elided.get(key)
                if fitted is None:
                    fitted = self._elided[key] = metrics.elidedText(
                        text, Qt.TextElideMode.ElideRight, max(room, 0))
                text, offset = fitted, margin
            painter.setPen(self._highlighted_text if selected
                           else colour if colour is not None else self._text)
            painter.drawText(x + offset, baseline, text)

    def _fitted_right(self, text: str, room: int) -> tuple[str, int]:
        """`text` elided to `room` pixels, and its width."""
        text_width = self._widths.get(text)
        if text_width is None:
            text_width = self._widths[text] = self._metrics.horizontalAdvance(text)
        if text_width <= room:
            return text, text_width
        short = self._elided_right.get((text, room))
        if short is None:
            short = self._elided_right[text, room] = self._metrics.elidedText(
                text, Qt.TextElideMode.ElideRight, max(room, 0))
        short_width = self._widths.get(short)
        if short_width is None:
            short_width = self._widths[short] = self._metrics.horizontalAdvance(short)
        return short, short_width

    def focus(self, painter: QPainter, index: QModelIndex, selected: bool) -> None:
        """The focus frame around `index`'s cell."""
        view = self._view
        option = QStyleOptionFocusRect()
        option.initFrom(view)
        option.state |= QStyle.StateFlag.State_KeyboardFocusChange
        option.rect = view.visualRect(index)
        option.backgroundColor = view.palette().color(
            QPalette.ColorRole.Highlight if selected else QPalette.ColorRole.Base)
        view.style().drawPrimitive(QStyle.PrimitiveElement.PE_FrameFocusRect, option, painter,
                                   view)


def _has_focus(view: QAbstractItemView) -> bool:
    """Whether `view` shows its current cell's focus frame: the stock views ask the view and
    its viewport, either of which holds the focus."""
    return view.hasFocus() or view.viewport().hasFocus()


class _FlatTableView(QTableView):
    """The flat rows' view: it paints its rows itself (`_RowPainter`), and leaves any other
    model to the stock paint."""

    def __init__(self, model: TensorTableModel, parent: QWidget) -> None:
        super().__init__(parent)
        self._rows_model = model
        self._painter = _RowPainter(self)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt API)
        if self.model() is not self._rows_model or self._rows_model.grouping() != "none":
            super().paintEvent(event)
            return
        painter = QPainter(self.viewport())
        try:
            self.paint_rows(painter, event.rect())
        finally:
            painter.end()

    def paint_rows(self, painter: QPainter, area: QRect) -> None:
        """Paint the rows crossing `area` (viewport coordinates) with `painter`."""
        first = self.rowAt(area.top())
        if first < 0 or not self._painter.begin(area):
            return
        last = self.rowAt(area.bottom())
        if last < 0:
            last = self._rows_model.rowCount() - 1
        model, alternating = self._rows_model, self.alternatingRowColors()
        selected = self._selected_rows(first, last)
        height = self.rowHeight(first)
        y = self.rowViewportPosition(first)
        for i in range(first, last + 1):
            cells = model.row_cells(model.index(i, 0), self._painter.columns)
            if cells is None:
                break
            self._painter.row(painter, y, height, cells, i in selected, alternating and i & 1 == 1)
            y += height
        current = self.currentIndex()
        if _has_focus(self) and current.isValid() and first <= current.row() <= last:
            self._painter.focus(painter, current, current.row() in selected)

    def _selected_rows(self, first: int, last: int) -> set[int]:
        selection = self.selectionModel()
        if selection is None:
            return set()
        return {i for r in selection.selection()
                for i in range(max(r.top(), first), min(r.bottom(), last) + 1)}


class _GroupTreeView(QTreeView):
    """The grouped rows' view: it paints its rows itself (`_RowPainter`), and leaves any other
    model to the stock paint."""

    def __init__(self, model: TensorTableModel, parent: QWidget) -> None:
        super().__init__(parent)
        self._rows_model = model
        self._painter = _RowPainter(self)
        self._expanded: set[str] = set()   # labels of the groups expanded before a reset

    def remember_groups(self, keep: bool) -> None:
        """Before the model resets: note which groups are expanded (none when not `keep`)."""
        grouped = self.model() is self._rows_model and self._rows_model.grouping() != "none"
        self._expanded = {label for g, label in enumerate(self._rows_model.group_labels())
                          if self.isExpanded(self._rows_model.index(g, 0))} \
            if keep and grouped else set()

    def expand_groups(self) -> None:
        """Every group expanded when they hold few rows, else those noted before the reset
        (a sort or a filter keeps them): the tree lays out each row of an expanded group, a call
        into Python per row (docs/formats.md)."""
        expanded, self._expanded = self._expanded, set()
        if self._rows_model.shown_count() <= EXPAND_ALL_ROWS:
            self.expandAll()
            return
        for g, label in enumerate(self._rows_model.group_labels()):
            if label in expanded:
                self.expand(self._rows_model.index(g, 0))

    def reset(self) -> None:
        super().reset()   # forgets which rows were expanded
        if self.model() is self._rows_model and self._rows_model.grouping() != "none":
            self.expand_groups()

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt API)
        if self.model() is not self._rows_model or self._rows_model.grouping() == "none":
            super().paintEvent(event)
            return
        self.executeDelayedItemsLayout()   # as the stock paint does first
        painter = QPainter(self.viewport())
        try:
            self.paint_rows(painter, event.rect())
        finally:
            painter.end()

    def paint_rows(self, painter: QPainter, area: QRect) -> None:
        """Paint the rows crossing `area` (viewport coordinates) with `painter`: tensor rows
        indented under their group, a group's row with its branch indicator. One pass down the
        rows shown, as the stock tree's paint, but without its call into Python per row."""
        if not self._painter.begin(area):
            return
        model, columns, header = self._rows_model, self._painter.columns, self.header()
        index = self.indexAt(QPoint(header.sectionViewportPosition(columns[0]), area.top()))
        if not index.isValid():
            return
        index = index.siblingAtColumn(0)
        column_x = header.sectionViewportPosition(header.logicalIndex(0))
        rect = self.visualRect(index)
        y, height = rect.y(), rect.height()
        alternating = self.alternatingRowColors()
        place = (y + self.verticalOffset()) // max(height, 1)   # the row's place among those shown
        indentation = self.indentation()
        decorated = 1 if self.rootIsDecorated() else 0
        selection = self.selectionModel()
        current = self.currentIndex()
        focus = _has_focus(self) and current.isValid()
        while index.isValid() and y <= area.bottom():
            cells = model.row_cells(index, columns)
            group = cells is None
            if group:
                cells = model.group_cells(index, columns)
                if cells is None:
                    break
            selected = selection is not None and selection.isSelected(index)
            depth = (0 if group else 1) + decorated
            self._painter.row(painter, y, height, cells, selected, alternating and place & 1 == 1,
                              indentation * depth)
            if group and decorated:
                self._draw_branch(painter, QRect(column_x, y, indentation, height), index)
            if focus and current.row() == index.row() and \
                    current.internalId() == index.internalId():
                self._painter.focus(painter, current, selected)
            index = self.indexBelow(index)
            y += height
            place += 1

    def _draw_branch(self, painter: QPainter, rect: QRect, group: QModelIndex) -> None:
        """A group row's branch indicator, in the state the stock tree gives it (its
        drawBranches reads the row from the stock paint's pass, so it cannot be called from
        this one)."""
        option = QStyleOptionViewItem()
        self.initViewItemOption(option)
        state = QStyle.StateFlag.State_Item
        if self.isEnabled():
            state |= QStyle.StateFlag.State_Enabled
        if self.hasFocus():
            state |= QStyle.StateFlag.State_Active
        if group.row() + 1 < self._rows_model.rowCount():
            state |= QStyle.StateFlag.State_Sibling
        if self._rows_model.hasChildren(group):
            state |= QStyle.StateFlag.State_Children
        if self.isExpanded(group):
            state |= QStyle.StateFlag.State_Open
        option.rect, option.state = rect, state
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_IndicatorBranch, option, painter,
                                   self)


class QtTensorTable(QWidget):
    """Filter box, grouping combo and the sortable tensor tree/table."""

    sig_tensor_selected = Signal(str)
    sig_range_selected = Signal("qlonglong", "qlonglong")   # offset, nbytes (64-bit)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.table_model = TensorTableModel(self)
        self.filter_edit = QLineEdit(self)
        self.filter_edit.setPlaceholderText("Filter by name: substring or glob (layers.*.moe_w1)")
        self.filter_edit.setClearButtonEnabled(True)
        self.group_combo = QComboBox(self)
        for key, label in (("none", "No grouping"), ("layer", "By layer"),
                           ("expert", "By expert")):
            self.group_combo.addItem(label, key)
        self.count_label = QLabel(self)
        # Flat, the rows are a QTableView's (it lays out no row: a fetch costs what it shows);
        # grouped, a QTreeView's. Both show the one model.
        self.table_view = _FlatTableView(self.table_model, self)
        self.table_view.verticalHeader().setVisible(False)
        self.table_view.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.table_view.verticalHeader().setDefaultSectionSize(
            self.table_view.fontMetrics().height() + 6)
        self.table_view.setShowGrid(False)
        self.table_view.setWordWrap(False)
        self.tree_view = _GroupTreeView(self.table_model, self)
        self.tree_view.setUniformRowHeights(True)
        self._header_states: dict[QHeaderView, QByteArray] = {}
        self._delegate = _CellDelegate(self.table_model, self)
        for view in (self.table_view, self.tree_view):
            view.setItemDelegate(self._delegate)
            view.setAlternatingRowColors(True)
            view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
            view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
            header = self._header(view)
            header.setStretchLastSection(False)
            header.setSortIndicator(COLUMNS.index("offset"), Qt.SortOrder.AscendingOrder)
            view.setSortingEnabled(True)   # a header click calls TensorTableModel.sort
            header.sortIndicatorChanged.connect(self._sorted)
        # A sort resets the model: keep the selected row selected (_hold_model puts the slot
        # after the view's).
        self.table_model.modelAboutToBeReset.connect(self._remember_current)
        self.table_model.modelReset.connect(self._after_reset)
        self._current: TensorRow | None = None
        self._keep_current = True
        self._restoring = False
        self._hold_model(self.table_view)
        self._name_width = self.table_view.columnWidth(0)
        self.views = QStackedWidget(self)
        self.views.addWidget(self.table_view)
        self.views.addWidget(self.tree_view)
        top = QHBoxLayout()
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.group_combo)
        top.addWidget(self.count_label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.views, 1)
        self.filter_edit.textChanged.connect(self._on_filter)
        self.group_combo.currentIndexChanged.connect(self._on_grouping)
        self._update_count()

    def _hold_model(self, view: QTableView | QTreeView) -> None:
        """Make `view` the one view holding the model. A hidden QTreeView holding it still lays
        out every top-level row after each reset and fetch (a call into Python for each), which
        cost the shown table's paints half their budget; the column widths and order a user
        set on either view are kept across the switch."""
        if view.model() is self.table_model:
            return
        for other in (self.table_view, self.tree_view):
            if other is not view and other.model() is self.table_model:
                self._header_states[self._header(other)] = self._header(other).saveState()
                selection = other.selectionModel()
                other.setModel(None)   # type: ignore[arg-type]
                selection.deleteLater()
        header = self._header(view)
        header.blockSignals(True)   # the saved state's sort is not the model's: no re-sort
        try:
            header.setSortIndicator(*self.table_model.sorting())
            view.setModel(self.table_model)
            state = self._header_states.get(header)
            if state is None:
                self._size_columns(view)
                if view is self.tree_view:   # the table's were sized before _name_width was known
                    self._fit_names(view)
            else:
                header.restoreState(state)
            header.setSortIndicator(*self.table_model.sorting())
        finally:
            header.blockSignals(False)
        if view is self.tree_view:
            self.tree_view.expand_groups()
        # after the view's own: its reset forgets the current row and the selection
        self.table_model.modelReset.disconnect(self._after_reset)
        self.table_model.modelReset.connect(self._after_reset)
        view.selectionModel().currentRowChanged.connect(self._on_current)

    @staticmethod
    def _size_columns(view: QTableView | QTreeView) -> None:
        metrics = view.fontMetrics()
        for column, sample in zip(COLUMNS, ("layers.00.moe_w1[7]", "bf16", "[32, 1024, 4096]",
                                            "0x1fffff000", "999,999,999", "unchecked", "layer",
                                            "expert", "embedding")):
            width = max(metrics.horizontalAdvance(sample), metrics.horizontalAdvance(column))
            view.setColumnWidth(COLUMNS.index(column), width + 18)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt API)
        """Names get the width the other columns leave (GGUF and Hugging Face names are long)."""
        super().resizeEvent(event)
        self._fit_names(self.view)

    def _fit_names(self, view: QTableView | QTreeView) -> None:
        others = sum(view.columnWidth(c) for c in range(1, len(COLUMNS)))
        room = self.width() - others - view.verticalScrollBar().sizeHint().width() - 8
        view.setColumnWidth(0, max(self._name_width, room))

    @staticmethod
    def _header(view: QTableView | QTreeView) -> QHeaderView:
        return view.horizontalHeader() if isinstance(view, QTableView) else view.header()

    @property
    def view(self) -> QTableView | QTreeView:
        """The view showing the rows now: the table when flat, the tree when grouped."""
        return self.tree_view if self.table_model.grouping() != "none" else self.table_view

    def header(self) -> QHeaderView:
        """The column header of the view shown."""
        return self._header(self.view)

    # -- public API -------------------------------------------------------------------------

    def set_model(self, model: Model | None) -> None:
        self.set_rows(T.rows_for(model) if model is not None else [])

    def set_rows(self, rows: list[TensorRow]) -> None:
        self._keep_current = False   # a new table: nothing of the old one stays selected
        try:
            self.table_model.set_rows(rows)
        finally:
            self._keep_current = True

    def set_check_status(self, status: dict[str, str]) -> None:
        self.table_model.set_check_status(status)

    def set_grouping(self, grouping: str) -> None:
        index = self.group_combo.findData(grouping)
        if index < 0:
            raise ValueError(f"unknown grouping {grouping!r}")
        self.group_combo.setCurrentIndex(index)

    def set_filter(self, pattern: str) -> None:
        self.filter_edit.setText(pattern)

    def select_tensor(self, name: str, expert: int | None = None) -> bool:
        index = self.table_model.find(name, expert)
        if not index.isValid() and self.table_model.pattern().strip():
            self.filter_edit.clear()   # filtered out: clear the filter so it can be shown
            index = self.table_model.find(name, expert)
        if not index.isValid():
            return False
        self.view.scrollTo(index)
        self.view.selectionModel().setCurrentIndex(
            index, QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows)
        return True

    def selected_row(self) -> TensorRow | None:
        index = self.view.currentIndex()
        if not index.isValid():
            return None
        return self.table_model.row_at(index)

    def focus_filter(self) -> None:
        self.filter_edit.setFocus()
        self.filter_edit.selectAll()

    def visible_rows(self) -> list[TensorRow]:
        """The tensor rows the table shows, in display order (through filter and sort),
        including those the view has not fetched yet."""
        return self.table_model.shown_rows()

    def export_csv(self, path: str | os.PathLike[str]) -> int:
        """Write the shown rows (filtered, sorted) as CSV; returns the number of rows."""
        rows = [replace(r, check=self.table_model.check_of(r)) for r in self.visible_rows()]
        T.export_csv(rows, path)
        return len(rows)

    # -- slots ------------------------------------------------------------------------------

    def _remember_current(self) -> None:
        self._current = self.selected_row() if self._keep_current else None
        self.tree_view.remember_groups(self._keep_current)

    def _sorted(self, column: int, order: Qt.SortOrder) -> None:
        """Both views' headers show the model's sort (the hidden one's too)."""
        for view in (self.table_view, self.tree_view):
            header = self._header(view)
            if (header.sortIndicatorSection(), header.sortIndicatorOrder()) != (column, order):
                header.blockSignals(True)
                header.setSortIndicator(column, order)
                header.blockSignals(False)

    def _after_reset(self) -> None:
        self._hold_model(self.view)
        self.views.setCurrentWidget(self.view)
        self._update_count()
        current, self._current = self._current, None
        if current is not None:
            index = self.table_model.find(current.name, current.expert)
            if index.isValid():   # the same row again: no new selection signal
                self._restoring = True
                try:
                    self.view.selectionModel().setCurrentIndex(
                        index, QItemSelectionModel.SelectionFlag.ClearAndSelect
                        | QItemSelectionModel.SelectionFlag.Rows)
                finally:
                    self._restoring = False
                self.view.scrollTo(index)

    def _on_filter(self, text: str) -> None:
        self.table_model.set_pattern(text)

    def _on_grouping(self, _index: int) -> None:
        self.table_model.set_grouping(str(self.group_combo.currentData()))

    def _on_current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        row = self.table_model.row_at(current)
        if row is None or self._restoring:
            return
        self.sig_tensor_selected.emit(row.name)
        self.sig_range_selected.emit(row.offset, row.nbytes)

    def _update_count(self) -> None:
        total = self.table_model.total_count()
        shown = self.table_model.shown_count() if self.table_model.pattern().strip() else total
        self.count_label.setText(f"{shown} / {total} tensors" if shown != total
                                 else f"{total} tensors")


__all__ = ["COLUMNS", "EXPAND_ALL_ROWS", "FETCH_GROUP_ROWS", "FETCH_ROWS", "QtTensorTable",
           "ROW_ROLE", "SORT_ROLE", "TensorTableModel"]
