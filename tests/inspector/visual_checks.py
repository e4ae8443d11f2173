"""What a person would see wrong in a rendered window, found from what Qt and pyqtgraph report.

`findings(window)` walks every visible widget and plot of a laid-out window and returns one line
per problem:
  * a widget outside its parent's rectangle (cut off by the parent; for top-level children:
    outside the window);
  * text that does not fit its widget: a label whose text is wider than the label (or, word
    wrapped, taller than it), a button or check box narrower than its text needs;
  * in each pyqtgraph plot: tick labels of one axis overlapping each other, an axis with no
    tick label at all (a colour bar that lost its numbers), a fractional tick on an axis that
    counts things (layers, experts, positions), a text label outside its plot's data area, a
    title wider than the plot, a legend lying over a bar or curve of its plot.
Scroll areas' contents are allowed to extend past their viewport (that is what scrolling is
for); everything else must fit.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6 import QtGui
from PySide6.QtCore import QPoint, QRect, QRectF, Qt
from PySide6.QtGui import QFontMetrics, QImage, QPainter
from PySide6.QtWidgets import (QAbstractButton, QAbstractScrollArea, QApplication, QLabel,
                               QSizePolicy, QTabBar, QWidget)

# Axis labels of axes whose values are counts or indices: their ticks must be whole numbers.
INTEGER_AXES = ("expert", "layer", "MoE layer", "position", "variants flipping the cell")


def _name(w: QWidget) -> str:
    path = []
    while w is not None and len(path) < 4:
        label = w.objectName() or type(w).__name__
        if isinstance(w, (QLabel, QAbstractButton)) and w.text():
            label += f"[{w.text()[:40]!r}]"
        path.append(label)
        w = w.parentWidget()
    return " < ".join(path)


def _in_scroll_content(w: QWidget) -> bool:
    """True when `w` is (inside) the scrolled content of a scroll area."""
    parent = w.parentWidget()
    while parent is not None:
        grand = parent.parentWidget()
        if isinstance(grand, QAbstractScrollArea) and parent is grand.viewport():
            return True
        parent = grand
    return False


def _visible_widgets(window: QWidget) -> list[QWidget]:
    return [w for w in window.findChildren(QWidget)
            if w.isVisible() and w.window() is window and w.width() > 0 and w.height() > 0]


def _outside_parent(w: QWidget) -> str | None:
    parent = w.parentWidget()
    if parent is None or _in_scroll_content(w) or isinstance(parent, QTabBar):
        return None
    if not parent.rect().contains(w.geometry()):
        g = w.geometry()
        return (f"outside its parent: {_name(w)} at {g.x()},{g.y()} {g.width()}x{g.height()} "
                f"in {parent.width()}x{parent.height()}")
    return None


def _clipped_text(w: QWidget) -> str | None:
    if isinstance(w, QLabel):
        text = w.text()
        if not text or w.textFormat() == Qt.TextFormat.RichText or QtGui.Qt.mightBeRichText(text) \
                or not w.pixmap().isNull():
            return None
        room = w.contentsRect()
        margin = 2 * w.margin() + 2 * max(w.indent(), 0)
        if w.wordWrap():
            need = w.heightForWidth(w.width())
            if need > w.height():
                return f"wrapped text cut off: {_name(w)} needs {need} px tall, has {w.height()}"
            return None
        fm = QFontMetrics(w.font())
        lines = text.split("\n")
        wide = max(fm.horizontalAdvance(line) for line in lines) + margin
        tall = fm.lineSpacing() * len(lines)
        if wide > room.width() + 1:
            return f"text cut off: {_name(w)} needs {wide} px wide, has {room.width()}"
        if tall > room.height() + 2:
            return f"text cut off: {_name(w)} needs {tall} px tall, has {room.height()}"
        return None
    if isinstance(w, QAbstractButton) and w.text():
        need = w.minimumSizeHint()
        if w.sizePolicy().horizontalPolicy() != QSizePolicy.Policy.Ignored and (
                w.width() < need.width() or w.height() < need.height()):
            return (f"button text cut off: {_name(w)} is {w.width()}x{w.height()}, needs "
                    f"{need.width()}x{need.height()}")
    return None


# -- pyqtgraph ---------------------------------------------------------------------------------


def _tick_texts(axis: pg.AxisItem) -> list[tuple[QRectF, str]]:
    image = QImage(4, 4, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        if axis.style["tickFont"]:
            painter.setFont(axis.style["tickFont"])
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    if specs is None:
        return []
    return [(rect, text) for rect, _flags, text in specs[2]]


def _axis_problems(where: str, axis: pg.AxisItem, must_read: bool, visible: QRectF,
                   cells: bool = False) -> list[str]:
    """Tick labels of `axis`: present when `must_read` (a colour bar, a plot with data), apart,
    inside the visible part of the scene, whole numbers on counting axes, and on a heatmap
    (`cells`) at the centres of the cells."""
    texts = _tick_texts(axis)
    out = []
    label = axis.labelText or axis.orientation
    if not texts and must_read and axis.style["showValues"]:
        out.append(f"{where}: axis '{label}' shows no numbers")
    for rect, text in texts:
        if not visible.adjusted(-1, -1, 1, 1).contains(axis.mapRectToScene(rect)):
            out.append(f"{where}: axis '{label}' tick label {text!r} is cut off by the view")
            break
    if axis.label.isVisible() and axis.labelText:
        margin = axis.label.document().documentMargin()   # blank space around the text
        title = axis.label.mapRectToScene(
            axis.label.boundingRect().adjusted(margin, margin, -margin, -margin))
        along = title.height() if axis.orientation in ("left", "right") else title.width()
        room = axis.sceneBoundingRect()
        length = room.height() if axis.orientation in ("left", "right") else room.width()
        if along > length + 1 or not visible.adjusted(-1, -1, 1, 1).contains(title):
            out.append(f"{where}: axis title {axis.labelText!r} is longer than its axis")
    view = axis.linkedView()
    if cells and view is not None and axis.labelText in INTEGER_AXES:
        horizontal = axis.orientation in ("top", "bottom")
        pixel = view.viewPixelSize()[0 if horizontal else 1]
        for rect, text in texts:
            point = view.mapSceneToView(axis.mapToScene(rect.center()))
            value = point.x() if horizontal else point.y()
            if abs(value - math.floor(value) - 0.5) > 2 * pixel + 1e-9:
                out.append(f"{where}: axis '{label}' tick {text!r} is not at a cell's centre")
                break
    for i, (a, ta) in enumerate(texts):
        for b, tb in texts[i + 1:]:
            overlap = a.intersected(b)
            if overlap.width() > 0.5 and overlap.height() > 0.5:
                out.append(f"{where}: axis '{label}' tick labels overlap: {ta!r} and {tb!r}")
    if axis.labelText in INTEGER_AXES:
        for _rect, text in texts:
            try:
                value = float(text.replace("\u2212", "-"))
            except ValueError:
                continue
            if not math.isclose(value, round(value)):
                out.append(f"{where}: axis '{label}' has a fractional tick {text}")
    return out


def _plot_problems(where: str, plot: pg.PlotItem, visible: QRectF) -> list[str]:
    out = []
    view = plot.getViewBox()
    data_rect = view.sceneBoundingRect()
    if not visible.adjusted(-1, -1, 1, 1).contains(plot.sceneBoundingRect()):
        out.append(f"{where}: plot '{plot.titleLabel.text}' is wider or taller than its view")
    cells = any(isinstance(item, pg.ImageItem) for item in view.addedItems)
    for name in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(name)
        if axis.isVisible():
            out += _axis_problems(f"{where} '{plot.titleLabel.text}'", axis, _has_data(view),
                                  visible, cells)
    for item in view.addedItems:
        if isinstance(item, pg.TextItem) and item.isVisible():
            box = item.sceneBoundingRect()
            if not data_rect.adjusted(-1, -1, 1, 1).contains(box):
                out.append(f"{where}: label {item.textItem.toPlainText()!r} outside its plot "
                           f"'{plot.titleLabel.text}'")
    title = plot.titleLabel
    if title.isVisible() and title.text:
        need = title.item.boundingRect().width()
        if need > title.boundingRect().width() + 1 or not visible.adjusted(-1, -1, 1, 1).contains(
                title.item.sceneBoundingRect()):
            out.append(f"{where}: title {title.text!r} cut off")
    legend = plot.legend
    if legend is not None and legend.isVisible() and legend.items:
        box = legend.sceneBoundingRect()
        for item in view.addedItems:
            if isinstance(item, pg.BarGraphItem) and item.isVisible() and any(
                    item.mapRectToScene(rect).intersects(box) for rect in _bar_rects(item)):
                out.append(f"{where}: the legend covers bars of '{plot.titleLabel.text}'")
                break
    return out


def _has_data(view: pg.ViewBox) -> bool:
    """Whether a plot shows anything yet (an empty plot may leave its axes unnumbered)."""
    for item in view.addedItems:
        if not item.isVisible():
            continue
        if isinstance(item, pg.ImageItem) and item.image is not None:
            return True
        if isinstance(item, pg.BarGraphItem) and len(item.opts.get("height", [])):
            return True
        if isinstance(item, pg.PlotDataItem) and item.xData is not None and len(item.xData):
            return True
    return False


def _bar_rects(bars: pg.BarGraphItem) -> list[QRectF]:
    """Each bar of `bars` in its own coordinates, from the options it was given (x or x0, width,
    height, y0: the forms this application uses)."""
    o = bars.opts
    n = len(o["height"])
    x = np.broadcast_to(np.asarray(o["x"] if o.get("x") is not None else o["x0"], float), n)
    width = np.broadcast_to(np.asarray(o["width"], float), n)
    x0 = x - width / 2 if o.get("x") is not None else x
    y0 = np.broadcast_to(np.asarray(o["y0"] if o.get("y0") is not None else 0.0, float), n)
    height = np.asarray(o["height"], float)
    return [QRectF(float(a), float(min(b, b + h)), float(w), float(abs(h)))
            for a, b, w, h in zip(x0, y0, width, height)]


def _graphics_problems(where: str, view: pg.GraphicsView) -> list[str]:
    out = []
    visible = view.mapToScene(view.viewport().rect()).boundingRect()
    for item in view.scene().items():
        if not item.isVisible():
            continue
        if isinstance(item, pg.PlotItem):
            out += _plot_problems(where, item, visible)
        elif isinstance(item, pg.ColorBarItem):
            out += _axis_problems(f"{where} colour bar", item.axis, True, visible)
        elif isinstance(item, pg.LegendItem) and item.items and not visible.adjusted(
                -1, -1, 1, 1).contains(item.sceneBoundingRect()):
            out.append(f"{where}: a legend is cut off by the view")
    return out


def findings(window: QWidget) -> list[str]:
    """Every problem visible in `window` as it is laid out now (see the module docstring)."""
    QApplication.processEvents()
    out: list[str] = []
    frame = window.rect()
    for w in _visible_widgets(window):
        top_left = w.mapTo(window, QPoint(0, 0))
        if w.parentWidget() is window and not frame.contains(QRect(top_left, w.size())):
            out.append(f"outside the window: {_name(w)}")
        for problem in (_outside_parent(w), _clipped_text(w)):
            if problem:
                out.append(problem)
        if isinstance(w, pg.GraphicsView):
            out += _graphics_problems(_name(w), w)
    return out
