"""The routing-jitter lab's views, each over a Qt-free report from `colibri.jitter`:

  * `QtJitterHeatmap`  - a `JitterReport`'s cell flip rate (positions x MoE layers: the fraction
                         of variants that change the cell's selected set); click = select a cell.
  * `QtMarginHeatmap`  - the baseline's selection margin in ULPs, log2(1 + ULPs) coloured.
  * `QtFlipsVsMargin`  - every cell as (log2(1 + margin ULPs), variants flipping it), plus the
                         report's margin bins as bars (flipped pairs per bin).
  * `QtCellLogits`     - one cell: the selection scores of every run side by side (what the
                         choice ranked: the router logits for a softmax without a bias, sigmoid +
                         correction bias for DeepSeek-V3; a table, rows = runs, columns =
                         experts; selected experts marked, flipped runs tinted) and each
                         variant's offsets from the baseline in ULPs (signed log2 scale).
  * `QtEpsilonCurve`   - an `EpsilonReport`: jitter left and decisions changed (bias) against
                         epsilon, the recommended epsilon marked (eps 0 drawn one decade left of
                         the smallest positive epsilon, on a log axis).
  * `QtRoutingAB`      - two settings' routing maps (positions x (layer, expert), 1 = selected)
                         and their difference (+1 only in A, -1 only in B), the first divergent
                         position marked by a line.
  * `QtRemedies`       - a `RemedyReport`: plain top-k, stable top-k, soft routing and cached
                         routing side by side (a table of decisions changed, jitter left, flips
                         removed and added, divergence from plain top-k, experts per decision,
                         expert-cache hit rate, kept decisions) and bars of flips removed
                         against decisions changed per remedy.
Each exposes the numbers it draws (`values()`, `points()`, `curve()`, ...) so tests can compare
them with the CLI's JSON; none recomputes an analysis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QIcon, QPixmap
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QHeaderView, QLabel, QPlainTextEdit,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from colibri.inspector.plots import IndexAxis, axes, cell_under, colour_bar, legend_row, tidy
from colibri.inspector.readout import QtCellReadout
from colibri.jitter.analysis import BASELINE, EpsilonReport, JitterReport, ordered_int
from colibri.jitter.remedies import RemedyReport

_FLIPPED = QColor(230, 140, 40, 90)
_SELECTED = QColor(120, 200, 120, 120)


# What a cell heatmap shows of a report: (values [P][M] as reported, image [P][M] as drawn,
# colour levels), and the hover text of cell (p, mi).
CellCompute = Callable[[JitterReport], tuple[np.ndarray, np.ndarray, tuple[float, float]]]
CellDescribe = Callable[[JitterReport, int, int], str]


class _CellHeatmap(QWidget):
    """A positions x MoE layers heatmap with a colour bar, hover text and click selection; what
    it shows is the `compute` and `describe` functions it is built with."""

    sig_cell_selected = Signal(int, int)  # position, moe_index

    def __init__(self, title: str, caption: str, colormap: str, compute: CellCompute,
                 describe: CellDescribe, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._compute = compute
        self._describe_cell = describe
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.layer_axis = IndexAxis("left", cells=True)
        self.plot = self.graphics.addPlot(
            title=title, axisItems=axes(IndexAxis("bottom", cells=True), self.layer_axis))
        self.plot.setLabel("bottom", "position")
        self.plot.setLabel("left", "MoE layer")
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.bar = colour_bar(self.plot, self.image, colormap)
        self.marker = pg.ScatterPlotItem(size=12, pen=pg.mkPen("w", width=2), brush=None,
                                         symbol="s")
        self.plot.addItem(self.marker)
        # what the colours mean until the pointer is over a cell, then that cell
        self.hover = QtCellReadout(self.plot, self._cell_at, self._describe, caption, self)
        self.hover.sig_cell_clicked.connect(self.sig_cell_selected)
        layout = QVBoxLayout(self)
        layout.addWidget(self.graphics, 1)
        layout.addWidget(self.hover)
        self.report: JitterReport | None = None
        self._values: np.ndarray | None = None

    def set_report(self, report: JitterReport | None) -> None:
        self.report = report
        if report is None or report.margin_ulps.size == 0:
            self._values = None
            self.image.clear()
            return
        self._values, drawn, levels = self._compute(report)
        self.image.setImage(drawn.T.astype(np.float64), autoLevels=False)  # rows = layers
        self.image.setRect(0, 0, drawn.shape[0], drawn.shape[1])
        self.bar.setLevels(levels)
        self.layer_axis.set_names([str(int(layer)) for layer in report.moe_layers])
        self.plot.setRange(xRange=(0, drawn.shape[0]), yRange=(0, drawn.shape[1]), padding=0)

    def values(self) -> np.ndarray | None:
        """The reported numbers behind the image, [P][M]."""
        return self._values

    def mark(self, p: int, mi: int) -> None:
        self.marker.setData([p + 0.5], [mi + 0.5])

    def _cell_at(self, scene_pos: Any) -> tuple[int, int] | None:
        if self._values is None:
            return None
        return cell_under(self.plot, scene_pos, *self._values.shape)  # (position, moe_index)

    def _describe(self, p: int, mi: int) -> str:
        assert self.report is not None   # a cell is found only over a report's values
        return self._describe_cell(self.report, p, mi)


def _flip_rate(report: JitterReport) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    rate = report.cell_flip_rate()
    return rate, rate, (0.0, max(float(rate.max()), 1e-9))


def _describe_flips(r: JitterReport, p: int, mi: int) -> str:
    who = [n for n in r.variants if r.flips(n)[p, mi]]
    return (f"position {p} layer {r.moe_layers[mi]}: flip rate {r.cell_flip_rate()[p, mi]:.3f}"
            f" ({len(who)}/{len(r.variants)}) {', '.join(who[:8])}")


def _margin(report: JitterReport) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    ulps = report.margin_ulps
    drawn = np.log2(1.0 + np.maximum(ulps, 0).astype(np.float64))
    return ulps, drawn, (0.0, max(float(drawn.max()), 1.0))


def _describe_margin(r: JitterReport, p: int, mi: int) -> str:
    return (f"position {p} layer {r.moe_layers[mi]}: margin {int(r.margin_ulps[p, mi])} ULP "
            f"({r.margin_abs[p, mi]:.3g}), top-k {r.sets[BASELINE][p, mi].tolist()}")


class QtJitterHeatmap(_CellHeatmap):
    """Flip rate per (position, MoE layer): the fraction of variants changing the top-k set."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("flip rate", "flip rate: the fraction of the variants that change "
                         "the cell's top-k set (hover a cell for which)", "inferno",
                         _flip_rate, _describe_flips, parent)


