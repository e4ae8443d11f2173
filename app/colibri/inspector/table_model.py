"""What the Inspector's flat table models share: the index type Qt hands them, and a base whose
columns are its class's `COLUMNS`, with the horizontal header's text and tooltips (`TIPS`, by
column name) answered once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

Index = QModelIndex | QPersistentModelIndex


class ColumnTableModel(QAbstractTableModel):
    """A QAbstractTableModel whose columns are `COLUMNS`; subclasses give rowCount and data."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    TIPS: ClassVar[Mapping[str, str]] = {}

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation != Qt.Orientation.Horizontal:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.TIPS.get(self.COLUMNS[section])
        return None
