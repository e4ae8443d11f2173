"""The tensor-values widget: the worker computes, the numbers shown equal numpy, cancel works,
expert comparison is drawn, and pages export as PNG and CSV."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from PySide6.QtGui import QImage

from colibri.engine import Model
from colibri.inspection import stats as S
from colibri.inspector.tensor_values import QtTensorValues, QtTensorValuesPage

TIMEOUT_MS = 20000


@pytest.fixture
def values(qtbot):
    widget = QtTensorValues()
    widget.resize(1000, 700)
    qtbot.addWidget(widget)
    widget.show()
    yield widget
    widget.cancel()
    widget.runner.wait()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_shown_stats_equal_numpy(values, qtbot, tiny_model, dtype):
    tiny = tiny_model(dtype=dtype)
    model = Model.open(tiny.path)
    values.set_model(model)
    with qtbot.waitSignal(values.sig_tensor_shown, timeout=TIMEOUT_MS):
        values.show_tensor("token_embd")
    ref = model.tensor_f32("token_embd").astype(np.float64)
    assert values.stat_value("count") == ref.size
    assert values.stat_value("min") == ref.min() and values.stat_value("max") == ref.max()
    assert values.stat_value("mean") == pytest.approx(ref.mean(), rel=1e-9, abs=1e-12)
    assert values.stat_value("std") == pytest.approx(ref.std(), rel=1e-9)
    assert values.stat_value("NaN count") == 0


def test_histogram_and_heatmap_are_drawn(values, qtbot, tiny_model):
    values.set_model(Model.open(tiny_model().path))
    with qtbot.waitSignal(values.sig_tensor_shown, timeout=TIMEOUT_MS):
        values.show_tensor("layers.0.moe_w1", expert=1)
    x, y = values.histogram_curve.getData()
    assert y.sum() == 16 * 32
    assert values.heatmap_image.image.shape == (16, 32)
    assert not values.progress.isVisible()


def test_cancel_reports_cancelled(values, qtbot, tiny_model, monkeypatch):
    values.set_model(Model.open(tiny_model().path))
    monkeypatch.setattr(S, "CHUNK_ELEMENTS", 1)   # thousands of chunks: time to cancel
    with qtbot.waitSignal(values.runner.sig_cancelled, timeout=TIMEOUT_MS):
        values.show_tensor("token_embd")
        values.cancel()
    assert values.analysis is None
    assert not values.cancel_button.isVisible()


def test_expert_comparison_table_equals_numpy(values, qtbot, tiny_model):
    tiny = tiny_model()
    model = Model.open(tiny.path)
    values.set_model(model)
    with qtbot.waitSignal(values.sig_experts_shown, timeout=TIMEOUT_MS):
        values.show_layer_experts(0)
    table = values.experts_table
    assert table.rowCount() == 4
    header = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    w2 = tiny.values["layers.0.moe_w2"].astype(np.float64)
    col = header.index("w2 norm")
    shown = [table.item(e, col).data(0x0100) for e in range(4)]
    np.testing.assert_allclose(shown, np.linalg.norm(w2.reshape(4, -1), axis=1), rtol=1e-9)
    assert values.router_image.image.shape == tiny.values["layers.0.moe_gate"].shape


def test_export_png_and_csv(values, qtbot, tiny_model, tmp_path):
    values.set_model(Model.open(tiny_model().path))
    with qtbot.waitSignal(values.sig_tensor_shown, timeout=TIMEOUT_MS):
        values.show_tensor("token_embd")
    png, table = tmp_path / "values.png", tmp_path / "stats.csv"
    assert values.export_png(png)
    assert not QImage(str(png)).isNull()
    values.export_csv(table)
    with open(table, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["statistic", "value"] and rows[1][0] == "count"


@pytest.mark.parametrize("dtype,layout,panel", [("q8", "panels", "q8_0x8"),
                                                ("bf16", "bf16-panels", "bf16x16")])
def test_a_panel_tensor_shows_its_dtype_and_the_values_of_its_rows(values, qtbot, tmp_path, dtype,
                                                                   layout, panel):
    """A q8_0x8 or bf16x16 stack (docs/format.md, "Quantised panels", "bf16 panels") is listed
    under its own dtype and shows the values of the rows its panels hold: those of the row file
    it was laid out from."""
    from quant_models import make_model

    from colibri.inspection.hexsource import regions_for
    from colibri.inspection.tensors import rows_for
    from colibri.relayout import relayout

    rows = make_model(tmp_path, quant="q8") if dtype == "q8" else make_model(tmp_path, dtype="bf16")
    relayout(rows, tmp_path / "panels.colibri", layout)
    model = Model.open(tmp_path / "panels.colibri")
    shown = {r.label: r.dtype for r in rows_for(model) if r.label == "layers.0.moe_w1"}
    assert shown == {"layers.0.moe_w1": panel}          # the tensor table's row
    hex_label = next(r.label for r in regions_for(model) if r.kind == "tensor"
                     and r.start == model.tensor_info("layers.0.moe_w1").offset)
    assert hex_label == f"layers.0.moe_w1 {panel} [8x96x128]"  # the hexdump's region
    values.set_model(model)
    with qtbot.waitSignal(values.sig_tensor_shown, timeout=TIMEOUT_MS):
        values.show_tensor("layers.0.moe_w1", expert=3)
    assert panel in values.title.text()
    ref = Model.open(rows).tensor_f32("layers.0.moe_w1")[3].astype(np.float64)
    assert values.stat_value("count") == ref.size
    assert values.stat_value("min") == ref.min() and values.stat_value("max") == ref.max()
    assert values.stat_value("std") == pytest.approx(ref.std(), rel=1e-9)
    heat = S.analyse_tensor(Model.open(rows), "layers.0.moe_w1", 3).heatmap.cells
    np.testing.assert_array_equal(values.heatmap_image.image, heat)


def test_dense_layer_is_refused(values, tiny_model):
    values.set_model(Model.open(tiny_model(dense_layers=(0,)).path))
    with pytest.raises(ValueError):
        values.show_layer_experts(0)


def test_the_page_builds_its_view_on_first_use_and_then_shows_the_tensor_chosen_before(
        qtbot, tiny_model):
    """A file's values tab costs nothing until it is opened: a tensor selected while it is not
    on view waits, and is shown when the view is built; a new document drops what waited."""
    page = QtTensorValuesPage()
    qtbot.addWidget(page)
    model = Model.open(tiny_model().path)
    page.set_store(S.EngineTensors(model))
    page.show_tensor("layers.0.moe_w1", 1, on_view=False)
    assert page.built is None
    with qtbot.waitSignal(page.view.sig_tensor_shown, timeout=TIMEOUT_MS) as shown:
        pass
    assert shown.args == ["layers.0.moe_w1[1]"]
    assert page.view.heatmap_image.image.shape == (16, 32)

    later = QtTensorValuesPage()
    qtbot.addWidget(later)
    later.set_store(S.EngineTensors(model))
    later.show_tensor("token_embd", None, on_view=False)
    later.set_store(S.EngineTensors(model))             # the file reloaded
    with qtbot.assertNotEmitted(later.view.sig_tensor_shown, wait=300):
        pass
    assert later.view.title.text() == "No tensor selected"
    page.view.runner.wait()
