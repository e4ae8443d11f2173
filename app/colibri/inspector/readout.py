"""The lines of text the Inspector's views write as things happen: what a run or a request is
doing, what the pointer is over.

  * `wrapping(label)` - a label whose text changes with the run or the pointer wraps, and its
                        width never grows the panel it sits in (one long token or error message
                        would otherwise widen the whole window).
  * `QtCellReadout`   - the line under a heatmap: a caption until the pointer is over a cell,
                        then what the view says of that cell; a click on a cell is a signal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

CellAt = Callable[[Any], tuple[int, int] | None]


def wrapping(label: QLabel) -> QLabel:
    """`label`, set to wrap its text within the width its layout gives it."""
    label.setWordWrap(True)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    return label


class QtCellReadout(QLabel):
    """A wrapping label following the pointer over `plot`: `describe(a, b)` of the cell (a, b)
    that `cell_at(scene_pos)` finds there, `caption` elsewhere; `sig_cell_clicked(a, b)` on a
    click on a cell. The cell's two indices are in whatever order the view's `cell_at` gives."""

    sig_cell_clicked = Signal(int, int)

    def __init__(self, plot: pg.PlotItem, cell_at: CellAt, describe: Callable[[int, int], str],
                 caption: str = "", parent: QWidget | None = None) -> None:
        super().__init__(caption, parent)
        wrapping(self)
        self.caption = caption
        self._cell_at = cell_at
        self._describe = describe
        plot.scene().sigMouseMoved.connect(self._moved)
        plot.scene().sigMouseClicked.connect(self._clicked)

    def _moved(self, scene_pos: Any) -> None:
        cell = self._cell_at(scene_pos)
        self.setText(self._describe(*cell) if cell else self.caption)

    def _clicked(self, event: Any) -> None:
        cell = self._cell_at(event.scenePos())
        if cell:
            self.sig_cell_clicked.emit(*cell)
