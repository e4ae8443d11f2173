"""The metadata tree of a GGUF file or safetensors checkpoint (`QtMetadataTree`).

`MetadataTreeModel` is a lazy item model over `inspection.foreign_tree.MetaNode`s: a node's
children enter the model `FETCH` at a time through `canFetchMore`/`fetchMore`, as the view
expands and scrolls, so a 151 000-element vocabulary array is never built as a whole. The view
shows key, type, value, offset and size; selecting a row emits `sig_range_selected(file,
offset, size)` for the hexdump (`file` indexes the document's `file_paths()`).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractItemModel, QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTreeView, QVBoxLayout, QWidget

from colibri.inspection.foreign_tree import FETCH, MetaNode
from colibri.inspector.table_model import Index

COLUMNS = ("Key", "Type", "Value", "Offset", "Size")


class MetadataTreeModel(QAbstractItemModel):
    """A lazily fetched tree over a `MetaNode` root (see the module docstring)."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._root = MetaNode("", "", "", count=0)

    def set_root(self, root: MetaNode) -> None:
        self.beginResetModel()
        self._root = root
        if not root.children:
            root.fetch()
        self.endResetModel()

    def root(self) -> MetaNode:
        return self._root

    def node(self, index: Index) -> MetaNode:
        """The node of `index` (the root for an invalid index)."""
        if not index.isValid():
            return self._root
        node = index.internalPointer()
        assert isinstance(node, MetaNode)
        return node

    def index_of(self, node: MetaNode) -> QModelIndex:
        if node is self._root or node.parent is None:
            return QModelIndex()
        return self.createIndex(node.row, 0, node)

    # -- QAbstractItemModel ---------------------------------------------------------------------

    def index(self, row: int, column: int, parent: Index = QModelIndex()) -> QModelIndex:
        children = self.node(parent).children
        if not 0 <= row < len(children) or not 0 <= column < len(COLUMNS):
            return QModelIndex()
        return self.createIndex(row, column, children[row])

    def parent(self, index: Index = QModelIndex()) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        up = self.node(index).parent
        if up is None or up is self._root:
            return QModelIndex()
        return self.createIndex(up.row, 0, up)

    def rowCount(self, parent: Index = QModelIndex()) -> int:
        if parent.isValid() and parent.column() != 0:
            return 0
        return len(self.node(parent).children)

    def columnCount(self, parent: Index = QModelIndex()) -> int:
        return len(COLUMNS)

    def hasChildren(self, parent: Index = QModelIndex()) -> bool:
        if parent.isValid() and parent.column() != 0:
            return False
        return self.node(parent).has_children()

    def canFetchMore(self, parent: Index) -> bool:
        if parent.isValid() and parent.column() != 0:
            return False
        return not self.node(parent).exhausted

    def fetchMore(self, parent: Index) -> None:
        node = self.node(parent)
        if node.exhausted:
            return
        # Produce the children first (the walk may find fewer than asked), then insert them.
        before = len(node.children)
        added = node.fetch(FETCH)
        if added:
            self.beginInsertRows(parent, before, before + len(added) - 1)
            self.endInsertRows()

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section] if 0 <= section < len(COLUMNS) else None
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        node = self.node(index)
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if column == 0:
                return node.key
            if column == 1:
                return node.type
            if column == 2:
                return node.value
            if node.offset < 0:
                return ""
            return f"0x{node.offset:X}" if column == 3 else f"{node.size:,}"
        if role == Qt.ItemDataRole.ToolTipRole:
            where = (f"\nbytes [0x{node.offset:X}, 0x{node.offset + node.size:X})"
                     if node.offset >= 0 else "")
            return f"{node.key} ({node.type})\n{node.value}{where}"
        if role == Qt.ItemDataRole.TextAlignmentRole and column >= 3:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class QtMetadataTree(QWidget):
    """The metadata tree view (see the module docstring)."""

    sig_range_selected = Signal(int, "qlonglong", "qlonglong")   # file, offset, size

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tree_model = MetadataTreeModel(self)
        self.view = QTreeView(self)
        self.view.setObjectName("metadataTree")
        self.view.setModel(self.tree_model)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.view.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        # the value gets what the others leave; a longer key shows in full in its tooltip
        metrics = self.view.fontMetrics()
        for column, sample in enumerate(("tokenizer.ggml.tokens", "string[151936]", "",
                                         "0x1FFFFFFFF", "99,999")):
            if sample:
                indent = 2 * self.view.indentation() if column == 0 else 0
                self.view.setColumnWidth(column, metrics.horizontalAdvance(sample) + 12 + indent)
        self.view.setTextElideMode(Qt.TextElideMode.ElideMiddle)   # a key's both ends
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        self.view.selectionModel().currentRowChanged.connect(self._current_changed)

    def set_root(self, root: MetaNode) -> None:
        self.tree_model.set_root(root)
        if self.tree_model.rowCount() <= 4:   # a GGUF file's sections, a checkpoint's files
            for row in range(self.tree_model.rowCount()):
                index = self.tree_model.index(row, 0)
                if self.tree_model.node(index).key in ("key/values", "header"):
                    self.view.expand(index)

    def select(self, path: list[str]) -> MetaNode:
        """Select the node reached by following `path` (keys from the top), expanding and
        fetching on the way, as clicks would (emits sig_range_selected)."""
        model = self.tree_model
        node = model.root()
        for key in path:
            parent = model.index_of(node)
            if parent.isValid():
                self.view.expand(parent)
            found = next((c for c in node.children if c.key == key), None)
            while found is None and model.canFetchMore(parent):
                before = len(node.children)
                model.fetchMore(parent)
                found = next((c for c in node.children[before:] if c.key == key), None)
            if found is None:
                raise KeyError(key)
            node = found
        index = model.index_of(node)
        self.view.scrollTo(index)
        self.view.selectionModel().setCurrentIndex(
            index, QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows)
        return node

    def _current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if not current.isValid():
            return
        node = self.tree_model.node(current)
        if node.offset >= 0:
            self.sig_range_selected.emit(node.file, node.offset, max(1, node.size))


__all__ = ["COLUMNS", "MetadataTreeModel", "QtMetadataTree"]
