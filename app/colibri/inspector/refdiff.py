"""The reference diff in the Inspector: the open file against its Hugging Face checkpoint run in
transformers, as a layer x position heatmap (colibri.reference.diff, what `colibri diff` prints).

  * `QtDiffHeatmap`      - every (layer, position)'s relative hidden-state difference, log10,
                           with the tolerance on the colour bar; crosses where the two engines
                           chose different experts, squares on the first layer over tolerance
                           and the first divergence; hover says the cell, click selects it.
  * `QtLayerTable`       - one row per layer: the CLI's table; a click selects the layer's worst
                           position.
  * `QtRoutingCompare`   - the click-through: one (layer, position)'s routing in both engines,
                           expert by expert (router logit, selection score, rank and weight of
                           each, the difference), the chosen experts marked and the ones only one
                           engine chose tinted; the selection scores of both as bars.
  * `QtReferenceDiff`    - the controls (checkpoint directory, prompt, transformers' dtype,
                           tolerance, threads), Run / Cancel on a TaskRunner worker with progress
                           (the checkpoint loads and runs in transformers there), Save / Load of
                           the diff as `colibri diff --json` writes it, and the views above.
  * `QtReferenceDiffDialog` - the same in a window of its own, opened from the debugger.
The views read a `ReferenceDiff`; none computes anything of its own.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDialog, QFileDialog, QGridLayout,
                               QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton,
                               QSpinBox, QSplitter, QTableWidget, QTableWidgetItem,
                               QTabWidget, QVBoxLayout, QWidget)

from colibri.errors import ColibriError
from colibri.files import atomic_write_bytes
from colibri.inspector.export import load_with_dialog, save_with_dialog
from colibri.inspector.plots import IndexAxis, axes, cell_under, colour_bar, legend_row, tidy
from colibri.inspector.readout import QtCellReadout, wrapping
from colibri.inspector.prompt import NO_TOKENIZER, QtPromptEdit, placeholder, token_ids
from colibri.inspector.tasks import Task, TaskRunner
from colibri.reference.diff import Divergence, ReferenceDiff, reference_diff
from colibri.tokens import token_text

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

_CHOSEN_BOTH = QColor(120, 200, 120, 110)
_CHOSEN_ONE = QColor(230, 140, 40, 130)
_OVER = QColor(230, 140, 40, 130)       # a layer over tolerance
_FLOOR = 1e-12      # the smallest relative difference the heatmap tells apart


def make_task(model: Model, hf_dir: str, prompt: str, dtype: str, threads: int,
              tolerance: float | None) -> Task:
    """A TaskRunner task computing the reference diff of `prompt` (text or token ids) on the
    open `model` against the checkpoint in `hf_dir`. Qt-free body; ValueError for a prompt it
    cannot read."""
    ids = token_ids(prompt)
    tokenizer = model.tokenizer
    if ids is None:
        if tokenizer is None:
            raise ValueError(NO_TOKENIZER)
        ids = list(tokenizer.encode(prompt).ids)
    if not ids:
        raise ValueError("the prompt is empty")
    if not hf_dir:
        raise ValueError("choose the Hugging Face checkpoint directory the file came from")
    texts = [repr(token_text(tokenizer, t)) if tokenizer is not None else str(t) for t in ids]

    def fn(progress: Any, cancelled: Any) -> ReferenceDiff:
        return reference_diff(model, hf_dir, ids, dtype=dtype, threads=threads,
                              tolerance=tolerance, token_texts=texts, progress=progress,
                              cancelled=cancelled)

    return Task("reference diff", fn)


# ---------------------------------------------------------------------------------------------
# Views


class QtDiffHeatmap(QWidget):
    """log10 of the relative hidden-state difference per (layer, position)."""

    sig_cell_selected = Signal(int, int)   # layer, position

    CAPTION = ("log10 of max|h_colibri - h_transformers| / max|h_transformers| after each layer "
               "(x: the engines chose different experts); hover a cell, click to compare")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.plot = self.graphics.addPlot(
            title="relative difference, log10",
            axisItems=axes(IndexAxis("bottom", cells=True), IndexAxis("left", cells=True)))
        self.plot.setLabel("bottom", "position")
        self.plot.setLabel("left", "layer")
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.bar = colour_bar(self.plot, self.image, "inferno", (-12.0, 0.0), "log10")
        self.crosses = pg.ScatterPlotItem(size=9, symbol="x", pen=pg.mkPen((90, 200, 255),
                                                                           width=2),
                                          brush=pg.mkBrush(90, 200, 255), name="routing differs")
        self.firsts = pg.ScatterPlotItem(size=15, symbol="s", brush=None,
                                         pen=pg.mkPen((120, 255, 120), width=2),
                                         name="first over tolerance / first divergence")
        self.marker = pg.ScatterPlotItem(size=13, symbol="s", brush=None,
                                         pen=pg.mkPen("w", width=2))
        for item in (self.crosses, self.firsts, self.marker):
            self.plot.addItem(item)
        legend = legend_row(self.graphics.ci, 1, 2)
        legend.addItem(self.crosses, "routing differs")
        legend.addItem(self.firsts, "first over tolerance / first divergence")
        self.hover = QtCellReadout(self.plot, self._cell_at, self.describe, self.CAPTION, self)
        self.hover.sig_cell_clicked.connect(self.sig_cell_selected)
        layout = QVBoxLayout(self)
        layout.addWidget(self.graphics, 1)
        layout.addWidget(self.hover)
        self.diff: ReferenceDiff | None = None
        self._drawn: np.ndarray | None = None

    def set_diff(self, diff: ReferenceDiff | None) -> None:
        self.diff = diff
        self.marker.clear()
        if diff is None or diff.hidden_rel.size == 0:
            self._drawn = None
            self.image.clear()
            self.crosses.clear()
            self.firsts.clear()
            return
        L, T = diff.hidden_rel.shape
        with np.errstate(divide="ignore", invalid="ignore"):
            drawn = np.log10(np.maximum(np.nan_to_num(diff.hidden_rel.astype(np.float64),
                                                      nan=np.inf), _FLOOR))
        self._drawn = drawn
        self.image.setImage(drawn, autoLevels=False)      # rows = layers
        self.image.setRect(0, 0, T, L)
        tol = float(np.log10(diff.tolerance))
        self.plot.setTitle(f"relative difference, log10 (tolerance {tol:.1f})")
        finite = drawn[np.isfinite(drawn)]
        lo = min(float(finite.min()) if finite.size else tol - 3, tol - 3)
        hi = max(float(finite.max()) if finite.size else tol + 1, tol + 1)
        self.bar.setLevels((lo, hi))
        m_idx, p_idx = np.nonzero(diff.diverged)
        self.crosses.setData(p_idx + 0.5, diff.moe_layers[m_idx] + 0.5)
        marks = []
        over = diff.first_layer_over()
        if over is not None:
            marks.append((diff.layers()[over].worst_position, over))
        first = diff.first_divergence()
        if first is not None:
            marks.append((first.position, first.layer))
        self.firsts.setData([p + 0.5 for p, _ in marks], [layer + 0.5 for _, layer in marks])
        self.plot.setRange(xRange=(0, T), yRange=(0, L), padding=0)

    def values(self) -> np.ndarray | None:
        """What the image draws: log10 of the relative difference, [layers][positions]."""
        return self._drawn

    def mark(self, layer: int, position: int) -> None:
        self.marker.setData([position + 0.5], [layer + 0.5])

    def describe(self, layer: int, p: int) -> str:
        d = self.diff
        assert d is not None
        text = (f"layer {layer} ({d.layer_kinds[layer]}) position {p} (token "
                f"{d.token_texts[p]}): max|dh| {d.hidden_abs[layer, p]:.3g}, relative "
                f"{d.hidden_rel[layer, p]:.3g}")
        moe = list(int(m) for m in d.moe_layers)
        if layer in moe:
            m = moe.index(layer)
            text += (f"; router logits differ by up to {d.router_abs[m, p]:.3g}; experts "
                     f"colibri {d.colibri.expert_ids[p, m].tolist()}, transformers "
                     f"{d.ref.expert_ids[p, m].tolist()}"
                     + (" (differ)" if d.diverged[m, p] else ""))
        return text

    def _cell_at(self, scene_pos: Any) -> tuple[int, int] | None:
        if self._drawn is None:
            return None
        L, T = self._drawn.shape
        cell = cell_under(self.plot, scene_pos, T, L)
        return None if cell is None else (cell[1], cell[0])  # (layer, position)


def _item(text: str, background: QColor | None = None) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if background is not None:
        item.setBackground(QBrush(background))
    return item


class QtLayerTable(QTableWidget):
    """The per-layer summary, as `colibri diff` prints it."""

    sig_layer_selected = Signal(int, int)   # layer, its worst position

    COLUMNS = ("layer", "kind", "max|dh|", "relative", "at position", "max|drouter|",
               "routing differs")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setColumnCount(len(self.COLUMNS))
        self.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.verticalHeader().setVisible(False)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.cellClicked.connect(self._clicked)
        self._worst: list[int] = []

    def set_diff(self, diff: ReferenceDiff | None) -> None:
        self.setRowCount(0)
        self._worst = []
        if diff is None:
            return
        rows = diff.layers()
        over = diff.first_layer_over()
        self.setRowCount(len(rows))
        for i, r in enumerate(rows):
            flag = _OVER if r.hidden_rel > diff.tolerance else None
            cells = (str(r.layer), r.kind, f"{r.hidden_abs:.3g}", f"{r.hidden_rel:.3g}",
                     str(r.worst_position),
                     "-" if r.router_abs is None else f"{r.router_abs:.3g}",
                     "-" if r.diverged is None else f"{r.diverged} of {diff.n_positions}")
            for c, text in enumerate(cells):
                self.setItem(i, c, _item(text + (" (first over tolerance)" if c == 3 and
                                                 r.layer == over else ""),
                                         flag if c == 3 else None))
            self._worst.append(r.worst_position)
        self.resizeColumnsToContents()

    def _clicked(self, row: int, _column: int) -> None:
        if 0 <= row < len(self._worst):
            self.sig_layer_selected.emit(row, self._worst[row])


class QtRoutingCompare(QWidget):
    """Both engines' routing of one (layer, position), expert by expert."""

    COLUMNS = ("expert", "colibri logit", "transformers logit", "difference",
               "colibri selection", "transformers selection", "colibri rank", "colibri weight",
               "transformers rank", "transformers weight")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = wrapping(QLabel("click a cell of the heatmap or a layer of the table", self))
        self.table = QTableWidget(self)
        self.table.setColumnCount(len(self.COLUMNS))
        self.table.setHorizontalHeaderLabels(list(self.COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.plot = tidy(self.graphics.addPlot(title="selection score of each expert",
                                               axisItems=axes(IndexAxis("bottom"))))
        self.plot.setLabel("bottom", "expert")
        self.plot.setMouseEnabled(x=False, y=False)
        legend = legend_row(self.graphics.ci, 1, 2)
        self.ours = pg.BarGraphItem(x=[], height=[], width=0.4, brush=(230, 140, 40))
        self.theirs = pg.BarGraphItem(x=[], height=[], width=0.4, brush=(90, 140, 230))
        self.plot.addItem(self.ours)
        self.plot.addItem(self.theirs)
        legend.addItem(self.ours, "colibri")
        legend.addItem(self.theirs, "transformers")
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.table, 3)
        layout.addWidget(self.graphics, 2)
        self.cell: tuple[int, int] | None = None
        # the divergences of the diff shown, by (layer, position): computed once per diff
        self._diverged: tuple[ReferenceDiff, dict[tuple[int, int], Divergence]] | None = None

    def set_cell(self, diff: ReferenceDiff | None, layer: int | None = None,
                 position: int | None = None) -> None:
        self.table.setRowCount(0)
        self.ours.setOpts(x=[], height=[])
        self.theirs.setOpts(x=[], height=[])
        if diff is None or layer is None or position is None:
            self.cell = None
            self.title.setText("click a cell of the heatmap or a layer of the table")
            return
        self.cell = (layer, position)
        p = position
        head = (f"layer {layer} ({diff.layer_kinds[layer]}) position {p} (token "
                f"{diff.token_texts[p]}): hidden state max|dh| {diff.hidden_abs[layer, p]:.3g}, "
                f"relative {diff.hidden_rel[layer, p]:.3g} (tolerance {diff.tolerance:g})")
        moe = [int(m) for m in diff.moe_layers]
        if layer not in moe:
            self.title.setText(head + "; a dense layer: no routing")
            return
        m = moe.index(layer)
        ours, theirs = diff.colibri, diff.ref
        c_ids = [int(e) for e in ours.expert_ids[p, m]]
        r_ids = [int(e) for e in theirs.expert_ids[p, m]]
        verdict = "the same experts" if set(c_ids) == set(r_ids) else "different experts"
        if self._diverged is None or self._diverged[0] is not diff:
            self._diverged = (diff, {(d.layer, d.position): d for d in diff.divergences()})
        found = self._diverged[1].get((layer, p))
        self.title.setText(f"{head}; {verdict}: colibri {c_ids}, transformers {r_ids}"
                           + (f" ({found.cause}: transformers' margin "
                              f"{found.reference_margin:.3g}; router logits differ by up to "
                              f"{found.logit_difference:.3g}, selection scores by "
                              f"{found.score_difference:.3g})" if found else ""))
        E = ours.router_logits.shape[2]
        order = np.argsort(-theirs.selection_scores[p, m], kind="stable")
        self.table.setRowCount(E)
        for row, e in enumerate(order):
            e = int(e)
            in_c, in_r = e in c_ids, e in r_ids
            tint = _CHOSEN_BOTH if in_c and in_r else _CHOSEN_ONE if in_c or in_r else None
            c_rank = f"{c_ids.index(e) + 1}" if in_c else ""
            r_rank = f"{r_ids.index(e) + 1}" if in_r else ""
            c_w = f"{ours.expert_weights[p, m, c_ids.index(e)]:.6g}" if in_c else ""
            r_w = f"{theirs.expert_weights[p, m, r_ids.index(e)]:.6g}" if in_r else ""
            values = (str(e), f"{ours.router_logits[p, m, e]:.9g}",
                      f"{theirs.router_logits[p, m, e]:.9g}",
                      f"{ours.router_logits[p, m, e] - theirs.router_logits[p, m, e]:.3g}",
                      f"{ours.selection_scores[p, m, e]:.9g}",
                      f"{theirs.selection_scores[p, m, e]:.9g}", c_rank, c_w, r_rank, r_w)
            for col, text in enumerate(values):
                self.table.setItem(row, col, _item(text, tint))
        self.table.resizeColumnsToContents()
        x = np.arange(E, dtype=np.float64)
        self.ours.setOpts(x=x - 0.2, height=ours.selection_scores[p, m].astype(np.float64))
        self.theirs.setOpts(x=x + 0.2, height=theirs.selection_scores[p, m].astype(np.float64))
        both = np.concatenate([ours.selection_scores[p, m], theirs.selection_scores[p, m]])
        lo, hi = min(float(both.min()), 0.0), max(float(both.max()), 0.0)
        self.plot.setRange(xRange=(-0.6, E - 0.4), yRange=(lo, hi if hi > lo else lo + 1),
                           padding=0.05)

    def rows(self) -> dict[int, dict[str, str]]:
        """Expert -> the table's cells by column name (what a test reads back)."""
        out = {}
        for row in range(self.table.rowCount()):
            cells = {name: self.table.item(row, c).text() for c, name in enumerate(self.COLUMNS)}
            out[int(cells["expert"])] = cells
        return out


# ---------------------------------------------------------------------------------------------
# The page


class QtReferenceDiff(QWidget):
    """Controls, progress and the views of one reference diff (module docstring)."""

    sig_diff_ready = Signal()
    sig_failed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model: Model | None = None
        self.diff: ReferenceDiff | None = None
        self.runner = TaskRunner(self)

        self.hf_dir = QLineEdit(self)
        self.hf_dir.setPlaceholderText("the Hugging Face checkpoint directory the file was "
                                       "converted from (config.json, *.safetensors)")
        self.browse_button = QPushButton("Browse…", self)
        self.prompt = QtPromptEdit(self)
        self.dtype = QComboBox(self)
        self.dtype.addItems(["f32", "bf16"])
        self.dtype.setToolTip("the precision transformers computes in")
        self.tolerance = QLineEdit(self)
        self.tolerance.setPlaceholderText("by the dtypes")
        self.tolerance.setToolTip("relative hidden-state tolerance; empty: 1e-4 when the file "
                                  "holds the checkpoint's own values, more when it rounded them "
                                  "or transformers computes in bf16")
        self.threads = QSpinBox(self)
        self.threads.setRange(1, 256)
        self.run_button = QPushButton("Run diff", self)
        self.cancel_button = QPushButton("Cancel", self)
        self.save_button = QPushButton("Save…", self)
        self.load_button = QPushButton("Load…", self)
        self.progress = QProgressBar(self)
        self.status = QLabel("open a model", self)
        self.summary = QLabel("", self)
        for label in (self.status, self.summary):
            wrapping(label).setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        form = QGridLayout()
        form.addWidget(QLabel("checkpoint", self), 0, 0)
        form.addWidget(self.hf_dir, 0, 1, 1, 3)
        form.addWidget(self.browse_button, 0, 4)
        form.addWidget(QLabel("prompt", self), 1, 0)
        form.addWidget(self.prompt, 1, 1, 1, 4)
        form.setColumnStretch(1, 1)
        buttons = QHBoxLayout()
        for label, widget in (("transformers in", self.dtype), ("tolerance", self.tolerance),
                              ("threads", self.threads)):
            buttons.addWidget(QLabel(label, self))
            buttons.addWidget(widget)
        for b in (self.run_button, self.cancel_button, self.save_button, self.load_button):
            buttons.addWidget(b)
        buttons.addWidget(self.progress, 1)

        self.heatmap = QtDiffHeatmap(self)
        self.layer_table = QtLayerTable(self)
        self.compare = QtRoutingCompare(self)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.layer_table, "Layers")
        self.tabs.addTab(self.compare, "Routing at the cell")
        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.addWidget(self.heatmap)
        split.addWidget(self.tabs)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.summary)
        layout.addWidget(split, 1)

        self.browse_button.clicked.connect(self._browse)
        self.run_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.save_button.clicked.connect(self._save_dialog)
        self.load_button.clicked.connect(self._load_dialog)
        self.heatmap.sig_cell_selected.connect(self.select_cell)
        self.layer_table.sig_layer_selected.connect(self.select_cell)
        self.runner.sig_progress.connect(self._progress)
        self.runner.sig_finished.connect(self._finished)
        self.runner.sig_failed.connect(self._failed)
        self.runner.sig_cancelled.connect(self._cancelled)
        self._set_running(False)

    # -- model and runs -------------------------------------------------------------------------

    def set_model(self, model: Model | None, prompt: str = "") -> None:
        """The open model to compare (None clears); `prompt` fills an empty prompt field."""
        if model is None or self.model is None or model.path != self.model.path:
            self.set_diff(None)
        self.model = model
        if model is not None:
            self.prompt.setPlaceholderText(placeholder(model.tokenizer is not None))
            if prompt and not self.prompt.text():
                self.prompt.setText(prompt)
        self.status.setText("open a model" if model is None else
                            f"model: {os.path.basename(model.path)}; choose its checkpoint and "
                            f"Run diff")
        self._set_running(False)

    def start(self) -> None:
        if self.model is None:
            return
        try:
            text = self.tolerance.text().strip()
            tolerance = float(text) if text else None
            if tolerance is not None and not tolerance > 0:
                raise ValueError("the tolerance must be a number > 0")
            task = make_task(self.model, self.hf_dir.text().strip(), self.prompt.text(),
                             self.dtype.currentText(), self.threads.value(), tolerance)
        except (ValueError, ColibriError) as exc:   # the prompt, or a broken tokenizer
            self.status.setText(f"cannot run: {exc}")
            self.sig_failed.emit(str(exc))
            return
        self._set_running(True)
        self.status.setText("running…")
        self.runner.start(task)

    def cancel(self) -> None:
        self.runner.cancel()

    def _set_running(self, running: bool) -> None:
        self.cancel_button.setEnabled(running)
        self.run_button.setEnabled(not running and self.model is not None)
        self.save_button.setEnabled(not running and self.diff is not None)

    def _progress(self, done: int, total: int, text: str) -> None:
        self.progress.setRange(0, int(total))
        self.progress.setValue(int(done))
        self.status.setText(f"{done}/{total} {text}")

    def _finished(self, diff: ReferenceDiff) -> None:
        self.set_diff(diff)
        self._set_running(False)
        self.status.setText(f"compared {diff.n_positions} positions of "
                            f"{os.path.basename(diff.model)} with {diff.reference_class} "
                            f"({diff.reference_dtype}) from {diff.reference}")
        self.sig_diff_ready.emit()

    def _failed(self, message: str) -> None:
        self._set_running(False)
        first = message.splitlines()[0] if message else ""
        self.status.setText(f"failed: {first}")
        self.sig_failed.emit(message)

    def _cancelled(self) -> None:
        self._set_running(False)
        self.status.setText("cancelled")

    # -- the diff and its views -----------------------------------------------------------------

    def set_diff(self, diff: ReferenceDiff | None) -> None:
        self.diff = diff
        self.heatmap.set_diff(diff)
        self.layer_table.set_diff(diff)
        self.compare.set_cell(None)
        self.summary.setText("" if diff is None else self.summary_text(diff))
        self._set_running(self.runner.is_running())
        if diff is not None:   # open on the place that matters most
            first = diff.first_divergence()
            over = diff.first_layer_over()
            if over is not None:
                self.select_cell(over, diff.layers()[over].worst_position)
            elif first is not None:
                self.select_cell(first.layer, first.position)

    @staticmethod
    def summary_text(diff: ReferenceDiff) -> str:
        over = diff.first_layer_over()
        first = diff.first_divergence()
        s = diff.summary()
        if over is None:
            layers = f"every hidden state within the tolerance {diff.tolerance:g}"
        else:
            row = diff.layers()[over]
            layers = (f"first layer over tolerance: layer {over} ({row.kind}), relative "
                      f"{row.hidden_rel:.3g} at position {row.worst_position}")
        routing = ("the same experts at every decision" if first is None else
                   f"first routing divergence: {first.describe()}; {s['diverged_decisions']} "
                   f"of {s['decisions']} decisions differ")
        return (f"{layers}. {routing}. Logits differ by up to {s['max_logit_difference']:.3g}; "
                f"the next token differs at {s['next_token_differs']} of {diff.n_positions} "
                f"positions.")

    def select_cell(self, layer: int, position: int) -> None:
        """Show (layer, position) in both engines (the click-through)."""
        if self.diff is None:
            return
        self.heatmap.mark(layer, position)
        self.compare.set_cell(self.diff, layer, position)
        self.tabs.setCurrentWidget(self.compare)

    def save_json(self, path: str) -> None:
        if self.diff is not None:
            atomic_write_bytes(path, self.diff.to_json().encode("utf-8"))

    def load_json(self, path: str) -> None:
        """A saved diff (Save, or `colibri diff --json OUT`)."""
        with open(path, encoding="utf-8") as f:
            self.set_diff(ReferenceDiff.from_dict(json.load(f)))
        self.status.setText(f"loaded {path}")

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Hugging Face checkpoint directory",
                                                self.hf_dir.text())
        if path:
            self.hf_dir.setText(path)

    def _save_dialog(self) -> None:
        save_with_dialog(self, "Save reference diff", self.save_json)

    def _load_dialog(self) -> None:
        load_with_dialog(self, "Load reference diff", self.load_json, self.status.setText)

    def shutdown(self) -> None:
        """Cancel and join the worker (before the model is closed)."""
        self.runner.cancel()
        self.runner.wait()


class QtReferenceDiffDialog(QDialog):
    """The reference diff in a window of its own (non-modal); closing it cancels a run."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Reference diff")
        self.page = QtReferenceDiff(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.page)
        self.resize(1200, 760)

    def done(self, result: int) -> None:
        """Closing (Esc, the window's close button) cancels and joins a running diff."""
        self.page.shutdown()
        super().done(result)


__all__ = ["QtDiffHeatmap", "QtLayerTable", "QtReferenceDiff", "QtReferenceDiffDialog",
           "QtRoutingCompare", "make_task"]
