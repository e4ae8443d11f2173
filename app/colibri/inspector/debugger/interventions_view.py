"""The debugger's interventions: the list the run applies, and the counterfactual beside the original.

  * `QtInterventionList`     - the run's interventions (colibri.interventions): type a spec (the
                               command line's grammar) or take a template from the selected
                               decision, add, remove, Apply (`sig_apply(list)`); the engine judges
                               them on the worker and a refused one's message shows here.
  * `QtCounterfactualView`   - a `Counterfactual`: the summary, and as tabs a table per position (the
                               next token without and with the interventions, the MoE layers whose
                               choice changed, max |logit difference|, KL), KL per position, and a
                               map of the decisions (changed downstream, changed where an
                               intervention acted, acted without a change); a row or cell selects
                               its decision.
Neither runs or recomputes anything: the worker does, and they show its snapshots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QListWidget, QPushButton, QTableView, QTabWidget, QVBoxLayout,
                               QWidget)

from colibri.debugging.counterfactual import Counterfactual
from colibri.debugging.events import Event
from colibri.interventions import Intervention, InterventionError
from colibri.inspector.plots import IndexAxis, axes, tidy
from colibri.inspector.table_model import ColumnTableModel, Index

TokenLabel = Callable[[int], str]

# the decision map: same, changed downstream, changed where an intervention acted, acted alone
_MAP_COLOURS = np.array([(40, 40, 48, 255), (230, 140, 40, 255), (220, 60, 60, 255),
                         (90, 120, 200, 255)], np.uint8)
_CHANGED_ROW = QColor(230, 140, 40, 60)


class QtInterventionList(QWidget):
    """The interventions the run applies, edited here and applied together."""

    sig_apply = Signal(object)      # list[Intervention]

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.items: list[Intervention] = []
        self.applied: tuple[Intervention, ...] = ()
        self.decision: Event | None = None
        self.spec = QLineEdit(self)
        self.spec.setObjectName("debuggerInterventionSpec")
        self.spec.setPlaceholderText("force:pos=5,layer=2,experts=1+4")
        self.spec.setToolTip("force, forbid, weights, logits, bias, ablate, swap "
                             "(docs/interventions.md); pos N, A-B or A-, layer a MoE layer")
        self.list = QListWidget(self)
        self.list.setMaximumHeight(self.list.fontMetrics().height() * 5)   # a few, compactly
        self.message = QLabel("", self)
        self.message.setWordWrap(True)
        self.buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        for name, text, tip in (("template", "From event", "a forbid of the selected decision's "
                                                           "first choice, to edit"),
                                ("add", "Add", "add the spec to the list"),
                                ("remove", "Remove", "remove the selected intervention"),
                                ("apply", "Apply", "run under the list: what it changes is "
                                                   "computed again and compared")):
            b = QPushButton(text, self)
            b.setToolTip(tip)
            row.addWidget(b)
            self.buttons[name] = b
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.spec)
        layout.addLayout(row)
        layout.addWidget(self.list)
        layout.addWidget(self.message)
        self.buttons["template"].clicked.connect(self.fill_template)
        self.buttons["add"].clicked.connect(self.add_spec)
        self.spec.returnPressed.connect(self.add_spec)
        self.buttons["remove"].clicked.connect(self.remove_selected)
        self.buttons["apply"].clicked.connect(lambda: self.sig_apply.emit(list(self.items)))
        self._refill()

    def set_event(self, event: Event | None) -> None:
        """The selected decision (the template's)."""
        self.decision = event

    def fill_template(self) -> None:
        e = self.decision
        if e is None:
            self.message.setText("select a routing decision first")
            return
        self.spec.setText(f"forbid:pos={e.position},layer={e.layer},experts={e.top1}")
        self.spec.setFocus()

    def add_spec(self) -> bool:
        text = self.spec.text().strip()
        if not text:
            return False
        try:
            item = Intervention.parse(text)
        except InterventionError as exc:
            self.message.setText(str(exc))
            return False
        self.items.append(item)
        self.spec.clear()
        self._refill()
        return True

    def remove_selected(self) -> None:
        row = self.list.currentRow()
        if 0 <= row < len(self.items):
            del self.items[row]
            self._refill()

    def set_applied(self, interventions: tuple[Intervention, ...]) -> None:
        """What the run applies now (from a snapshot): the list shows it unless edits wait."""
        if tuple(self.items) == self.applied:
            self.items = list(interventions)
        self.applied = tuple(interventions)
        self._refill()

    def show_error(self, message: str) -> None:
        self.message.setText(message)

    def _refill(self) -> None:
        self.list.clear()
        for item in self.items:
            self.list.addItem(f"{item.spec}  \u2014  {item.describe()}")
        waiting = tuple(self.items) != self.applied
        self.buttons["apply"].setEnabled(waiting)
        n = len(self.applied)
        self.message.setText(("edits not applied yet: Apply runs under them" if waiting else
                              f"the run applies {n} intervention{'s' if n != 1 else ''}"
                              if n else "no interventions"))


class CounterfactualTableModel(ColumnTableModel):
    """A row per compared position from the first one the change could affect."""

    COLUMNS = ("pos", "next without", "next with", "layers changed", "max |dlogit|", "KL")
    TIPS = {"layers changed": "MoE layers whose expert set differs (* = an intervention acted "
                              "there)",
            "KL": "KL(without || with) of the output distributions"}

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.cf: Counterfactual | None = None
        self.label: TokenLabel = str
        self._rows: list[tuple[str, ...]] = []
        self._changed: list[bool] = []

    def set_counterfactual(self, cf: Counterfactual | None, label: TokenLabel) -> None:
        self.beginResetModel()
        self.cf, self.label = cf, label
        self._rows, self._changed = [], []
        if cf is not None:
            before, after = cf.next_tokens(original=True), cf.next_tokens()
            changed = cf.routing_changed
            for p in range(cf.from_position, cf.n_positions):
                layers = ", ".join(f"{layer}{'*' if cf.intervened[p, m] else ''}"
                                   for m, layer in enumerate(cf.moe_layers) if changed[p, m])
                self._rows.append((str(p), self._token(before[p]), self._token(after[p]),
                                   layers, f"{cf.max_abs[p]:.3g}", f"{cf.kl[p]:.3g}"))
                self._changed.append(before[p] != after[p])
        self.endResetModel()

    def _token(self, token: int | None) -> str:
        return "" if token is None else repr(self.label(token))

    def position(self, row: int) -> int:
        assert self.cf is not None
        return self.cf.from_position + row

    def rowCount(self, parent: Index = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def text(self, row: int, column: str) -> str:
        return self._rows[row][self.COLUMNS.index(column)]

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self._rows[index.row()][index.column()]
        if role == Qt.ItemDataRole.BackgroundRole and self._changed[index.row()]:
            return QBrush(_CHANGED_ROW)
        if role == Qt.ItemDataRole.TextAlignmentRole and index.column() >= 4:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class QtCounterfactualView(QWidget):
    """The last counterfactual beside the original (see the module docstring)."""

    sig_decision_selected = Signal(int, int)   # position, moe_index

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.cf: Counterfactual | None = None
        self.summary = QLabel("no counterfactual: add interventions and Apply", self)
        self.summary.setObjectName("debuggerCounterfactualSummary")
        self.summary.setWordWrap(True)
        self.model = CounterfactualTableModel(self)
        self.table = QTableView(self)
        self.table.setModel(self.model)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.kl_widget = pg.GraphicsLayoutWidget(self)
        self.kl_plot = tidy(self.kl_widget.addPlot(axisItems=axes(IndexAxis("bottom"))))
        self.kl_plot.setLabel("bottom", "position")
        self.kl_plot.setLabel("left", "KL")
        self.kl_curve = self.kl_plot.plot(pen=pg.mkPen((230, 140, 40)), symbol="o", symbolSize=4,
                                          symbolBrush=(230, 140, 40))
        self.map_widget = pg.GraphicsLayoutWidget(self)
        self.layer_axis = IndexAxis("left", cells=True)
        self.map_plot = self.map_widget.addPlot(
            axisItems=axes(IndexAxis("bottom", cells=True), self.layer_axis))
        self.map_plot.setLabel("bottom", "position")
        self.map_plot.setLabel("left", "MoE layer")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.map_plot.addItem(self.image)
        for plot in (self.kl_plot, self.map_plot):
            plot.setMouseEnabled(x=False, y=False)
            plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        legend = QLabel("orange: changed downstream · red: changed where an intervention acted · "
                        "blue: an intervention acted, the set stayed · dark: the same", self)
        legend.setWordWrap(True)
        decisions = QWidget(self)
        box = QVBoxLayout(decisions)
        box.setContentsMargins(0, 0, 0, 0)
        box.addWidget(self.map_widget, 1)
        box.addWidget(legend)
        # one at a time: the tab shares its column with the interventions list
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.table, "positions")
        self.tabs.addTab(self.kl_widget, "KL(without || with)")
        self.tabs.addTab(decisions, "decisions")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.summary)
        layout.addWidget(self.tabs, 1)
        self.table.clicked.connect(self._row_clicked)
        self.map_plot.scene().sigMouseClicked.connect(self._map_clicked)

    def set_counterfactual(self, cf: Counterfactual | None, label: TokenLabel = str) -> None:
        if cf is self.cf:
            return
        self.cf = cf
        self.model.set_counterfactual(cf, label)
        if cf is None:
            self.summary.setText("no counterfactual: add interventions and Apply")
            self.kl_curve.setData([], [])
            self.image.clear()
            return
        s = cf.summary()
        first = s["first_token_change"]
        token = "no next token changed" if first is None else \
            (f"first token change after position {first}: "
             f"{label(cf.next_tokens(True)[first])!r} \u2192 {label(cf.next_tokens()[first])!r}")
        edits = "; ".join(i.spec for i in cf.interventions) or "none"
        self.summary.setText(
            f"with {edits} (without: {'; '.join(i.spec for i in cf.original_interventions) or 'none'}),"
            f" from position {cf.from_position}: {s['routing_changed']} of {s['decisions']} "
            f"routing decisions changed ({s['intervened_changed']} where an intervention acted, "
            f"{s['downstream_changed']} downstream); {token}; max |dlogit| "
            f"{s['max_abs_max']:.3g}, max KL {s['kl_max']:.3g}")
        x = np.arange(cf.n_positions)
        self.kl_curve.setData(x, cf.kl)
        self.kl_plot.setRange(xRange=(-0.5, max(cf.n_positions - 0.5, 0.5)),
                              yRange=(0, max(float(cf.kl.max(initial=0.0)), 1e-9) * 1.1),
                              padding=0)
        changed, acted = cf.routing_changed, cf.intervened != 0
        codes = np.where(changed, np.where(acted, 2, 1), np.where(acted, 3, 0))
        self.image.setImage(_MAP_COLOURS[codes.T], autoLevels=False)
        self.image.setRect(0, 0, codes.shape[0], codes.shape[1])
        self.layer_axis.set_names([str(layer) for layer in cf.moe_layers])
        self.map_plot.setRange(xRange=(0, codes.shape[0]), yRange=(0, codes.shape[1]), padding=0)

    def _row_clicked(self, index: QModelIndex) -> None:
        cf = self.cf
        if cf is None:
            return
        p = self.model.position(index.row())
        changed = np.flatnonzero(cf.routing_changed[p])
        self.sig_decision_selected.emit(p, int(changed[0]) if changed.size else 0)

    def _map_clicked(self, ev: Any) -> None:
        if self.cf is None:
            return
        point = self.map_plot.vb.mapSceneToView(ev.scenePos())
        p, m = int(np.floor(point.x())), int(np.floor(point.y()))
        if 0 <= p < self.cf.n_positions and 0 <= m < len(self.cf.moe_layers):
            self.sig_decision_selected.emit(p, m)


__all__ = ["CounterfactualTableModel", "QtCounterfactualView", "QtInterventionList"]
