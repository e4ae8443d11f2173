"""What every plot of the Inspector shares: axes that count, colour bars that keep their numbers,
legends that stay off the data.

  * `IndexAxis`  - an axis of whole things (experts, layers, positions, bins): ticks only at
                   whole indices, thinned to 1, 2, 5, 10, ... so labels never crowd, each labelled
                   by its index or by a given name; `cells=True` puts a tick at the centre of cell
                   [i, i + 1) of a heatmap instead of at its edge.
  * `axes(...)`  - the `axisItems` argument of a PlotItem with such axes.
  * `colour_bar` - a non-interactive ColorBarItem beside a heatmap whose axis is wide enough for
                   its numbers.
  * `tidy`       - no SI-prefix rescaling (an empty plot otherwise reads "-500..500 (x0.001)").
  * `legend_row` - a legend in its own row under a plot of a GraphicsLayoutWidget, in columns.
  * `cell_under` - the heatmap cell under the pointer (hover text, click selection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QFontMetricsF

_STEPS = (1, 2, 5)


class IndexAxis(pg.AxisItem):
    """Ticks at whole indices (see the module docstring)."""

    def __init__(self, orientation: str, cells: bool = False,
                 names: Sequence[str] | None = None, **kwargs: object) -> None:
        super().__init__(orientation, **kwargs)
        self.cells = cells
        self.names: list[str] = list(names) if names is not None else []
        self.enableAutoSIPrefix(False)

    def set_names(self, names: Sequence[str] | None) -> None:
        """Label index i with names[i] (None: with i itself)."""
        self.names = list(names) if names is not None else []
        self.picture = None
        self.update()

    def _label(self, index: int) -> str:
        return self.names[index] if 0 <= index < len(self.names) else str(index)

    def _room(self, first: int, last: int) -> float:
        """Pixels one label needs along the axis (its longest text, plus a gap)."""
        font = self.style["tickFont"] or self.font()
        metrics = QFontMetricsF(font)
        if self.orientation in ("left", "right"):
            return metrics.height() * 1.6
        sample = [self._label(i) for i in range(max(first, 0), min(last, first + 400) + 1)]
        return max((metrics.horizontalAdvance(s) for s in sample), default=10.0) + 12.0

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list:  # noqa: N802
        offset = 0.5 if self.cells else 0.0
        minVal, maxVal = min(minVal, maxVal), max(minVal, maxVal)   # an inverted view
        # indices are never negative (an empty plot's default range starts below 0)
        first, last = max(math.ceil(minVal - offset), 0), math.floor(maxVal - offset)
        if last < first or size <= 0:
            return []
        span = max(maxVal - minVal, 1e-9)
        fits = max(1.0, size / self._room(first, last))   # labels the axis has room for
        step = next(m * d for d in (10 ** e for e in range(12)) for m in _STEPS
                    if (last - first + 1) / (m * d) <= fits or m * d * size / span > 1e6)
        start = math.ceil(first / step) * step
        return [(float(step), [i + offset for i in range(start, last + 1, step)])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:  # noqa: N802
        offset = 0.5 if self.cells else 0.0
        return [self._label(int(round(v - offset))) for v in values]


def axes(bottom: IndexAxis | None = None, left: IndexAxis | None = None) -> dict[str, pg.AxisItem]:
    """`axisItems` for a PlotItem: the given axes, plain ones elsewhere (SI prefixes off)."""
    out: dict[str, pg.AxisItem] = {}
    for name, axis in (("bottom", bottom), ("left", left)):
        if axis is None:
            axis = pg.AxisItem(name)
            axis.enableAutoSIPrefix(False)
        out[name] = axis
    return out


def tidy(plot: pg.PlotItem) -> pg.PlotItem:
    """No SI-prefix rescaling on any axis of `plot`."""
    for name in ("left", "bottom", "right", "top"):
        plot.getAxis(name).enableAutoSIPrefix(False)
    return plot


def colour_bar(plot: pg.PlotItem, image: pg.ImageItem, colour_map: str,
               levels: tuple[float, float] = (0.0, 1.0), label: str = "",
               interactive: bool = False) -> pg.ColorBarItem:
    """A ColorBarItem for `image`, inside `plot`'s layout, reading its values on a fixed-width
    axis so the numbers stay inside the view whatever they become; `interactive` lets the user
    drag the colour levels."""
    bar = pg.ColorBarItem(values=levels, colorMap=pg.colormap.get(colour_map),
                          interactive=interactive, width=14, label=label or None)
    bar.setImageItem(image, insert_in=plot)
    bar.axis.setWidth(48)
    bar.axis.enableAutoSIPrefix(False)
    return bar


def set_levels(bar: pg.ColorBarItem, data: np.ndarray) -> None:
    """Colour levels from the finite values of `data` (a flat array still gets a range)."""
    finite = np.asarray(data, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        bar.setLevels((0.0, 1.0))
        return
    lo, hi = float(finite.min()), float(finite.max())
    bar.setLevels((lo, hi) if hi > lo else (lo - 0.5, hi + 0.5) if lo != 0 else (0.0, 1.0))


def legend_row(layout: pg.GraphicsLayout, row: int, columns: int) -> pg.LegendItem:
    """A legend in row `row` of `layout` (spanning its columns), entries in `columns` columns:
    under its plot, never over the data."""
    legend = pg.LegendItem(colCount=columns, verSpacing=-4, horSpacing=16)
    layout.addItem(legend, row=row, col=0)
    return legend


def cell_under(plot: pg.PlotItem, scene_pos: object, n_x: int, n_y: int) -> tuple[int, int] | None:
    """The (x, y) cell under `scene_pos` of a heatmap drawn one unit per cell from (0, 0) with
    n_x columns and n_y rows, or None outside it."""
    point = plot.vb.mapSceneToView(scene_pos)
    x, y = int(np.floor(point.x())), int(np.floor(point.y()))
    return (x, y) if 0 <= x < n_x and 0 <= y < n_y else None
