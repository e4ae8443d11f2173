"""Tensor values: statistics, histogram and heatmap of one tensor; expert comparison of a layer.

Owns the Inspector's numeric views, for a `.colibri` model (`set_model`) and for a GGUF file or
safetensors checkpoint (`set_store` with its `stats.TensorStore`) alike. Every number comes from
`colibri.inspection.stats`, run on a `TaskRunner` worker (reading a tensor is file-wide work: a
10 GB expert stack must never block the UI), with a progress bar and a Cancel button. Results
arrive as frozen dataclasses and are only drawn here: a stats table, a pyqtgraph histogram
(stepped curve), an `ImageItem` heatmap with a `ColorBarItem` (pyqtgraph's MatrixDisplay
recipe), and for `show_layer_experts` a table of every expert's norms and statistics, grouped
bar plots of the w1/w2/w3 and router-row norms, and the router weight rows as a heatmap. The
Experts page picks its MoE layer from a list; showing a tensor of a MoE layer selects that layer
there, and opening the page then compares its experts. `sig_tensor_shown(name)` and
`sig_experts_shown(layer)` say when results are on screen; `export_png` saves the current page,
`export_csv` its table. `QtTensorValuesPage` is a file's tab holding it, built on first use.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QHeaderView, QLabel, QProgressBar,
                               QPushButton, QSplitter, QTableWidget, QTableWidgetItem, QTabWidget,
                               QVBoxLayout, QWidget)

from colibri.inspection import stats as S
from colibri.inspection.tensors import write_csv_atomic
from colibri.inspector.tasks import Task, TaskRunner
from colibri.inspector.export import save_png
from colibri.inspector.plots import IndexAxis, axes, colour_bar, legend_row, tidy

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

PROGRESS_STEPS = 1000   # progress is reported in permille: element counts overflow Qt's int32
MATRIX_COLOURS = {"moe_w1": (66, 133, 244), "moe_w2": (219, 68, 55), "moe_w3": (244, 180, 0),
                  "router": (15, 157, 88)}


def _fmt(value: float | int) -> str:
    """Integers with thousands separators; floats to 6 significant digits (the table's raw
    value, in UserRole, keeps full precision for copy and tests)."""
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    return f"{float(value):.6g}"


def _permille(progress: Any) -> Any:
    """Wrap a task's progress callback so (done, total) reach Qt as a permille."""

    def report(done: int, total: int, text: str = "") -> None:
        progress(int(PROGRESS_STEPS * done / total) if total else PROGRESS_STEPS,
                 PROGRESS_STEPS, text)

    return report


def _run_stats(fn: Any) -> Any:
    """A Task function calling `fn(progress, cancelled)` with progress in permille."""

    def task(progress: Any, cancelled: Any) -> Any:
        return fn(_permille(progress), cancelled)

    return task


def _table(parent: QWidget) -> QTableWidget:
    table = QTableWidget(parent)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.setAlternatingRowColors(True)
    return table


def _fill(table: QTableWidget, header: list[str], rows: list[list[Any]]) -> None:
    table.clear()
    table.setColumnCount(len(header))
    table.setRowCount(len(rows))
    table.setHorizontalHeaderLabels(header)
    for r, values in enumerate(rows):
        for c, value in enumerate(values):
            text = value if isinstance(value, str) else _fmt(value)
            item = QTableWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, value)
            if not isinstance(value, str):
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            table.setItem(r, c, item)


def _heatmap_widget(parent: QWidget, title: str, colour_map: str = "viridis",
                    rows: IndexAxis | None = None) -> tuple[pg.GraphicsLayoutWidget, pg.PlotItem,
                                                            pg.ImageItem, pg.ColorBarItem]:
    widget = pg.GraphicsLayoutWidget(parent)
    plot = tidy(widget.addPlot(title=title, axisItems=axes(left=rows)))
    plot.invertY(True)
    plot.setAspectLocked(False)
    image = pg.ImageItem(axisOrder="row-major")
    plot.addItem(image)
    bar = colour_bar(plot, image, colour_map, interactive=True)
    return widget, plot, image, bar