class QtMarginHeatmap(_CellHeatmap):
    """The baseline's selection margin per (position, MoE layer), in ULPs on a log scale."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("margin, log2(1 + ULPs)", "margin: the baseline's lowest chosen minus "
                         "highest unchosen selection score (or the kept/dropped group gap) in "
                         "float32 ULPs, on a log scale (dark: a near-tie)", "viridis", _margin,
                         _describe_margin, parent)


class QtFlipsVsMargin(QWidget):
    """Scatter of cells (log2(1 + margin ULPs), number of variants flipping) and bin bars."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.scatter_plot = tidy(self.graphics.addPlot(title="flips against margin",
                                                       axisItems=axes(left=IndexAxis("left"))))
        self.scatter_plot.setLabel("bottom", "log2(1 + margin ULPs), one dot per cell")
        self.scatter_plot.setLabel("left", "variants flipping the cell")
        self.scatter = pg.ScatterPlotItem(size=7, pen=None, brush=pg.mkBrush(230, 140, 40, 160))
        self.scatter_plot.addItem(self.scatter)
        self.graphics.nextRow()
        self.bin_axis = IndexAxis("bottom")
        self.bin_plot = tidy(self.graphics.addPlot(title="flip rate per margin bin",
                                                   axisItems=axes(self.bin_axis)))
        self.bin_plot.setLabel("bottom", "margin (ULPs)")
        for plot in (self.scatter_plot, self.bin_plot):
            plot.setMouseEnabled(x=False, y=False)
            plot.setRange(xRange=(-0.5, 0.5), yRange=(0, 1), padding=0)
        self.bars: pg.BarGraphItem | None = None
        layout = QVBoxLayout(self)
        layout.addWidget(self.graphics)
        self._points = np.zeros((0, 2))
        self._bins: list[dict[str, Any]] = []

    def set_report(self, report: JitterReport | None) -> None:
        if self.bars is not None:
            self.bin_plot.removeItem(self.bars)
            self.bars = None
        if report is None:
            self._points, self._bins = np.zeros((0, 2)), []
            self.scatter.clear()
            self.bin_axis.set_names(None)
            return
        x = np.log2(1.0 + np.maximum(report.margin_ulps, 0).astype(np.float64)).ravel()
        y = report.flip_counts().astype(np.float64).ravel()
        self._points = np.stack([x, y], axis=1)
        self.scatter.setData(x, y)
        self.scatter_plot.setRange(xRange=(-0.5, max(float(x.max()), 1.0) + 0.5),
                                   yRange=(-0.2, max(float(y.max()), 1.0) + 0.4), padding=0)
        self._bins = report.flips_vs_margin()
        rates = [b["flip_rate"] for b in self._bins]
        self.bars = pg.BarGraphItem(x=np.arange(len(rates)), height=rates, width=0.8,
                                    brush=pg.mkBrush(110, 130, 160))
        self.bin_plot.addItem(self.bars)
        # the bin names on an axis that thins them to what fits (2^17, 2^19, ... when narrow)
        self.bin_axis.set_names([b["label"] for b in self._bins])
        self.bin_plot.setRange(xRange=(-0.6, max(len(rates), 1) - 0.4),
                               yRange=(0, max(max(rates, default=0.0), 0.01) * 1.1), padding=0)

    def points(self) -> np.ndarray:
        """[cells][2]: log2(1 + margin ULPs), variants flipping (row-major cell order)."""
        return self._points

    def bins(self) -> list[dict[str, Any]]:
        return self._bins


