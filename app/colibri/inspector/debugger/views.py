"""The debugger's views, each a widget over one Qt-free model from `colibri.debugging`:

  * `QtEventList`      - `EventList` as a lazy table (RenderDoc's event browser); current event
                         marked, bookmarks starred, expert caching's column (kept, LRU hits);
                         `sig_event_selected(index)`.
  * `QtTokenView`      - one `Event`: every expert's selection score as bars (chosen top-k in
                         colour, weights as labels, dropped groups faded), the rule's anatomy
                         as a table (`AnatomyTableModel`: logit, score, bias, selection score,
                         group, rank, weight), the rule in words, a flag when the correction
                         bias changed the choice, margin (absolute and ULPs), shared-expert
                         gate, hidden-state norm; under expert caching the fresh top-k, what
                         was kept and the LRU's hits and misses.
  * `QtRoutingHeatmap` - a `RoutingMatrix`: positions x MoE layers coloured by top-1 expert
                         (ImageItem + ColorBarItem), hover shows the full top-k and weights;
                         per-layer expert load bars, balance figure, the expert cache's hit
                         rate and kept decisions (the layer's and the run's), prompt coloured by
                         expert, co-selection matrix for the chosen layer.
  * `QtLatencyView`    - a `LatencySeries`: token time per position with rolling p50/p95/p99,
                         tokens per second, the prompt's end and prefill rate, and the current
                         position's layers split by phase (plus "other": layer time no phase
                         covers - norms, dense MLP).
  * `QtBreakpointList` - a `BreakpointList`: checkable entries, add and remove, stop or
                         forbid-and-continue at a hit.
None recomputes routing: they read the record, the event list's derived arrays, `stats` and
the anatomy (`colibri.debugging.anatomy`, whose scores the engine computes).
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDoubleSpinBox, QGridLayout,
                               QHBoxLayout, QHeaderView, QLabel, QListWidget, QListWidgetItem,
                               QMenu, QPushButton, QSpinBox, QSplitter, QTableView, QTabWidget,
                               QTextBrowser, QToolButton, QVBoxLayout, QWidget)

from colibri.debugging.anatomy import Anatomy, RuleBook, anatomy
from colibri.debugging.breakpoints import (AtPosition, BiasChanged, Breakpoint, BreakpointList,
                                           CacheKept, CacheMiss, ExpertChosen, MarginBelow,
                                           NonFinite)
from colibri.debugging.events import Event, EventList
from colibri.debugging.run import RoutingRecord
from colibri.inspection.values import format_scalar
from colibri.debugging.stats import (LatencySeries, cache_summary, co_selection, expert_load,
                                     load_balance, routing_matrix)
from colibri.inspector.plots import IndexAxis, axes, cell_under, colour_bar, legend_row, tidy
from colibri.inspector.readout import QtCellReadout
from colibri.inspector.table_model import ColumnTableModel, Index

_CURRENT = QColor(120, 200, 120, 90)  # RenderDoc's green flag for the current event
_CHOSEN = (230, 140, 40)
_OTHER = (110, 130, 160)
_DROPPED = (110, 130, 160, 70)        # an expert of a group the limit dropped
_CHOSEN_ROW = QColor(230, 140, 40, 70)


def _luminance(rgb: np.ndarray) -> float:
    """Perceived brightness 0..255 of an RGB colour (ITU-R BT.601 weights)."""
    return 0.299 * float(rgb[0]) + 0.587 * float(rgb[1]) + 0.114 * float(rgb[2])


def expert_colours(n: int) -> np.ndarray:
    """[n, 4] uint8 RGBA, one distinct colour per expert (and row n: grey for 'none')."""
    # evenly spaced hues at two brightness levels, so neighbouring ids differ (not a cyclic map)
    rows = [pg.intColor(i, hues=max((n + 1) // 2, 1), values=2).getRgb() for i in range(n)]
    return np.array(rows + [(60, 60, 60, 255)], dtype=np.uint8).reshape(n + 1, 4)


# ---------------------------------------------------------------------------------------------
# Event list


class EventTableModel(ColumnTableModel):
    """A lazy table over an EventList snapshot: rows are built only when painted. The decisions
    of a position in progress (the run paused between its layers) follow, in italics."""

    COLUMNS = ("#", "pos", "token", "layer", "experts", "weights", "margin", "ULPs", "change",
               "cache", "edit")

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.events: EventList | None = None
        self.pending: tuple[Event, ...] = ()
        self.cursor: int | None = None
        self._n = 0

    def set_events(self, events: EventList | None, cursor: int | None,
                   pending: tuple[Event, ...] = ()) -> None:
        n = (len(events) + len(pending)) if events is not None else 0
        if events is None or n < self._n or self.events is None or self.pending:
            self.beginResetModel()
            self.events, self.pending, self._n, self.cursor = events, tuple(pending), n, cursor
            self.endResetModel()
            return
        old_cursor = self.cursor
        self.events, self.pending, self.cursor = events, tuple(pending), cursor
        if n > self._n:  # append rows: views keep their scroll position and selection
            self.beginInsertRows(QModelIndex(), self._n, n - 1)
            self._n = n
            self.endInsertRows()
        for row in (old_cursor, cursor):
            if row is not None and row < n:
                self.dataChanged.emit(self.index(row, 0), self.index(row, self.columnCount() - 1))

    def rowCount(self, parent: Index = QModelIndex()) -> int:
        return 0 if parent.isValid() else self._n

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or self.events is None or not 0 <= index.row() < self._n:
            return None
        row, col = index.row(), index.column()
        in_progress = row >= len(self.events)
        if role == Qt.ItemDataRole.BackgroundRole:
            return QBrush(_CURRENT) if row == self.cursor else None
        if role == Qt.ItemDataRole.FontRole and in_progress:
            font = QFont()
            font.setItalic(True)
            return font
        if role not in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return None
        e = self.pending[row - len(self.events)] if in_progress else self.events[row]
        if role == Qt.ItemDataRole.ToolTipRole:
            edits = f"; interventions: {', '.join(e.intervention_kinds)}" if e.intervened else ""
            return e.label() + (" (position in progress)" if in_progress else "") + edits
        star = "\u2605" if row in self.events.bookmarks else ""
        values = (f"{star}{e.index}", e.position, e.token_text, e.layer,
                  " ".join(map(str, e.expert_ids)),
                  " ".join(f"{w:.2f}" for w in e.expert_weights),
                  f"{e.margin:.3g}", "" if e.margin_ulps is None else str(e.margin_ulps),
                  "\u21c4" if e.routing_changed else "", cache_cell(e),
                  "+".join(e.intervention_kinds))
        return values[col]


def cache_cell(e: Event) -> str:
    """The event list's expert-caching cell: 'kept' when cached routing kept the previous
    experts, then the LRU's hits of the chosen ('2/2 hit'); '' without expert caching."""
    parts = ["kept"] if e.cache_kept else []
    if e.cache_hits:
        parts.append(f"{sum(e.cache_hits)}/{len(e.cache_hits)} hit")
    return " ".join(parts)


