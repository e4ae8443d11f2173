"""The shared plot pieces on a real pyqtgraph plot: `cell_under` maps a scene point to the heatmap
cell drawn there, one unit per cell from (0, 0), and to None outside the cells."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QPointF

from colibri.inspector.plots import cell_under


def test_cell_under_maps_scene_points_to_cells_and_none_outside(qtbot) -> None:
    graphics = pg.GraphicsLayoutWidget()
    qtbot.addWidget(graphics)
    plot = graphics.addPlot()
    plot.setRange(xRange=(0, 5), yRange=(0, 3), padding=0)
    graphics.resize(400, 300)
    graphics.show()
    qtbot.waitExposed(graphics)

    def at(x: float, y: float) -> tuple[int, int] | None:
        return cell_under(plot, plot.vb.mapViewToScene(QPointF(x, y)), 5, 3)

    assert at(0.5, 0.5) == (0, 0)
    assert at(4.5, 2.5) == (4, 2)       # x is the column, y the row
    assert at(3.2, 1.9) == (3, 1)
    assert at(5.5, 1.5) is None         # right of the last column
    assert at(1.5, -0.5) is None        # below the first row