def _levels(data: np.ndarray) -> tuple[float, float]:
    finite = data[np.isfinite(data)]
    if finite.size == 0:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


class QtTensorValues(QWidget):
    """Statistics, histogram and heatmap of a tensor; expert comparison of a MoE layer."""

    sig_tensor_shown = Signal(str)
    sig_experts_shown = Signal(int)
    sig_failed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._store: S.TensorStore | None = None
        self._layer_of: dict[str, int] = {}     # tensor name -> its MoE layer
        self._wanted_layer: int | None = None   # compared when the Experts page is opened
        self.analysis: S.TensorAnalysis | None = None
        self.comparison: S.ExpertComparison | None = None
        self.runner = TaskRunner(self)
        self.runner.sig_progress.connect(self._on_progress)
        self.runner.sig_finished.connect(self._on_finished)
        self.runner.sig_failed.connect(self._on_failed)
        self.runner.sig_cancelled.connect(self._on_cancelled)

        self.title = QLabel("No tensor selected", self)
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, PROGRESS_STEPS)
        self.progress.setVisible(False)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setVisible(False)
        self.cancel_button.clicked.connect(self.cancel)
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.progress)
        top.addWidget(self.cancel_button)

        self.tabs = QTabWidget(self)
        # tensor page
        # statistics and histogram side by side over the heatmap: the page sits beside the
        # hexdump, so it is taller than it is wide
        self.tensor_page = QSplitter(Qt.Orientation.Vertical, self)
        upper = QSplitter(Qt.Orientation.Horizontal, self.tensor_page)
        self.stats_table = _table(upper)
        self.histogram_plot = pg.PlotWidget(upper, title="histogram (finite values)")
        tidy(self.histogram_plot.getPlotItem())
        self.histogram_plot.setLabel("left", "count")
        self.histogram_curve = self.histogram_plot.plot([0, 1], [0], stepMode="center",
                                                        fillLevel=0, brush=(66, 133, 244, 140))
        upper.addWidget(self.stats_table)
        upper.addWidget(self.histogram_plot)
        (self.heatmap_widget, self.heatmap_plot, self.heatmap_image,
         self.heatmap_bar) = _heatmap_widget(self.tensor_page, "mean |x| per block")
        self.heatmap_plot.setLabel("bottom", "column")
        self.heatmap_plot.setLabel("left", "row")
        self.tensor_page.addWidget(upper)
        self.tensor_page.addWidget(self.heatmap_widget)
        self.tensor_page.setSizes([260, 440])
        upper.setSizes([260, 340])
        self.tabs.addTab(self.tensor_page, "Tensor")
        # experts page: the layer to compare over the table and the plots
        self.experts_page = QWidget(self)
        self.layer_combo = QComboBox(self.experts_page)
        self.layer_combo.setToolTip("The MoE layer whose experts are compared")
        self.layer_combo.activated.connect(self._layer_chosen)
        self.experts_hint = QLabel("", self.experts_page)
        chooser = QHBoxLayout()
        chooser.addWidget(QLabel("MoE layer", self.experts_page))
        chooser.addWidget(self.layer_combo)
        chooser.addWidget(self.experts_hint, 1)
        experts_split = QSplitter(Qt.Orientation.Vertical, self.experts_page)
        self.experts_table = _table(experts_split)
        plots = QSplitter(Qt.Orientation.Horizontal, experts_split)
        self.norms_widget = pg.GraphicsLayoutWidget(plots)
        self.norms_plot = tidy(self.norms_widget.addPlot(title="norm per expert",
                                                         axisItems=axes(IndexAxis("bottom"))))
        self.norms_plot.setLabel("bottom", "expert")
        self.norms_plot.setLabel("left", "Frobenius norm")
        self.norms_plot.setMouseEnabled(x=False, y=False)
        self.norms_legend = legend_row(self.norms_widget.ci, 1, 2)   # under the bars
        (self.router_widget, self.router_plot, self.router_image,
         self.router_bar) = _heatmap_widget(plots, "router rows", "CET-D1",
                                            IndexAxis("left", cells=True))
        self.router_plot.setLabel("left", "expert")
        self.router_plot.setLabel("bottom", "d_model")
        plots.addWidget(self.norms_widget)
        plots.addWidget(self.router_widget)
        experts_split.addWidget(self.experts_table)
        experts_split.addWidget(plots)
        experts_split.setSizes([200, 400])
        page = QVBoxLayout(self.experts_page)
        page.setContentsMargins(0, 0, 0, 0)
        page.addLayout(chooser)
        page.addWidget(experts_split, 1)
        self.tabs.addTab(self.experts_page, "Experts")
        self.tabs.currentChanged.connect(self._tab_changed)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.tabs, 1)

    # -- public API -------------------------------------------------------------------------

    def set_model(self, model: Model | None) -> None:
        """Show the tensors of a `.colibri` model (None: nothing)."""
        self.set_store(S.EngineTensors(model) if model is not None else None)

    def set_store(self, store: S.TensorStore | None) -> None:
        """Show the tensors of `store` (a `.colibri` model's or a foreign file's; None: none)."""
        self.cancel()
        self.runner.wait()
        self._store = store
        self.analysis = None
        self.comparison = None
        self._wanted_layer = None
        layers = store.expert_layers() if store is not None else []
        self._layer_of = {}
        for moe in layers:
            self._layer_of[moe.router] = moe.layer
            for parts in moe.parts.values():
                self._layer_of.update((p.name, moe.layer) for p in parts)
        self.layer_combo.clear()
        for moe in layers:
            self.layer_combo.addItem(f"layer {moe.layer} ({moe.n_experts} experts)", moe.layer)
        self.layer_combo.setEnabled(bool(layers))
        self.experts_hint.setText("" if layers or store is None else "no MoE layer in this file")
        self.title.setText("No tensor selected" if store is not None else "No file")
        self.stats_table.setRowCount(0)
        self.experts_table.setRowCount(0)
        self.histogram_curve.setData([0, 1], [0])
        self.heatmap_image.clear()
        self.router_image.clear()
        self.norms_plot.clear()

    def moe_layer_of(self, name: str) -> int | None:
        """The MoE layer a tensor belongs to (its router or an expert matrix), else None."""
        return self._layer_of.get(name)

    def show_tensor(self, name: str, expert: int | None = None) -> None:
        """Compute (in the worker) and show statistics, histogram and heatmap of a tensor, or
        of expert `expert`'s slice of a stacked expert tensor. A tensor of a MoE layer selects
        that layer on the Experts page, compared when the page is opened."""
        store = self._require_store()
        info = store.tensor_info(name)
        label = name if expert is None else f"{name}[{expert}]"
        layer = self._layer_of.get(name)
        if layer is not None:
            self._wanted_layer = layer
            self.layer_combo.setCurrentIndex(self.layer_combo.findData(layer))
        self.title.setText(f"{label}  {info.dtype} {list(info.shape)}  — computing…")
        self.tabs.setCurrentWidget(self.tensor_page)
        self._start(f"values of {label}", lambda p, c: S.analyse_tensor(store, name, expert, p, c))

    def show_layer_experts(self, layer: int) -> None:
        """Compute (in the worker) and show the expert comparison of MoE layer `layer`."""
        store = self._require_store()
        index = self.layer_combo.findData(layer)
        if index < 0:
            raise ValueError(f"layer {layer} is not a MoE layer")
        self.layer_combo.setCurrentIndex(index)
        self._wanted_layer = None
        self.title.setText(f"experts of layer {layer} — computing…")
        self.tabs.setCurrentWidget(self.experts_page)
        self._start(f"experts of layer {layer}", lambda p, c: S.compare_experts(store, layer, p, c))

    def cancel(self) -> None:
        self.runner.cancel()

    def is_busy(self) -> bool:
        return self.runner.is_running()

    def export_png(self, path: str | os.PathLike[str]) -> bool:
        """Save the current page (tables and plots as on screen) as a PNG."""
        page = self.tabs.currentWidget()
        return save_png(page, path)

    def export_csv(self, path: str | os.PathLike[str]) -> None:
        """Save the current page's table (statistics, or the expert comparison) as CSV."""
        table = self.stats_table if self.tabs.currentWidget() is self.tensor_page else \
            self.experts_table
        header = [table.horizontalHeaderItem(c).text()  # type: ignore[union-attr]
                  for c in range(table.columnCount())]
        rows = [[table.item(r, c).data(Qt.ItemDataRole.UserRole)  # type: ignore[union-attr]
                 for c in range(table.columnCount())] for r in range(table.rowCount())]
        write_csv_atomic(path, header, rows)

    def stat_value(self, label: str) -> Any:
        """The raw value shown in the stats table for `label` ('min', 'mean', 'NaN count'…)."""
        for r in range(self.stats_table.rowCount()):
            item = self.stats_table.item(r, 0)
            if item is not None and item.text() == label:
                value = self.stats_table.item(r, 1)
                return value.data(Qt.ItemDataRole.UserRole) if value is not None else None
        raise KeyError(label)

    # -- running ----------------------------------------------------------------------------

    def _require_store(self) -> S.TensorStore:
        if self._store is None:
            raise RuntimeError("no model set")
        return self._store

    def _compare_wanted(self, task_done: bool = False) -> bool:
        """Start the comparison of the layer last shown a tensor of, if the Experts page is
        open, it is not on screen yet and the worker is free (else it waits for the task to
        finish: `task_done`)."""
        wanted = self._wanted_layer
        if (self.tabs.currentWidget() is self.experts_page and wanted is not None
                and (task_done or not self.runner.is_running())
                and (self.comparison is None or self.comparison.layer != wanted)):
            self.show_layer_experts(wanted)
            return True
        return False

    def _layer_chosen(self, index: int) -> None:
        if index >= 0 and self._store is not None:
            self.show_layer_experts(int(self.layer_combo.itemData(index)))

    def _start(self, name: str, fn: Any) -> None:
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.cancel_button.setVisible(True)
        self.runner.start(Task(name, _run_stats(fn)))

    def _done(self) -> None:
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)

    def _on_progress(self, done: int, total: int, _text: str) -> None:
        self.progress.setMaximum(max(1, total))
        self.progress.setValue(done)

    def _on_failed(self, message: str) -> None:
        self._done()
        self.title.setText(f"failed: {message.splitlines()[0]}")
        self.sig_failed.emit(message)

    def _on_cancelled(self) -> None:
        self._done()
        self.title.setText(self.title.text().replace("computing…", "cancelled"))

    def _on_finished(self, result: object) -> None:
        self._done()
        if isinstance(result, S.TensorAnalysis):
            self._show_analysis(result)
        elif isinstance(result, S.ExpertComparison):
            self._show_comparison(result)
        self._compare_wanted(task_done=True)

    # -- drawing ----------------------------------------------------------------------------

    def _tab_changed(self, _index: int) -> None:
        """The title names what the shown page shows (each page keeps its last result); the
        Experts page opened after a tensor of a MoE layer was shown compares that layer."""
        if self._compare_wanted() or self.runner.is_running():
            return
        if self.tabs.currentWidget() is self.tensor_page and self.analysis is not None:
            a = self.analysis
            label = a.name if a.expert is None else f"{a.name}[{a.expert}]"
            self.title.setText(f"{label}  {a.dtype} {list(a.shape)}")
        elif self.tabs.currentWidget() is self.experts_page and self.comparison is not None:
            c = self.comparison
            self.title.setText(f"experts of layer {c.layer}: {c.n_experts} experts")

    def _show_analysis(self, a: S.TensorAnalysis) -> None:
        self.analysis = a
        label = a.name if a.expert is None else f"{a.name}[{a.expert}]"
        self.title.setText(f"{label}  {a.dtype} {list(a.shape)}")
        _fill(self.stats_table, ["statistic", "value"],
              [[k, v] for k, v in a.stats.as_rows()])
        self.histogram_curve.setData(a.histogram.edges, a.histogram.counts.astype(np.float64))
        if a.heatmap is not None:
            cells = a.heatmap.cells
            self.heatmap_image.setImage(cells, autoLevels=False)
            # one cell = one block: map image pixels back to matrix coordinates
            self.heatmap_image.setRect(0, 0, cells.shape[1] * a.heatmap.block_cols,
                                       cells.shape[0] * a.heatmap.block_rows)
            self.heatmap_bar.setLevels(_levels(cells))
            self.heatmap_plot.setTitle(
                f"mean |x| per {a.heatmap.block_rows}x{a.heatmap.block_cols} block")
            self.heatmap_plot.setLabel("bottom", f"column (of {a.heatmap.shape[1]})")
            self.heatmap_plot.setLabel("left", f"row (of {a.heatmap.shape[0]})")
            self.heatmap_plot.autoRange()
        else:
            self.heatmap_image.clear()
            self.heatmap_plot.setTitle("no heatmap for 1-D data")
        self.sig_tensor_shown.emit(label)

    def _show_comparison(self, c: S.ExpertComparison) -> None:
        self.comparison = c
        self.title.setText(f"experts of layer {c.layer}: {c.n_experts} experts")
        header, rows = c.table()
        _fill(self.experts_table, header, [list(r) for r in rows])
        self.norms_plot.clear()
        self.norms_legend.clear()
        series = [(m, c.column(m, "norm")) for m in S.EXPERT_MATRICES if m in c.stats]
        series.append(("router", c.router_norms.astype(np.float64)))
        width = 0.8 / len(series)
        x = np.arange(c.n_experts, dtype=np.float64)
        top = 0.0
        for i, (name, heights) in enumerate(series):
            bars = pg.BarGraphItem(x=x - 0.4 + width * (i + 0.5), height=heights, width=width,
                                   brush=MATRIX_COLOURS.get(name, (120, 120, 120)), name=name)
            self.norms_plot.addItem(bars)
            self.norms_legend.addItem(bars, name)
            top = max(top, float(np.nanmax(heights)) if len(heights) else 0.0)
        self.norms_plot.setRange(xRange=(-0.6, c.n_experts - 0.4), yRange=(0, top * 1.05 or 1),
                                 padding=0)
        self.router_image.setImage(c.router_rows, autoLevels=False)
        # one row per expert: cells [e, e + 1) with the expert's number at their centre
        self.router_image.setRect(0, 0, c.router_rows.shape[1], c.router_rows.shape[0])
        bound = float(np.nanmax(np.abs(c.router_rows))) if c.router_rows.size else 1.0
        bound = bound if math.isfinite(bound) and bound > 0 else 1.0
        self.router_bar.setLevels((-bound, bound))
        self.router_plot.autoRange()
        self.sig_experts_shown.emit(c.layer)