class QtEventList(QWidget):
    """The event browser: (position, layer) rows; selecting one emits `sig_event_selected`."""

    sig_event_selected = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = EventTableModel(self)
        self.table = QTableView(self)
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.horizontalHeader().setStretchLastSection(True)
        # narrow columns sized for their content, so experts and weights show without scrolling
        metrics = self.table.fontMetrics()
        for column, sample in enumerate(("999\u2605", "999", "'tok_'", "99", "7 7",
                                         "0.99 0.99", "2.38e-07", "12345678", "\u21c4",
                                         "kept 2/2 hit", "forbid")):
            name = EventTableModel.COLUMNS[column]
            width = max(metrics.horizontalAdvance(sample), metrics.horizontalAdvance(name))
            self.table.setColumnWidth(column, width + 10)
        self.follow = True  # scroll to the current event as it moves
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.table)
        self.table.clicked.connect(lambda ix: self.sig_event_selected.emit(ix.row()))
        self.table.activated.connect(lambda ix: self.sig_event_selected.emit(ix.row()))

    def set_events(self, events: EventList | None, cursor: int | None,
                   pending: tuple[Event, ...] = ()) -> None:
        self.model.set_events(events, cursor, pending)
        if cursor is not None and self.follow and cursor < self.model.rowCount():
            self.table.scrollTo(self.model.index(cursor, 0))


# ---------------------------------------------------------------------------------------------
# Token view


