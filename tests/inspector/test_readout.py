"""The line under a heatmap (`QtCellReadout`) on a real plot and real pointer events: the
caption until the pointer is over a cell, then the view's words for that cell, the caption again
off the cells; a click on a cell is a signal with that cell. And `wrapping` makes a label's text
wrap within its layout instead of widening it."""

from __future__ import annotations

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from colibri.inspector.plots import cell_under
from colibri.inspector.readout import QtCellReadout, wrapping

N_X, N_Y = 5, 3


@pytest.fixture
def heatmap(qtbot) -> tuple[pg.GraphicsLayoutWidget, pg.PlotItem, QtCellReadout]:
    window = QWidget()
    qtbot.addWidget(window)
    graphics = pg.GraphicsLayoutWidget(window)
    plot = graphics.addPlot()
    plot.setRange(xRange=(0, N_X + 1), yRange=(0, N_Y), padding=0)   # one column off the cells
    readout = QtCellReadout(plot, lambda pos: cell_under(plot, pos, N_X, N_Y),
                            lambda x, y: f"cell x={x} y={y}", "hover a cell", window)
    layout = QVBoxLayout(window)
    layout.addWidget(graphics, 1)
    layout.addWidget(readout)
    window.resize(400, 300)
    window.show()
    qtbot.waitExposed(window)
    yield graphics, plot, readout
    window.close()   # the fixture's reference keeps the window alive until here


def _at(graphics: pg.GraphicsLayoutWidget, plot: pg.PlotItem, x: float, y: float):
    return graphics.mapFromScene(plot.vb.mapViewToScene(QPointF(x, y)))


def _hover(qtbot, graphics: pg.GraphicsLayoutWidget, at: object) -> None:
    """Move the pointer to `at`, after pyqtgraph's rate limit (it drops a move that comes
    sooner after the last one)."""
    qtbot.wait(1000 // pg.getConfigOption("mouseRateLimit") + 5)
    qtbot.mouseMove(graphics.viewport(), at)


def test_the_readout_says_the_cell_under_the_pointer_and_the_caption_elsewhere(qtbot, heatmap):
    graphics, plot, readout = heatmap
    assert readout.text() == "hover a cell"
    _hover(qtbot, graphics, _at(graphics, plot, 3.5, 1.5))
    assert readout.text() == "cell x=3 y=1"
    _hover(qtbot, graphics, _at(graphics, plot, 5.5, 1.5))   # right of the cells
    assert readout.text() == "hover a cell"


def test_a_click_on_a_cell_is_a_signal_with_that_cell(qtbot, heatmap):
    graphics, plot, readout = heatmap
    with qtbot.waitSignal(readout.sig_cell_clicked, timeout=5000) as blocker:
        qtbot.mouseClick(graphics.viewport(), Qt.MouseButton.LeftButton,
                         pos=_at(graphics, plot, 0.5, 2.5))
    assert blocker.args == [0, 2]


def test_a_click_off_the_cells_says_nothing(qtbot, heatmap):
    graphics, plot, readout = heatmap
    with qtbot.assertNotEmitted(readout.sig_cell_clicked, wait=200):
        qtbot.mouseClick(graphics.viewport(), Qt.MouseButton.LeftButton,
                         pos=_at(graphics, plot, 5.5, 0.5))


def test_a_wrapping_label_never_widens_its_layout(qtbot) -> None:
    window = QWidget()
    qtbot.addWidget(window)
    label = wrapping(QLabel("short", window))
    QVBoxLayout(window).addWidget(label)
    before = window.minimumSizeHint().width()
    label.setText("a long error message naming a file and a tensor, " * 8)
    assert label.wordWrap()
    assert label.sizePolicy().horizontalPolicy() == QSizePolicy.Policy.Ignored
    assert window.minimumSizeHint().width() == before
