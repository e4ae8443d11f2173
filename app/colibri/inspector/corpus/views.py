"""The Corpus view's plots, each drawing arrays it is given (from `colibri.profile.results`):

  * `QtMatrixHeatmap`    - a labelled matrix (expert load per layer, expert x token class,
                           co-selection) with a colour bar, hover text and click selection; a
                           diverging colour map centred on 0 for differences.
  * `QtMarginHistogram`  - cells per selection-margin bin (fractions), bars; one profile or a
                           difference.
  * `QtFlipRate`         - the sampled jitter's flip rate per ULP-margin bin, one line a variant.
  * `QtExpertDetail`     - what chose one expert most: its tokens (count, share of the expert,
                           share of the token's occurrences) and its highest-weight contexts.
Each keeps the numbers it draws (`values()`, `bars()`, `lines()`) so tests compare them with the
profile; none computes a statistic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QTabWidget,
                               QVBoxLayout, QWidget)

from colibri.inspector.plots import cell_under
from colibri.inspector.readout import QtCellReadout
from colibri.profile.results import Example, TokenRow

_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
            (140, 86, 75), (227, 119, 194), (127, 127, 127)]


def _ticks(labels: Sequence[str], limit: int = 40) -> list[list[tuple[float, str]]]:
    step = max(1, len(labels) // limit)
    return [[(i + 0.5, str(label)) for i, label in enumerate(labels) if i % step == 0]]


class QtMatrixHeatmap(QWidget):
    """values[row][col] as an image, rows upwards; `sig_cell_selected(row, col)` on a click."""

    sig_cell_selected = Signal(int, int)

    def __init__(self, title: str, row_axis: str, col_axis: str,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.plot = self.graphics.addPlot(title=title)
        self.plot.setLabel("left", row_axis)
        self.plot.setLabel("bottom", col_axis)
        self.plot.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.bar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get("viridis"),
                                   interactive=False)
        self.bar.setImageItem(self.image, insert_in=self.plot)
        self.marker = pg.ScatterPlotItem(size=14, pen=pg.mkPen("w", width=2), brush=None,
                                         symbol="s")
        self.plot.addItem(self.marker)
        self.hover = QtCellReadout(self.plot, self._cell_at, self.describe, "", self)
        self.hover.setObjectName("heatmapHover")
        self.hover.sig_cell_clicked.connect(self.sig_cell_selected)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.graphics, 1)
        layout.addWidget(self.hover)
        self._values: np.ndarray | None = None
        self._rows: list[str] = []
        self._cols: list[str] = []
        self._unit = ""

    def set_matrix(self, values: np.ndarray | None, rows: Sequence[str], cols: Sequence[str],
                   diverging: bool = False, unit: str = "", fmt: str = "{:.3f}",
                   col_ticks: Sequence[str] | None = None) -> None:
        """Show `values` [rows][cols] (NaN: no value, drawn as 0 or the lowest colour); `diverging` centres the
        colour map on 0 (differences); `col_ticks` are shorter column names for the axis."""
        self._values = None if values is None else np.asarray(values, dtype=np.float64)
        self._rows, self._cols, self._unit, self._fmt = list(rows), list(cols), unit, fmt
        self._col_ticks = list(col_ticks) if col_ticks is not None else self._cols
        self.marker.setData([], [])
        if self._values is None or self._values.size == 0:
            self.image.clear()
            return
        finite = self._values[np.isfinite(self._values)]
        if diverging:
            top = float(np.abs(finite).max()) if finite.size else 1.0
            levels = (-max(top, 1e-12), max(top, 1e-12))
            self.bar.setColorMap(pg.colormap.get("CET-D1"))
        else:
            lo = float(finite.min()) if finite.size else 0.0
            hi = float(finite.max()) if finite.size else 1.0
            levels = (lo, hi if hi > lo else lo + 1e-12)
            self.bar.setColorMap(pg.colormap.get("viridis"))
        # no value (NaN): the colour of 0 on a diverging map, else the lowest
        drawn = np.where(np.isfinite(self._values), self._values, 0.0 if diverging else levels[0])
        self.image.setImage(drawn, autoLevels=False)
        self.image.setRect(0, 0, drawn.shape[1], drawn.shape[0])
        self.bar.setLevels(levels)
        self.plot.getAxis("left").setTicks(_ticks(self._rows))
        self.plot.getAxis("bottom").setTicks(_ticks(self._col_ticks))

    def values(self) -> np.ndarray | None:
        return self._values

    def mark(self, row: int, col: int | None) -> None:
        """Outline a cell (col None: the whole row's first cell is not marked, only the row)."""
        if col is None or self._values is None:
            self.marker.setData([], [])
            return
        self.marker.setData([col + 0.5], [row + 0.5])

    def _cell_at(self, scene_pos: Any) -> tuple[int, int] | None:
        if self._values is None:
            return None
        rows, cols = self._values.shape
        cell = cell_under(self.plot, scene_pos, cols, rows)
        return None if cell is None else (cell[1], cell[0])  # (row, column)

    def describe(self, row: int, col: int) -> str:
        assert self._values is not None
        value = self._values[row, col]
        text = "-" if not np.isfinite(value) else self._fmt.format(value)
        return f"{self._rows[row]}, {self._cols[col]}: {text}{self._unit}"


class QtMarginHistogram(QWidget):
    """The fraction of a layer's cells in each margin bin, as bars (one or more series)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.plot = self.graphics.addPlot(title="Selection margins")
        self.plot.setLabel("left", "fraction of cells")
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.plot.setMenuEnabled(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.graphics)
        self._bars: dict[str, np.ndarray] = {}

    def set_bars(self, series: dict[str, np.ndarray], labels: Sequence[str], unit: str) -> None:
        """`series`: name -> fraction per bin; `labels`: each bin's lower bound. Bins with no
        cell in any series at either end are left out."""
        self.plot.clear()
        self._bars = {k: np.asarray(v, dtype=np.float64) for k, v in series.items()}
        self.plot.setLabel("bottom", f"margin ({unit}, bins from)")
        if not self._bars:
            return
        used = np.flatnonzero(np.any([v != 0 for v in self._bars.values()], axis=0))
        if used.size == 0:
            return
        keep = np.arange(used.min(), used.max() + 1)
        width = 0.8 / len(self._bars)
        legend = self.plot.addLegend(offset=(10, 10)) if len(self._bars) > 1 else None
        for i, (name, values) in enumerate(self._bars.items()):
            color = _PALETTE[i % len(_PALETTE)]
            x = np.arange(keep.size) - 0.4 + width * (i + 0.5)
            item = pg.BarGraphItem(x=x, height=values[keep], width=width,
                                   brush=pg.mkBrush(*color))
            self.plot.addItem(item)
            if legend is not None:
                legend.addItem(item, name)
        step = max(1, -(-keep.size // 8))
        self.plot.getAxis("bottom").setTicks(
            [[(j, str(labels[b])) for j, b in enumerate(keep) if j % step == 0]])

    def bars(self) -> dict[str, np.ndarray]:
        return self._bars


class QtFlipRate(QWidget):
    """Flip rate (flips / cells) per ULP-margin bin of the sampled windows, one line a series."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.plot = self.graphics.addPlot(title="Flip rate by margin (sampled jitter)")
        self.plot.setLabel("left", "flip rate")
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.plot.setLabel("bottom", "margin (ULP, bins from)")
        self.plot.setMenuEnabled(False)
        self.empty = pg.TextItem("", anchor=(0.5, 0.5))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.graphics)
        self._lines: dict[str, np.ndarray] = {}

    def set_lines(self, series: dict[str, np.ndarray], labels: Sequence[str],
                  message: str = "") -> None:
        """`series`: name -> rate per ULP bin (NaN: no sampled cell there)."""
        self.plot.clear()
        self._lines = {k: np.asarray(v, dtype=np.float64) for k, v in series.items()}
        finite = [np.flatnonzero(np.isfinite(v)) for v in self._lines.values()]
        used = np.concatenate(finite) if finite else np.zeros(0, np.int64)
        if used.size == 0:
            self.empty.setText(message or "no jitter variants in this profile")
            self.plot.addItem(self.empty)
            self.empty.setPos(0.5, 0.5)
            return
        self.plot.addLegend(offset=(10, 10))
        for i, (name, values) in enumerate(self._lines.items()):
            ok = np.isfinite(values)
            color = _PALETTE[i % len(_PALETTE)]
            self.plot.plot(np.flatnonzero(ok), values[ok], pen=pg.mkPen(color, width=2),
                           symbol="o", symbolSize=6, symbolBrush=pg.mkBrush(*color), name=name)
        lo, hi = int(used.min()), int(used.max())
        step = max(1, -(-(hi - lo + 1) // 8))
        self.plot.getAxis("bottom").setTicks(
            [[(b, str(labels[b])) for b in range(lo, hi + 1) if (b - lo) % step == 0]])

    def lines(self) -> dict[str, np.ndarray]:
        return self._lines


def _item(text: str, number: float | None = None) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if number is not None:
        item.setData(Qt.ItemDataRole.UserRole, number)
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _visible(text: str) -> str:
    return text.replace("\n", "\u21b5").replace("\t", "\u2192")


class QtExpertDetail(QWidget):
    """Tokens and contexts that chose one expert most (two tabs of small tables)."""

    TOKEN_COLUMNS = ("token", "class", "count", "of expert", "of token")
    EXAMPLE_COLUMNS = ("weight", "record:token", "context")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel("Click an expert in a heatmap to list the tokens that chose it.")
        self.title.setObjectName("expertTitle")
        self.title.setWordWrap(True)
        self.tokens = QTableWidget(0, len(self.TOKEN_COLUMNS))
        self.tokens.setObjectName("expertTokens")
        self.tokens.setHorizontalHeaderLabels(self.TOKEN_COLUMNS)
        self.examples = QTableWidget(0, len(self.EXAMPLE_COLUMNS))
        self.examples.setObjectName("expertExamples")
        self.examples.setHorizontalHeaderLabels(self.EXAMPLE_COLUMNS)
        for table in (self.tokens, self.examples):
            table.verticalHeader().setVisible(False)
            table.setAlternatingRowColors(True)
            table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.examples.horizontalHeader().setStretchLastSection(True)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.tokens, "Tokens")
        self.tabs.addTab(self.examples, "Contexts")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.tabs, 1)

    def show_expert(self, title: str, tokens: list[TokenRow], examples: list[Example]) -> None:
        self.title.setText(title)
        self.tokens.setRowCount(len(tokens))
        for r, row in enumerate(tokens):
            self.tokens.setItem(r, 0, _item(repr(row.text)[1:-1]))
            self.tokens.setItem(r, 1, _item(row.token_class))
            self.tokens.setItem(r, 2, _item(f"{row.count:,}", row.count))
            self.tokens.setItem(r, 3, _item(f"{row.share_of_expert:.1%}", row.share_of_expert))
            self.tokens.setItem(r, 4, _item(f"{row.share_of_token:.0%}", row.share_of_token))
        self.examples.setRowCount(len(examples))
        for r, ex in enumerate(examples):
            self.examples.setItem(r, 0, _item(f"{ex.weight:.3f}", ex.weight))
            self.examples.setItem(r, 1, _item(f"{ex.record}:{ex.offset}"))
            self.examples.setItem(r, 2, _item(
                f"\u2026{_visible(ex.before)} \u27e8{_visible(ex.token)}\u27e9 "
                f"{_visible(ex.after)}\u2026"))

    def clear(self, title: str = "") -> None:
        self.show_expert(title or "Click an expert in a heatmap to list the tokens that chose "
                         "it.", [], [])