class AnatomyTableModel(ColumnTableModel):
    """One decision's `Anatomy`, a row per expert: the rule's steps as columns. Chosen experts'
    rows are tinted, experts of dropped groups greyed; missing values (no model, no bias, no
    groups) read as empty cells."""

    COLUMNS = ("expert", "logit", "score", "bias", "selection", "group", "rank", "weight",
               "top-k", "cache")
    TIPS = {"logit": "router logit (router bias included)",
            "top-k": "cached routing: the expert's slot in the fresh top-k, what plain routing "
                     "would choose here",
            "cache": "the expert cache: resident (hit) or loaded (miss)",
            "score": "the rule's score: sigmoid of the logit, or softmax over every logit "
                     "(computed by the engine's router)",
            "bias": "correction bias, added for the choice only",
            "selection": "selection score: what the choice ranks (the margin is measured here)",
            "group": "the expert's group; * = a kept group",
            "rank": "slot in the choice, 1 = best", "weight": "combine weight"}

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.anatomy: Anatomy | None = None

    def set_anatomy(self, a: Anatomy | None) -> None:
        self.beginResetModel()
        self.anatomy = a
        self.endResetModel()

    def rowCount(self, parent: Index = QModelIndex()) -> int:
        return 0 if parent.isValid() or self.anatomy is None else self.anatomy.n_experts

    def text(self, row: int, column: str) -> str:
        """The cell as shown (tests read the table through this)."""
        a = self.anatomy
        assert a is not None
        if column == "expert":
            return str(row)
        if column == "group":
            g = int(a.group[row])
            return "" if g < 0 else f"{g}{'*' if a.group_kept[row] else ''}"
        if column == "rank":
            return str(int(a.rank[row])) if a.rank[row] else ""
        if column == "top-k":
            return str(int(a.fresh_rank[row])) if a.fresh_rank is not None and \
                a.fresh_rank[row] else ""
        if column == "cache":
            r = -1 if a.resident is None else int(a.resident[row])
            return "" if r < 0 else ("hit" if r else "miss")
        values = {"logit": a.logits, "score": a.scores, "bias": a.bias,
                  "selection": a.selection, "weight": a.weight}[column]
        if values is None or (column == "weight" and not a.rank[row]):
            return ""
        return format_scalar(np.float32(values[row]))

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        a = self.anatomy
        if not index.isValid() or a is None or not 0 <= index.row() < a.n_experts:
            return None
        row = index.row()
        if role == Qt.ItemDataRole.DisplayRole:
            return self.text(row, self.COLUMNS[index.column()])
        if role == Qt.ItemDataRole.BackgroundRole and a.rank[row]:
            return QBrush(_CHOSEN_ROW)
        if role == Qt.ItemDataRole.ForegroundRole and not a.group_kept[row]:
            return QBrush(QColor(128, 128, 128))
        if role == Qt.ItemDataRole.TextAlignmentRole and index.column() > 0:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class QtTokenView(QWidget):
    """One event: selection-score bars with the chosen top-k marked, the rule's anatomy per
    expert, and the routing figures. `set_rules` gives the open model's rules (scores, biases
    and the rule's words need them); without them those columns stay empty."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel("no event", self)
        self.title.setObjectName("debuggerTokenTitle")
        self.rule = QLabel("", self)
        self.rule.setObjectName("debuggerTokenRule")
        self.rule.setWordWrap(True)
        self.bias_flag = QLabel("", self)
        self.bias_flag.setObjectName("debuggerBiasChanged")
        self.bias_flag.setWordWrap(True)
        self.bias_flag.hide()
        self.details = QLabel("", self)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot = pg.PlotWidget(self, axisItems=axes(bottom=IndexAxis("bottom")))
        tidy(self.plot.getPlotItem())
        self.plot.setLabel("bottom", "expert")
        self.plot.setLabel("left", "router logit")
        self.plot.showGrid(y=True, alpha=0.3)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setRange(xRange=(-0.6, 0.6), yRange=(-1, 1), padding=0)
        self.bars: pg.BarGraphItem | None = None
        self.labels: list[pg.TextItem] = []
        self.anatomy_model = AnatomyTableModel(self)
        self.table = QTableView(self)
        self.table.setObjectName("debuggerAnatomy")
        self.table.setModel(self.anatomy_model)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # one at a time: the centre column is too short for both at 1280x800
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.plot, "bars")
        self.tabs.addTab(self.table, "experts")
        self.tabs.setTabToolTip(1, "every expert through the rule: logit, score, bias, selection "
                                   "score, group, rank, weight")
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.rule)
        layout.addWidget(self.bias_flag)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.details)
        self.event: Event | None = None
        self.anatomy: Anatomy | None = None
        self.rules: RuleBook | None = None

    def set_rules(self, rules: RuleBook | None) -> None:
        """The rules of the model the shown events ran on (None: unknown)."""
        self.rules = rules
        if self.event is not None:
            self.set_event(self.event)

    def set_event(self, e: Event | None) -> None:
        self.event = e
        for item in self.labels:
            self.plot.removeItem(item)
        self.labels = []
        if self.bars is not None:
            self.plot.removeItem(self.bars)
            self.bars = None
        self.anatomy = a = None if e is None else anatomy(e, self.rules)
        self.anatomy_model.set_anatomy(a)
        columns = AnatomyTableModel.COLUMNS
        for name, shown in (("score", a is not None and a.scores is not None),
                            ("bias", a is not None and a.bias is not None),
                            ("group", a is not None and a.has_groups),
                            ("top-k", a is not None and a.fresh_rank is not None),
                            ("cache", a is not None and a.resident is not None)):
            self.table.setColumnHidden(columns.index(name), not shown)
        if e is None or a is None:
            self.title.setText("no event")
            self.rule.setText("")
            self.bias_flag.hide()
            self.details.setText("")
            return
        self._plot(e, a)
        self.title.setText(f"event {e.index}: position {e.position} {e.token_text!r} "
                           f"(id {e.token}), layer {e.layer}")
        self.rule.setText(f"rule: {a.rule}" if a.rule else "")
        self.bias_flag.setText("\u2691 the correction bias changed this choice: ranked without "
                               "it, the rule picks another set of experts")
        self.bias_flag.setVisible(a.bias_changed)
        ulps = "n/a" if e.margin_ulps is None else f"{e.margin_ulps} ULPs"
        gate = "none" if np.isnan(e.shared_gate) else f"{e.shared_gate:.4f}"
        flags = []
        if e.routing_changed:
            flags.append("routing changed vs previous position")
        if e.nonfinite:
            flags.append("NaN/Inf")
        if e.intervened:
            flags.append(f"made under intervention: {', '.join(e.intervention_kinds)}")
        groups = (f"   kept groups {[g for g in e.chosen_groups if g >= 0]}"
                  if e.chosen_groups else "")
        caching = caching_text(e)
        self.details.setText(
            f"experts {list(e.expert_ids)}  weights "
            f"{[round(w, 4) for w in e.expert_weights]}{groups}\n"
            f"selection margin to first unchosen: {e.margin:.6g} ({ulps})   shared gate: {gate}"
            f"   hidden norm at router: {e.hidden_norm:.6g}" + ("\n" + "; ".join(flags)
                                                               if flags else "")
            + ("\n" + caching if caching else ""))

    def _plot(self, e: Event, a: Anatomy) -> None:
        """Bars of what the choice ranks: the selection scores (the logits themselves when the
        rule ranks them)."""
        values = np.nan_to_num(a.selection.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        self.plot.setLabel("left", "router logit" if a.selection_is_logit else "selection score")
        x = np.arange(values.size)
        brushes = [pg.mkBrush(*(_CHOSEN if a.rank[i] else
                                _OTHER if a.group_kept[i] else _DROPPED)) for i in x]
        self.bars = pg.BarGraphItem(x=x, height=values, width=0.8, brushes=brushes)
        self.plot.addItem(self.bars)
        for rank, (expert, weight) in enumerate(zip(e.expert_ids, e.expert_weights)):
            label = pg.TextItem(f"#{rank + 1} w={weight:.3f}", anchor=(0.5, 1.0))
            label.setPos(float(expert), float(max(values[expert], 0.0)))
            self.plot.addItem(label)
            self.labels.append(label)
        # room above the tallest bar for its label (a third of the span), none wasted below
        top, bottom = float(max(values.max(), 0.0)), float(min(values.min(), 0.0))
        span = max(top - bottom, 1e-6)
        self.plot.setRange(xRange=(-0.6, values.size - 0.4), padding=0,
                           yRange=(bottom - 0.05 * span, top + 0.35 * span))


def caching_text(e: Event) -> str:
    """What expert caching did at an event, for the token view ('' without it)."""
    lines = []
    if e.fresh_ids:
        if np.isnan(e.cache_margin):
            lines.append(f"cached routing: no previous position; the top-k {list(e.fresh_ids)}")
        elif e.cache_kept:
            lines.append(f"cached routing: kept the previous position's experts "
                         f"{sorted(e.expert_ids)} over the new top-k {list(e.fresh_ids)} "
                         f"(margin {e.cache_margin:.6g})")
        elif set(e.fresh_ids) == set(e.expert_ids) and e.cache_margin == 0:
            lines.append("cached routing: the top-k is the previous position's set")
        else:
            lines.append(f"cached routing: the new top-k {list(e.fresh_ids)} (margin "
                         f"{e.cache_margin:.6g}, not below the threshold)")
    if e.cache_hits:
        hits = [x for x, h in zip(e.expert_ids, e.cache_hits) if h]
        misses = [x for x, h in zip(e.expert_ids, e.cache_hits) if not h]
        lines.append(f"expert cache: hits {hits}, misses {misses}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Routing map


class QtRoutingHeatmap(QWidget):
    """Routing map: top-1 expert per (position, MoE layer), load, balance, co-selection."""

    sig_cell_selected = Signal(int, int)  # position, moe_index

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.events: EventList | None = None
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.layer_axis = IndexAxis("left", cells=True)
        self.map_plot = self.graphics.addPlot(
            title="top-1 expert", axisItems=axes(IndexAxis("bottom", cells=True),
                                                 self.layer_axis))
        self.map_plot.setLabel("bottom", "position")
        self.map_plot.setLabel("left", "MoE layer")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.map_plot.addItem(self.image)
        self.marker = pg.ScatterPlotItem(size=12, pen=pg.mkPen("w", width=2), brush=None,
                                         symbol="s")
        self.map_plot.addItem(self.marker)
        self.graphics.nextRow()
        self.load_plot = self.graphics.addPlot(title="expert load at the layer",
                                               axisItems=axes(IndexAxis("bottom")))
        self.load_plot.setLabel("bottom", "expert")
        self.load_plot.setLabel("left", "tokens")
        self.load_bars: pg.BarGraphItem | None = None
        self.graphics.nextRow()
        self.co_plot = self.graphics.addPlot(
            title="co-selection at the layer",
            axisItems=axes(IndexAxis("bottom", cells=True), IndexAxis("left", cells=True)))
        self.co_plot.setLabel("bottom", "expert")
        self.co_plot.setLabel("left", "expert")
        self.co_image = pg.ImageItem(axisOrder="row-major")
        self.co_plot.addItem(self.co_image)
        self.co_bar = colour_bar(self.co_plot, self.co_image, "viridis")
        for plot in (self.map_plot, self.load_plot, self.co_plot):
            plot.setMouseEnabled(x=False, y=False)
            plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        self.layer_box = QComboBox(self)
        self.balance = QLabel("", self)
        self.text = QTextBrowser(self)
        self.text.setMaximumHeight(90)
        self.hover = QtCellReadout(self.map_plot, self._cell_at,
                                   lambda p, mi: self._matrix.hover(p, mi), "", self)
        self.hover.sig_cell_clicked.connect(self.sig_cell_selected)
        top = QHBoxLayout()
        top.addWidget(QLabel("layer", self))
        top.addWidget(self.layer_box)
        top.addWidget(self.balance, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.graphics, 1)
        layout.addWidget(self.hover)
        layout.addWidget(self.text)
        self.layer_box.currentIndexChanged.connect(lambda _i: self._layer_views())
        self.image.setAcceptHoverEvents(True)
        self._matrix: Any = None
        # what the text shows: (layer, top-1 ids, tokens), so a run's new positions are appended
        self._text_shown: tuple[int, np.ndarray, np.ndarray] | None = None

    def set_events(self, events: EventList | None, cursor: int | None) -> None:
        self.events = events
        if events is None or len(events) == 0:
            self.image.clear()
            return
        rec = events.record
        m = routing_matrix(rec)
        self._matrix = m
        colours = expert_colours(m.n_experts)
        top1 = np.where(m.top1 >= 0, m.top1, m.n_experts)
        self.image.setImage(colours[top1.T], autoLevels=False)  # rows = layers, cols = positions
        self.image.setRect(0, 0, top1.shape[0], top1.shape[1])
        self.layer_axis.set_names([str(int(layer)) for layer in rec.moe_layers])
        self.map_plot.setRange(xRange=(0, top1.shape[0]), yRange=(0, top1.shape[1]), padding=0)
        if cursor is not None:
            p, mi = divmod(cursor, events.n_moe_layers)
            self.marker.setData([p + 0.5], [mi + 0.5])
        if self.layer_box.count() != rec.n_moe_layers:
            self.layer_box.blockSignals(True)
            self.layer_box.clear()
            self.layer_box.addItems([str(int(layer)) for layer in rec.moe_layers])
            self.layer_box.blockSignals(False)
        if cursor is not None:
            self.layer_box.setCurrentIndex(cursor % events.n_moe_layers)
        self._layer_views()

    def _layer_views(self) -> None:
        ev = self.events
        mi = self.layer_box.currentIndex()
        if ev is None or mi < 0 or len(ev) == 0:
            return
        rec = ev.record
        load = expert_load(rec)
        ratio, cv = load_balance(load)
        if self.load_bars is not None:
            self.load_plot.removeItem(self.load_bars)
        colours = expert_colours(rec.n_experts)
        self.load_bars = pg.BarGraphItem(x=np.arange(rec.n_experts), height=load[mi], width=0.8,
                                         brushes=[pg.mkBrush(*c[:3]) for c in colours[:-1]])
        self.load_plot.addItem(self.load_bars)
        self.load_plot.setRange(xRange=(-0.6, rec.n_experts - 0.4),
                                yRange=(0, max(float(load[mi].max()), 1.0)), padding=0.02)
        caching = cache_summary(rec, mi).describe()
        if caching:
            caching = f"   layer: {caching}   run: {cache_summary(rec).describe()}"
        self.balance.setText(f"load balance (max/mean): {ratio[mi]:.3f}   CV: {cv[mi]:.3f}   "
                             f"(1.0 = even){caching}")
        co = co_selection(rec)[mi].astype(np.float64)
        self.co_image.setImage(co, autoLevels=False)
        self.co_image.setRect(0, 0, co.shape[1], co.shape[0])
        self.co_bar.setLevels((0.0, float(max(co.max(), 1.0))))
        self.co_plot.setRange(xRange=(0, co.shape[1]), yRange=(0, co.shape[0]), padding=0)
        self._show_text(rec, mi, colours)

    def _show_text(self, rec: RoutingRecord, mi: int, colours: np.ndarray) -> None:
        """The tokens coloured by their top-1 expert at layer `mi`. A live run's update appends
        its new positions: laying out the whole text again took 35 ms at 2,000 positions."""
        ids, tokens = np.array(rec.expert_ids[:, mi, 0]), np.array(rec.tokens)
        shown = self._text_shown
        first = 0
        if shown is not None and shown[0] == mi and len(shown[1]) <= len(ids) \
                and np.array_equal(shown[1], ids[:len(shown[1])]) \
                and np.array_equal(shown[2], tokens[:len(shown[2])]):
            first = len(shown[1])
        parts = []
        for p in range(first, rec.n_positions):
            e = int(ids[p])
            c = colours[e if e >= 0 else -1]
            ink = "black" if _luminance(c) > 140 else "white"   # readable on any expert colour
            parts.append(f'<span style="background-color: rgb({c[0]},{c[1]},{c[2]}); '
                         f'color: {ink}" title="expert {e}">'
                         f'{html.escape(rec.token_text(p))}</span>')
        if first == 0:
            self.text.setHtml(" ".join(parts))
        elif parts:
            cursor = QTextCursor(self.text.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(" ", QTextCharFormat())   # unstyled, as the joins of setHtml
            cursor.insertHtml(" ".join(parts))
        self._text_shown = (mi, ids, tokens)

    def _cell_at(self, scene_pos: Any) -> tuple[int, int] | None:
        if self._matrix is None:
            return None
        return cell_under(self.map_plot, scene_pos, *self._matrix.shape)  # (position, moe_index)


# ---------------------------------------------------------------------------------------------
# Latency


class QtLatencyView(QWidget):
    """Token time per position with the run's p50/p95/p99 as reference lines (of the last
    WINDOW generated positions, as the summary states), the prompt's end marked and its prefill
    rate apart (its positions share their pieces' time); phases of the current position's
    layers."""

    WINDOW = 32
    PHASES = (("attention", (90, 140, 220)), ("router", (230, 140, 40)),
              ("experts", (120, 190, 90)), ("combine", (180, 100, 180)),
              ("other: norms, dense MLP", (120, 120, 120)))

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QLabel("", self)
        self.graphics = pg.GraphicsLayoutWidget(self)
        self.series_plot = tidy(self.graphics.addPlot(
            title="time per position (us)", axisItems=axes(IndexAxis("bottom"))))
        self.series_plot.setLabel("bottom", "position")
        self.curves = {"token": self.series_plot.plot(pen=pg.mkPen((200, 200, 200)), symbol="o",
                                                      symbolSize=4, symbolBrush=(200, 200, 200))}
        # percentiles as levels a reader can compare each position with, labelled at the right
        self.levels: dict[str, pg.InfiniteLine] = {}
        for name, colour in (("p50", (90, 200, 90)), ("p95", (230, 200, 60)),
                             ("p99", (230, 80, 80))):
            line = pg.InfiniteLine(angle=0, movable=False,
                                   pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DashLine),
                                   label=name,
                                   labelOpts={"position": 0.92, "color": colour,
                                              "anchors": [(1, 1), (1, 1)]})
            line.hide()
            self.series_plot.addItem(line)
            self.levels[name] = line
        self.prompt_end = pg.InfiniteLine(angle=90, movable=False,
                                          pen=pg.mkPen((150, 150, 220), width=1,
                                                       style=Qt.PenStyle.DotLine),
                                          label="prompt | generated",
                                          labelOpts={"position": 0.97, "color": (150, 150, 220),
                                                     "anchors": [(0, 0), (0, 0)]})
        self.prompt_end.hide()
        self.series_plot.addItem(self.prompt_end)
        self.graphics.nextRow()
        self.phase_plot = tidy(self.graphics.addPlot(
            title="layers of the current position (us)", axisItems=axes(IndexAxis("bottom"))))
        self.phase_plot.setLabel("bottom", "layer")
        self.phase_legend = legend_row(self.graphics.ci, 2, 2)
        for name, colour in self.PHASES:
            self.phase_legend.addItem(pg.BarGraphItem(x=[0], height=[0], width=1,
                                                      brush=pg.mkBrush(*colour)), name)
        self.phase_bars: list[pg.BarGraphItem] = []
        for plot in (self.series_plot, self.phase_plot):
            plot.setMouseEnabled(x=False, y=False)
            plot.setRange(xRange=(-0.5, 0.5), yRange=(0, 1), padding=0)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.graphics, 1)

    def set_events(self, events: EventList | None, cursor: int | None,
                   prompt_positions: int = 0) -> None:
        if events is None or events.record.n_positions == 0:
            return
        rec = events.record
        lat = LatencySeries(rec, prompt_positions)
        t = lat.token_ns.astype(np.float64) / 1e3
        x = np.arange(t.size)
        self.curves["token"].setData(x, t)
        pc = lat.percentiles(self.WINDOW)
        for name, line in self.levels.items():
            line.setValue(pc[name] / 1e3)
            line.label.setFormat(f"{name} {pc[name] / 1e3:.0f} us")
            line.show()
        self.series_plot.setRange(xRange=(-0.5, max(t.size - 0.5, 0.5)),
                                  yRange=(0, max(float(t.max()), 1.0) * 1.08), padding=0)
        self.prompt_end.setValue(lat.decode_start - 0.5)
        self.prompt_end.setVisible(lat.decode_start > 0)
        prompt = min(lat.prompt_positions, t.size)
        text = (f"prompt, {prompt} positions: "
                f"{lat.prompt_tokens_per_second():.1f} tok/s engine;  " if prompt else "")
        windowed = min(self.WINDOW, t.size - lat.decode_start)
        self.summary.setText(
            f"{text}last {windowed} {'generated ' if lat.decode_start else ''}positions: "
            f"p50 {pc['p50'] / 1e3:.1f} us, "
            f"p95 {pc['p95'] / 1e3:.1f} us, p99 {pc['p99'] / 1e3:.1f} us;  "
            f"{lat.tokens_per_second(self.WINDOW):.1f} tok/s engine, "
            f"{lat.tokens_per_second(self.WINDOW, wall=True):.1f} tok/s wall")
        position = rec.n_positions - 1 if cursor is None else cursor // max(events.n_moe_layers, 1)
        for bar in self.phase_bars:
            self.phase_plot.removeItem(bar)
        self.phase_bars = []
        layer = rec.phase_ns[position].astype(np.float64) / 1e3  # [n_layers, 5]
        other = np.maximum(layer[:, 4] - layer[:, :4].sum(axis=1), 0.0)
        phases = np.column_stack([layer[:, :4], other])
        bottom = np.zeros(phases.shape[0])
        self.phase_plot.setTitle(f"layers of position {position} (us)")
        for i, (name, colour) in enumerate(self.PHASES):
            bar = pg.BarGraphItem(x=np.arange(phases.shape[0]), height=phases[:, i], y0=bottom,
                                  width=0.8, brush=pg.mkBrush(*colour), name=name)
            self.phase_plot.addItem(bar)
            self.phase_bars.append(bar)
            bottom = bottom + phases[:, i]
        self.phase_plot.setRange(xRange=(-0.6, phases.shape[0] - 0.4),
                                 yRange=(0, max(float(bottom.max()), 1e-3) * 1.05), padding=0)


# ---------------------------------------------------------------------------------------------
# Breakpoints


class QtBreakpointList(QWidget):
    """A `BreakpointList`: check to enable, add from the form, remove the selected one."""

    sig_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.breakpoints = BreakpointList()
        self.list = QListWidget(self)
        self.kind = QComboBox(self)
        self.kind.addItems(["expert chosen", "margin below", "NaN/Inf", "at position",
                            "bias changed", "cache kept", "cache miss"])
        self.expert = QSpinBox(self)
        self.expert.setRange(0, 4095)
        self.layer = QSpinBox(self)
        self.layer.setRange(-1, 4095)
        self.layer.setSpecialValueText("any layer")
        self.layer.setValue(-1)
        self.threshold = QDoubleSpinBox(self)
        self.threshold.setDecimals(6)
        self.threshold.setRange(0.0, 1e6)
        self.threshold.setValue(0.01)
        self.position = QSpinBox(self)
        self.position.setRange(0, 10**7)
        # Add stops at a hit; its menu's other entry adds a breakpoint that forbids and goes on
        add = QToolButton(self)
        add.setText("Add")
        add.setToolTip("add a breakpoint that stops at a hit; the arrow: one that forbids the "
                       "expert at the hit (its first choice for kinds about no expert) and goes on")
        add.setPopupMode(QToolButton.ToolButtonPopupMode.MenuButtonPopup)
        menu = QMenu(add)
        menu.addAction("Add: stop at a hit", lambda: self.add_from_form("stop"))
        menu.addAction("Add: forbid it and continue", lambda: self.add_from_form("forbid"))
        add.setMenu(menu)
        self.add_button = add
        remove = QPushButton("Remove", self)
        # a grid of short rows, so the breakpoint form does not set the debugger's minimum width
        form = QGridLayout()
        for row, cells in enumerate(((self.kind, None, add, remove),
                                     (QLabel("expert", self), self.expert,
                                      QLabel("layer", self), self.layer),
                                     (QLabel("margin <", self), self.threshold,
                                      QLabel("position", self), self.position))):
            for column, w in enumerate(cells):
                if w is not None:
                    form.addWidget(w, row, column, 1, 2 if w is self.kind else 1)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.list)
        add.clicked.connect(lambda: self.add_from_form("stop"))
        remove.clicked.connect(self.remove_selected)
        self.list.itemChanged.connect(self._item_changed)

    def form_breakpoint(self, action: str = "stop") -> Breakpoint:
        """The form's breakpoint; `action` one of colibri.debugging.breakpoints.ACTIONS."""
        layer = None if self.layer.value() < 0 else self.layer.value()
        return [ExpertChosen(self.expert.value(), layer, action=action),
                MarginBelow(self.threshold.value(), layer, action=action),
                NonFinite(action=action), AtPosition(self.position.value(), action=action),
                BiasChanged(layer, action=action), CacheKept(layer, action=action),
                CacheMiss(layer, action=action)][self.kind.currentIndex()]

    def add_from_form(self, action: str = "stop") -> None:
        self.add(self.form_breakpoint(action))

    def add(self, bp: Breakpoint) -> None:
        self.breakpoints.add(bp)
        self._refill()

    def set_breakpoints(self, bps: BreakpointList) -> None:
        self.breakpoints = BreakpointList(list(bps))
        self._refill()

    def remove_selected(self) -> None:
        row = self.list.currentRow()
        if 0 <= row < len(self.breakpoints):
            self.breakpoints.remove(row)
            self._refill()

    def _refill(self) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for bp in self.breakpoints:
            item = QListWidgetItem(bp.describe())
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if bp.enabled else Qt.CheckState.Unchecked)
            self.list.addItem(item)
        self.list.blockSignals(False)
        self.sig_changed.emit()

    def _item_changed(self, item: QListWidgetItem) -> None:
        row = self.list.row(item)
        want = item.checkState() == Qt.CheckState.Checked
        if self.breakpoints[row].enabled != want:
            self.breakpoints.toggle(row)
            self.sig_changed.emit()


def splitter(orientation: Qt.Orientation, *widgets: QWidget) -> QSplitter:
    s = QSplitter(orientation)
    for w in widgets:
        s.addWidget(w)
    return s