class QtCellLogits(QWidget):
    """One cell's selection scores under every run, side by side."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel("click a cell of a heatmap", self)
        self.table = QTableWidget(self)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.plot = tidy(self.graphics.addPlot(title="offset from the baseline's selection "
                                                     "score: sign x log2(1 + |ULPs|)",
                                               axisItems=axes(IndexAxis("bottom"))))
        self.plot.setLabel("bottom", "expert")
        self.plot.setLabel("left", "ULPs, log2")
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setRange(xRange=(-0.5, 0.5), yRange=(-1, 1), padding=0)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.graphics, 1)
        self.cell: dict[str, Any] | None = None

    def set_cell(self, report: JitterReport | None, p: int | None = None,
                 mi: int | None = None) -> None:
        self.table.clear()
        self.plot.clear()
        if report is None or p is None or mi is None:
            self.cell = None
            self.table.setRowCount(0)
            return
        cell = report.cell(p, mi)
        self.cell = cell
        names = list(cell["runs"])
        E = report.n_experts
        self.title.setText(f"position {p} (token {cell['token']}) layer {cell['layer']}: "
                           f"margin {cell['margin_ulps']} ULP ({cell['margin_abs']:.3g})")
        self.table.setRowCount(len(names))
        self.table.setColumnCount(E + 2)
        self.table.setHorizontalHeaderLabels([f"e{j}" for j in range(E)] + ["selected", "flip"])
        self.table.setVerticalHeaderLabels(names)
        base = np.asarray(cell["runs"][BASELINE]["selection_scores"], dtype=np.float32)
        for row, name in enumerate(names):
            run = cell["runs"][name]
            for j, v in enumerate(run["selection_scores"]):
                item = QTableWidgetItem(f"{v:.9g}")
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
                if j in run["selected"]:
                    item.setBackground(QBrush(_SELECTED))
                self.table.setItem(row, j, item)
            sel = QTableWidgetItem(str(run["selected"]))
            flip = QTableWidgetItem("flip" if run["flipped"] else "")
            if run["flipped"]:
                flip.setBackground(QBrush(_FLIPPED))
                sel.setBackground(QBrush(_FLIPPED))
            self.table.setItem(row, E, sel)
            self.table.setItem(row, E + 1, flip)
        width = 0.8 / max(len(names) - 1, 1)
        reach = 1.0
        for i, name in enumerate(names[1:]):
            values = np.asarray(cell["runs"][name]["selection_scores"], dtype=np.float32)
            d = (ordered_int(values) - ordered_int(base)).astype(np.float64)
            d = np.sign(d) * np.log2(1.0 + np.abs(d))  # 1 ULP and 10^5 ULPs on one axis
            reach = max(reach, float(np.abs(d).max()))
            colour = pg.intColor(i, hues=max(len(names) - 1, 1))
            self.plot.addItem(pg.BarGraphItem(x=np.arange(E) - 0.4 + (i + 0.5) * width, height=d,
                                              width=width, brush=colour, name=name))
            # a swatch on the run's row of the table is the legend of its bars
            swatch = QPixmap(12, 12)
            swatch.fill(colour)
            self.table.verticalHeaderItem(i + 1).setIcon(QIcon(swatch))
        self.plot.setRange(xRange=(-0.6, E - 0.4), yRange=(-reach * 1.05, reach * 1.05), padding=0)

    def table_values(self) -> dict[str, list[float]]:
        """Run name -> the selection scores the table shows (parsed back from the cells)."""
        out = {}
        for row in range(self.table.rowCount()):
            name = self.table.verticalHeaderItem(row).text()
            out[name] = [float(self.table.item(row, j).text())
                         for j in range(self.table.columnCount() - 2)]
        return out


class QtEpsilonCurve(QWidget):
    """Jitter left and decisions changed at each epsilon of the sweep (one tick per epsilon, in
    the sweep's order, so eps = 0 is a point like the others); the recommendation marked."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.eps_axis = IndexAxis("bottom")
        self.plot = tidy(self.graphics.addPlot(title="stable top-k: jitter left and bias",
                                               axisItems=axes(self.eps_axis, IndexAxis("left"))))
        self.plot.setLabel("bottom", "epsilon")
        self.plot.setLabel("left", "cells")
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setRange(xRange=(-0.5, 0.5), yRange=(0, 1), padding=0)
        self.jitter = self.plot.plot([], [], pen=pg.mkPen((230, 90, 60), width=2), symbol="o",
                                     symbolBrush=(230, 90, 60), name="jitter left")
        self.bias = self.plot.plot([], [], pen=pg.mkPen((90, 140, 230), width=2), symbol="t",
                                   symbolBrush=(90, 140, 230), name="decisions changed (bias)")
        self.rec_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((120, 200, 120), width=2,
                                                               style=Qt.PenStyle.DashLine),
                                        label="recommended", labelOpts={
                                            "position": 0.9, "color": (120, 200, 120)})
        self.plot.addItem(self.rec_line)
        self.rec_line.hide()
        legend = legend_row(self.graphics.ci, 1, 2)
        legend.addItem(self.jitter, "jitter left")
        legend.addItem(self.bias, "decisions changed (bias)")
        self.text = QPlainTextEdit(self)
        self.text.setReadOnly(True)
        self.text.setMaximumHeight(self.fontMetrics().lineSpacing() * 7)
        layout = QVBoxLayout(self)
        layout.addWidget(self.graphics, 1)
        layout.addWidget(self.text)
        self._curve: list[dict[str, Any]] = []
        self._recommended: float | None = None

    def set_report(self, report: EpsilonReport | None) -> None:
        if report is None:
            self._curve, self._recommended = [], None
            self.jitter.setData([], [])
            self.bias.setData([], [])
            self.eps_axis.set_names(None)
            self.rec_line.hide()
            self.text.setPlainText("")
            return
        self._curve = [{"eps": r.eps, "jitter_left": r.jitter_left, "bias": r.n_bias}
                       for r in report.rows]
        x = np.arange(len(self._curve), dtype=np.float64)
        self.eps_axis.set_names([f"{c['eps']:g}" for c in self._curve])
        self.jitter.setData(x, [c["jitter_left"] for c in self._curve])
        self.bias.setData(x, [c["bias"] for c in self._curve])
        top = max([c["jitter_left"] for c in self._curve] + [c["bias"] for c in self._curve] + [1])
        self.plot.setRange(xRange=(-0.5, len(self._curve) - 0.5), yRange=(0, top * 1.1),
                           padding=0)
        rec = report.recommended()
        self._recommended = None if rec is None else rec.eps
        if rec is None:
            self.rec_line.hide()
            self.text.setPlainText("no epsilon of the list removes every flip")
            return
        self.rec_line.setValue(float([c["eps"] for c in self._curve].index(rec.eps)))
        self.rec_line.show()
        changed = report.changed_decisions(rec)
        lines = [f"recommended epsilon: {rec.eps:g} (smallest with no jitter left); it changes "
                 f"{len(changed)} decision(s) of plain top-k"]
        lines += [f"pos {c['position']} layer {c['layer']}: {c['plain']} -> {c['stable']}"
                  for c in changed]
        self.text.setPlainText("\n".join(lines))

    def curve(self) -> list[dict[str, Any]]:
        return self._curve

    def recommended(self) -> float | None:
        return self._recommended