class QtTensorValuesPage(QWidget):
    """A file's "Tensor values" tab. Its QtTensorValues (six pyqtgraph plots, ~350 ms to build)
    is built on first use, so the first paint of a file does not wait for it; a tensor selected
    before then is shown once it is."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        QVBoxLayout(self).setContentsMargins(0, 0, 0, 0)
        self.built: QtTensorValues | None = None
        self._store: S.TensorStore | None = None
        self._pending: tuple[str, int | None] | None = None

    def set_store(self, store: S.TensorStore | None) -> None:
        """Show the tensors of `store` from now on (a file opened or reloaded: a tensor still
        waiting to be shown is dropped)."""
        self._store, self._pending = store, None
        if self.built is not None:
            self.built.set_store(store)

    @property
    def view(self) -> QtTensorValues:
        """The values view, built now if it was not."""
        if self.built is None:
            self.built = QtTensorValues()
            self.built.setObjectName("tensorValues")
            self.layout().addWidget(self.built)
            self.built.set_store(self._store)
            if self._pending is not None and self._store is not None:
                name, expert = self._pending
                self._pending = None
                self.built.show_tensor(name, expert)
        return self.built

    def show_tensor(self, name: str, expert: int | None, on_view: bool) -> None:
        """Tensor `name` (or its expert slice `expert`): now when the view is built or the page
        is `on_view`, else when the view is first built."""
        if self.built is None and not on_view:
            self._pending = (name, expert)
            return
        self.view.show_tensor(name, expert)


__all__ = ["QtTensorValues", "QtTensorValuesPage"]
