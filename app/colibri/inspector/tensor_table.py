"""The tensor table: a lazy item model over `TensorRow`s, sorted and filtered by a proxy.

Owns the Qt side of `colibri.inspection.tensors`. `TensorTableModel` formats cells on demand
from a list of rows (no per-cell items, so a million-tensor table costs one Python object per
tensor); with a grouping ('layer' or 'expert') it becomes a two-level tree whose top rows are
the groups, otherwise it is a flat table. `TensorFilterProxy` sorts on raw values
(`SORT_ROLE`: numbers sort as numbers) and filters by the name pattern of
`tensors.name_matches` (substring or glob), keeping a group while any of its rows matches.
`QtTensorTable` puts a filter line edit and a grouping combo over a QTreeView and reports the
selected tensor as `sig_tensor_selected(name)` and its byte range (an expert's slice when the
row is one) as `sig_range_selected(offset, nbytes)`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import (QAbstractItemModel, QItemSelectionModel, QModelIndex,
                            QPersistentModelIndex, QSortFilterProxyModel, Qt, Signal)
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QHBoxLayout, QLabel, QLineEdit,
                               QTreeView, QVBoxLayout, QWidget)

from colibri.inspection import tensors as T
from colibri.inspection.tensors import TensorRow

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

# What identifies a tensor and where its bytes are come first, so they show beside the hexdump
# without scrolling; layer, expert and kind (also readable from the name) follow.
COLUMNS = ("name", "dtype", "shape", "offset", "bytes", "check", "layer", "expert", "kind")
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ROW_ROLE = Qt.ItemDataRole.UserRole + 2          # the TensorRow of a leaf, None for a group
CHECK_COLOURS = {"ok": QColor(40, 140, 60), "bad": QColor(200, 40, 40),
                 "unchecked": QColor(130, 130, 130)}
_Index = QModelIndex | QPersistentModelIndex


def _fmt_bytes(n: int) -> str:
    return f"{n:,}"


class TensorTableModel(QAbstractItemModel):
    """Flat (grouping 'none') or two-level (groups, then rows) model of tensor rows.

    Internal ids: a top-level item has id 0; a row inside group g has id g + 1."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._rows: list[TensorRow] = []
        self._groups: list[T.Group] = []
        self._grouping = "none"
        self._status: dict[str, str] = {}

    # -- content ----------------------------------------------------------------------------

    def set_rows(self, rows: list[TensorRow], grouping: str | None = None) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        if grouping is not None:
            if grouping not in T.GROUPINGS:
                raise ValueError(f"unknown grouping {grouping!r}")
            self._grouping = grouping
        self._groups = [] if self._grouping == "none" else T.group_rows(self._rows, self._grouping)
        self.endResetModel()

    def set_grouping(self, grouping: str) -> None:
        self.set_rows(self._rows, grouping)

    def grouping(self) -> str:
        return self._grouping

    def set_check_status(self, status: dict[str, str]) -> None:
        self._status = dict(status)
        col = COLUMNS.index("check")
        if self._grouping == "none":
            if self._rows:
                self.dataChanged.emit(self.index(0, col), self.index(len(self._rows) - 1, col))
        else:
            for g, (_label, rows) in enumerate(self._groups):
                if rows:
                    parent = self.index(g, 0)
                    self.dataChanged.emit(self.index(0, col, parent),
                                          self.index(len(rows) - 1, col, parent))

    def check_of(self, row: TensorRow) -> str:
        return self._status.get(row.name, row.check)

    def row_at(self, index: _Index) -> TensorRow | None:
        """The tensor row of an index (None for a group header or an invalid index)."""
        if not index.isValid():
            return None
        gid = index.internalId()
        if self._grouping == "none":
            return self._rows[index.row()] if gid == 0 and index.row() < len(self._rows) else None
        if gid == 0:
            return None
        rows = self._groups[gid - 1][1]
        return rows[index.row()] if index.row() < len(rows) else None

    def find(self, name: str, expert: int | None = None) -> QModelIndex:
        """The first index (column 0) showing tensor `name` (and expert slice `expert`)."""
        if self._grouping == "none":
            for i, r in enumerate(self._rows):
                if r.name == name:
                    return self.index(i, 0)
            return QModelIndex()
        fallback = QModelIndex()
        for g, (_label, rows) in enumerate(self._groups):
            for i, r in enumerate(rows):
                if r.name == name:
                    if r.expert == expert:
                        return self.index(i, 0, self.index(g, 0))
                    if not fallback.isValid():
                        fallback = self.index(i, 0, self.index(g, 0))
        return fallback

    def leaf_rows(self) -> list[TensorRow]:
        if self._grouping == "none":
            return list(self._rows)
        return [r for _label, rows in self._groups for r in rows]

    # -- QAbstractItemModel -----------------------------------------------------------------

    def index(self, row: int, column: int, parent: _Index = QModelIndex()) -> QModelIndex:
        if not self.hasIndex(row, column, parent):
            return QModelIndex()
        if not parent.isValid():
            return self.createIndex(row, column, 0)
        return self.createIndex(row, column, parent.row() + 1)

    def parent(self, index: _Index = QModelIndex()) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        gid = index.internalId()
        if gid == 0:
            return QModelIndex()
        return self.createIndex(gid - 1, 0, 0)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:
        if not parent.isValid():
            return len(self._rows) if self._grouping == "none" else len(self._groups)
        if self._grouping == "none" or parent.internalId() != 0 or parent.column() != 0:
            return 0
        return len(self._groups[parent.row()][1])

    def columnCount(self, parent: _Index = QModelIndex()) -> int:
        return len(COLUMNS)

    def hasChildren(self, parent: _Index = QModelIndex()) -> bool:
        return self.rowCount(parent) > 0

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            if 0 <= section < len(COLUMNS):
                return COLUMNS[section]
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        col = index.column()
        row = self.row_at(index)
        if row is None:  # a group header
            if self._grouping == "none" or index.internalId() != 0:
                return None
            label, rows = self._groups[index.row()]
            if role == Qt.ItemDataRole.DisplayRole:
                if col == 0:
                    return f"{label} ({len(rows)})"
                if col == COLUMNS.index("bytes"):
                    return _fmt_bytes(sum(r.nbytes for r in rows))
                return None
            if role == SORT_ROLE:
                return index.row()
            return None
        name = COLUMNS[col]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(row, name)
        if role == SORT_ROLE:
            return self._sort_key(row, name)
        if role == ROW_ROLE:
            return row
        if role == Qt.ItemDataRole.ToolTipRole:
            return (f"{row.label}\n{row.dtype} {row.shape_text}\n"
                    f"bytes [0x{row.offset:x}, 0x{row.offset + row.nbytes:x})")
        if role == Qt.ItemDataRole.ForegroundRole and name == "check":
            return QBrush(CHECK_COLOURS.get(self.check_of(row), QColor(0, 0, 0)))
        if role == Qt.ItemDataRole.TextAlignmentRole and name in ("layer", "expert", "offset",
                                                                  "bytes"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def _display(self, row: TensorRow, name: str) -> str:
        if name == "name":
            return row.label
        if name == "layer":
            return "" if row.layer is None else str(row.layer)
        if name == "expert":
            if row.expert is not None:
                return str(row.expert)
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
        if name == "name":
            return row.label
        if name == "layer":
            return -1 if row.layer is None else row.layer
        if name == "expert":
            return -1 if row.expert is None else row.expert
        if name == "shape":
            return T.element_count(row.shape)
        if name == "offset":
            return row.offset
        if name == "bytes":
            return row.nbytes
        if name == "check":
            return self.check_of(row)
        return getattr(row, name)


class TensorFilterProxy(QSortFilterProxyModel):
    """Sorts on SORT_ROLE and keeps rows whose label matches the pattern (substring or glob)."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._pattern = ""
        self.setSortRole(SORT_ROLE)
        self.setRecursiveFilteringEnabled(True)
        self.setDynamicSortFilter(True)

    def set_pattern(self, pattern: str) -> None:
        self.beginFilterChange()
        self._pattern = pattern
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def pattern(self) -> str:
        return self._pattern

    def filterAcceptsRow(self, source_row: int, source_parent: _Index) -> bool:
        if not self._pattern.strip():
            return True
        model = self.sourceModel()
        assert isinstance(model, TensorTableModel)
        row = model.row_at(model.index(source_row, 0, source_parent))
        return row is not None and T.name_matches(row.label, self._pattern)


class QtTensorTable(QWidget):
    """Filter box, grouping combo and the sortable tensor tree/table."""

    sig_tensor_selected = Signal(str)
    sig_range_selected = Signal("qlonglong", "qlonglong")   # offset, nbytes (64-bit)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.table_model = TensorTableModel(self)
        self.proxy = TensorFilterProxy(self)
        self.proxy.setSourceModel(self.table_model)
        self.filter_edit = QLineEdit(self)
        self.filter_edit.setPlaceholderText("Filter by name: substring or glob (layers.*.moe_w1)")
        self.filter_edit.setClearButtonEnabled(True)
        self.group_combo = QComboBox(self)
        for key, label in (("none", "No grouping"), ("layer", "By layer"),
                           ("expert", "By expert")):
            self.group_combo.addItem(label, key)
        self.count_label = QLabel(self)
        self.view = QTreeView(self)
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(COLUMNS.index("offset"), Qt.SortOrder.AscendingOrder)
        self.view.setUniformRowHeights(True)
        self.view.setRootIsDecorated(False)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.header().setStretchLastSection(False)
        metrics = self.view.fontMetrics()
        for column, sample in zip(COLUMNS, ("layers.00.moe_w1[7]", "bf16", "[32, 1024, 4096]",
                                            "0x1fffff000", "999,999,999", "unchecked", "layer",
                                            "expert", "attention")):
            width = max(metrics.horizontalAdvance(sample), metrics.horizontalAdvance(column))
            self.view.setColumnWidth(COLUMNS.index(column), width + 18)
        top = QHBoxLayout()
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.group_combo)
        top.addWidget(self.count_label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.view, 1)
        self.filter_edit.textChanged.connect(self._on_filter)
        self.group_combo.currentIndexChanged.connect(self._on_grouping)
        self.view.selectionModel().currentRowChanged.connect(self._on_current)
        self._update_count()

    # -- public API -------------------------------------------------------------------------

    def set_model(self, model: Model | None) -> None:
        rows = T.rows_for(model) if model is not None else []
        self.table_model.set_rows(rows)
        self._after_reset()

    def set_rows(self, rows: list[TensorRow]) -> None:
        self.table_model.set_rows(rows)
        self._after_reset()

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
        source = self.table_model.find(name, expert)
        if not source.isValid():
            return False
        index = self.proxy.mapFromSource(source)
        if not index.isValid():  # filtered out: clear the filter so it can be shown
            self.filter_edit.clear()
            index = self.proxy.mapFromSource(self.table_model.find(name, expert))
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
        return self.table_model.row_at(self.proxy.mapToSource(index))

    def focus_filter(self) -> None:
        self.filter_edit.setFocus()
        self.filter_edit.selectAll()

    def visible_rows(self) -> list[TensorRow]:
        """The tensor rows the view shows, in display order (through filter and sort)."""
        out: list[TensorRow] = []

        def walk(parent: QModelIndex) -> None:
            for r in range(self.proxy.rowCount(parent)):
                index = self.proxy.index(r, 0, parent)
                row = self.table_model.row_at(self.proxy.mapToSource(index))
                if row is not None:
                    out.append(row)
                else:
                    walk(index)

        walk(QModelIndex())
        return out

    def export_csv(self, path: str | os.PathLike[str]) -> int:
        """Write the shown rows (filtered, sorted) as CSV; returns the number of rows."""
        rows = [replace(r, check=self.table_model.check_of(r)) for r in self.visible_rows()]
        T.export_csv(rows, path)
        return len(rows)

    # -- slots ------------------------------------------------------------------------------

    def _after_reset(self) -> None:
        self.view.setRootIsDecorated(self.table_model.grouping() != "none")
        if self.table_model.grouping() != "none":
            if self.proxy.rowCount() <= 64:
                self.view.expandAll()
        self._update_count()

    def _on_filter(self, text: str) -> None:
        self.proxy.set_pattern(text)
        if self.table_model.grouping() != "none" and text.strip():
            self.view.expandAll()
        self._update_count()

    def _on_grouping(self, _index: int) -> None:
        current = self.selected_row()
        self.table_model.set_grouping(str(self.group_combo.currentData()))
        self._after_reset()
        if current is not None:
            self.select_tensor(current.name, current.expert)

    def _on_current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        row = self.table_model.row_at(self.proxy.mapToSource(current))
        if row is None:
            return
        self.sig_tensor_selected.emit(row.name)
        self.sig_range_selected.emit(row.offset, row.nbytes)

    def _update_count(self) -> None:
        total = len(self.table_model._rows)
        shown = len(self.visible_rows()) if self.proxy.pattern().strip() else total
        self.count_label.setText(f"{shown} / {total} tensors" if shown != total
                                 else f"{total} tensors")


__all__ = ["COLUMNS", "QtTensorTable", "ROW_ROLE", "SORT_ROLE", "TensorFilterProxy",
           "TensorTableModel"]