def routing_map(sets: np.ndarray, n_experts: int) -> np.ndarray:
    """[P][M][k] selected sets -> [P][M * n_experts] one-hot (1 = selected)."""
    P, M, _ = sets.shape
    out = np.zeros((P, M, n_experts), dtype=np.int8)
    for idx in np.ndindex(P, M):
        for e in sets[idx]:
            if e >= 0:
                out[idx][e] = 1
    return out.reshape(P, M * n_experts)


class QtRoutingAB(QWidget):
    """Two settings' routing maps and their difference, first divergence marked."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.box_a = QComboBox(self)
        self.box_b = QComboBox(self)
        self.info = QLabel("", self)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.images: dict[str, pg.ImageItem] = {}
        self.lines: dict[str, pg.InfiniteLine] = {}
        self.plots: dict[str, pg.PlotItem] = {}
        self.row_axes: dict[str, IndexAxis] = {}
        for key, title in (("a", "A: experts selected"), ("b", "B: experts selected"),
                           ("diff", "A - B: orange only in A, blue only in B")):
            self.row_axes[key] = IndexAxis("left", cells=True)
            plot = self.graphics.addPlot(title=title, axisItems=axes(
                IndexAxis("bottom", cells=True), self.row_axes[key]))
            plot.setLabel("bottom", "position")
            plot.setLabel("left", "layer, expert")
            plot.setMouseEnabled(x=False, y=False)
            plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            image = pg.ImageItem(axisOrder="row-major")
            plot.addItem(image)
            line = pg.InfiniteLine(angle=90, pen=pg.mkPen((255, 60, 60), width=2))
            plot.addItem(line)
            line.hide()
            self.images[key], self.lines[key], self.plots[key] = image, line, plot
            self.graphics.nextRow()
        selected = pg.ColorMap([0.0, 1.0], [(30, 30, 30), (100, 160, 230)]).getLookupTable(nPts=2)
        self.images["a"].setLookupTable(selected)
        self.images["b"].setLookupTable(selected)
        self.images["diff"].setLookupTable(
            pg.ColorMap([0.0, 0.5, 1.0], [(60, 120, 230), (30, 30, 30), (230, 140, 40)])
            .getLookupTable(nPts=3))
        top = QHBoxLayout()
        top.addWidget(QLabel("A", self))
        top.addWidget(self.box_a, 1)
        top.addWidget(QLabel("B", self))
        top.addWidget(self.box_b, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.info)
        layout.addWidget(self.graphics, 1)
        self._settings: dict[str, np.ndarray] = {}
        self._n_experts = 0
        self._moe_layers: list[int] = []
        self._first: int | None = None
        self.box_a.currentTextChanged.connect(lambda _t: self._redraw())
        self.box_b.currentTextChanged.connect(lambda _t: self._redraw())

    def set_reports(self, jitter: JitterReport | None, epsilon: EpsilonReport | None) -> None:
        settings: dict[str, np.ndarray] = {}
        n_experts = 0
        report = jitter if jitter is not None else epsilon
        self._moe_layers = [int(x) for x in report.moe_layers] if report is not None else []
        if jitter is not None:
            n_experts = jitter.n_experts
            for name in [BASELINE, *jitter.variants]:
                settings[name] = jitter.sets[name]
        if epsilon is not None:
            n_experts = epsilon.n_experts
            settings.setdefault(BASELINE, epsilon.plain_sets)
            for row in epsilon.rows:
                settings[f"stable eps={row.eps:g}"] = row.sets
        self._settings, self._n_experts = settings, n_experts
        for box, pick in ((self.box_a, 0), (self.box_b, 1)):
            box.blockSignals(True)
            box.clear()
            box.addItems(list(settings))
            box.setCurrentIndex(min(pick, len(settings) - 1))
            box.blockSignals(False)
        self._redraw()

    def set_pair(self, a: str, b: str) -> None:
        self.box_a.setCurrentText(a)
        self.box_b.setCurrentText(b)
        self._redraw()

    def _redraw(self) -> None:
        a, b = self.box_a.currentText(), self.box_b.currentText()
        if a not in self._settings or b not in self._settings:
            for image in self.images.values():
                image.clear()
            self._first = None
            return
        sa, sb = self._settings[a], self._settings[b]
        ma, mb = routing_map(sa, self._n_experts), routing_map(sb, self._n_experts)
        diff = ma.astype(np.int16) - mb.astype(np.int16)
        rows = np.flatnonzero((sa != sb).any(axis=(1, 2)))
        self._first = int(rows[0]) if rows.size else None
        rows = [f"L{layer} e{e}" for layer in self._moe_layers for e in range(self._n_experts)]
        for key, data, levels in (("a", ma, (0, 1)), ("b", mb, (0, 1)), ("diff", diff + 1, (0, 2))):
            self.images[key].setImage(data.T.astype(np.float64), levels=levels)
            self.images[key].setRect(0, 0, data.shape[0], data.shape[1])
            self.row_axes[key].set_names(rows)
            self.plots[key].setRange(xRange=(0, data.shape[0]), yRange=(0, data.shape[1]),
                                     padding=0)
            if self._first is None:
                self.lines[key].hide()
            else:
                self.lines[key].setValue(self._first + 0.5)
                self.lines[key].show()
        changed = int((sa != sb).any(axis=-1).sum())
        cells = "1 cell differs" if changed == 1 else f"{changed} cells differ"
        self.info.setText(f"{cells}; first divergence: "
                          f"{'none' if self._first is None else f'position {self._first}'}")

    def first_divergence(self) -> int | None:
        return self._first

    def settings(self) -> list[str]:
        return list(self._settings)


class QtRemedies(QWidget):
    """The remedies report: one table row per remedy, and grouped bars (flips removed, decisions
    changed, jitter left) so the trade-off reads at a glance."""

    COLUMNS = ("decisions changed", "jitter left", "flips removed", "flips added",
               "1st token diverging", "max |dlogit|", "max KL", "experts / decision",
               "hit rate", "kept")
    BARS = (("flips removed", (120, 190, 90)), ("decisions changed", (90, 140, 230)),
            ("jitter left", (230, 90, 60)))

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.info = QLabel("run the remedies comparison", self)
        self.info.setWordWrap(True)
        self.table = QTableWidget(0, len(self.COLUMNS), self)
        self.table.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.remedy_axis = IndexAxis("bottom")
        self.plot = tidy(self.graphics.addPlot(title="what each remedy costs and removes",
                                               axisItems=axes(self.remedy_axis,
                                                              IndexAxis("left"))))
        self.plot.setLabel("left", "cells")
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setRange(xRange=(-0.5, 0.5), yRange=(0, 1), padding=0)
        self.bars: list[pg.BarGraphItem] = []
        legend = legend_row(self.graphics.ci, 1, 3)
        for name, colour in self.BARS:
            legend.addItem(pg.BarGraphItem(x=[0], height=[0], width=1,
                                           brush=pg.mkBrush(*colour)), name)
        layout = QVBoxLayout(self)
        layout.addWidget(self.info)
        layout.addWidget(self.table)
        layout.addWidget(self.graphics, 1)
        self._rows: list[dict[str, Any]] = []

    def set_report(self, report: RemedyReport | None) -> None:
        for bar in self.bars:
            self.plot.removeItem(bar)
        self.bars = []
        self._rows = []
        if report is None:
            self.table.setRowCount(0)
            self.remedy_axis.set_names(None)
            self.info.setText("run the remedies comparison")
            return
        plain = report.plain_jitter
        for r in report.rows:
            d = r.downstream
            self._rows.append({
                "remedy": r.remedy.label, "decisions changed": r.changed,
                "jitter left": r.jitter_left,
                "flips removed": int(r.removed(plain).sum()),
                "flips added": int(r.added(plain).sum()),
                "1st token diverging": d.first_token_divergence,
                "max |dlogit|": float(d.max_abs.max()) if d.max_abs.size else 0.0,
                "max KL": float(d.kl.max()) if d.kl.size else 0.0,
                "experts / decision": r.experts_per_decision, "hit rate": r.hit_rate,
                "kept": r.kept if r.remedy.routing == "cached" else None})
        self.table.setRowCount(len(self._rows))
        for i, row in enumerate(self._rows):
            self.table.setVerticalHeaderItem(i, QTableWidgetItem(row["remedy"]))
            for j, column in enumerate(self.COLUMNS):
                item = QTableWidgetItem(self._text(column, row[column]))
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(i, j, item)
        x = np.arange(len(self._rows), dtype=np.float64)
        width = 0.8 / len(self.BARS)
        for b, (name, colour) in enumerate(self.BARS):
            bar = pg.BarGraphItem(x=x - 0.4 + width * (b + 0.5), width=width,
                                  height=[row[name] for row in self._rows],
                                  brush=pg.mkBrush(*colour))
            self.plot.addItem(bar)
            self.bars.append(bar)
        self.remedy_axis.set_names([row["remedy"] for row in self._rows])
        top = max([row[name] for row in self._rows for name, _ in self.BARS] + [1])
        self.plot.setRange(xRange=(-0.5, len(self._rows) - 0.5), yRange=(0, top * 1.1),
                           padding=0)
        P, M = plain.shape
        lru = (f"; hit rate of an LRU of {report.expert_cache} experts per layer"
               if report.expert_cache else "")
        self.info.setText(f"{P} positions x {M} MoE layers = {P * M} cells, "
                          f"{len(report.variants)} variants; plain top-k has "
                          f"{report.plain.jitter_left} cells of jitter. Cached routing's "
                          f"threshold: {report.threshold_rule}{lru}.")

    @staticmethod
    def _text(column: str, value: Any) -> str:
        if value is None:
            return "-"
        if column == "hit rate":
            return f"{100 * value:.1f} %"
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value)

    def rows(self) -> list[dict[str, Any]]:
        """The numbers shown, one dict per remedy (tests compare them with the CLI's JSON)."""
        return self._rows
