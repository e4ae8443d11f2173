"""The Inspector's reference diff (colibri.inspector.refdiff): it runs on a TaskRunner worker
with progress and cancel, shows the numbers of colibri.reference.diff as a layer x position
heatmap and a layer table, opens on the broken layer, clicks through to both engines' routing at
a cell, saves and loads `colibri diff --json` files, and opens from the debugger."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("torch")
pytest.importorskip("hf_reference")

from colibri.cli import main  # noqa: E402
from colibri.engine import Model  # noqa: E402
from colibri.inspector.debugger import QtDebuggerPanel  # noqa: E402
from colibri.inspector.refdiff import QtReferenceDiff, make_task  # noqa: E402
from colibri.reference.diff import ReferenceDiff  # noqa: E402
from colibri.values import Cancelled  # noqa: E402

from reference_models import Checkpoints, Converted, edit_tensor, swap_first_two  # noqa: E402

WAIT_MS = 120000


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("reference-diff-qt"))


@pytest.fixture(scope="module")
def swapped(converted: Checkpoints, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Converted, Path]:
    """A DeepSeek-V3 model whose layer 2 has experts 0 and 1 swapped."""
    c = converted("deepseek_v3-groups-qlora")
    return c, edit_tensor(c.path, tmp_path_factory.mktemp("broken") / "swapped.colibri",
                          "layers.2.moe_w2", swap_first_two)


@pytest.fixture
def page(qtbot):
    w = QtReferenceDiff()
    qtbot.addWidget(w)
    yield w
    w.shutdown()


def _open(page: QtReferenceDiff, path: Path, c: Converted) -> Model:
    model = Model.open(path)
    page.set_model(model)
    page.hf_dir.setText(str(c.hf_dir))
    page.prompt.setText(",".join(map(str, c.tokens)))
    return model


def _run(qtbot, page: QtReferenceDiff) -> list[tuple[int, int, str]]:
    progress: list[tuple[int, int, str]] = []
    page.runner.sig_progress.connect(lambda d, t, text: progress.append((d, t, text)))
    with qtbot.waitSignal(page.sig_diff_ready, timeout=WAIT_MS):
        page.run_button.click()
    return progress


def test_the_page_finds_the_broken_layer_off_the_ui_thread(qtbot, page, swapped):
    c, broken = swapped
    _open(page, broken, c)
    assert page.run_button.isEnabled() and not page.cancel_button.isEnabled()
    progress = _run(qtbot, page)
    assert progress and progress[-1][0] == progress[-1][1]   # (rate-limited: not every step)
    diff = page.diff
    assert diff is not None and diff.first_layer_over() == 2
    # the heatmap draws the diff's own numbers: log10 of the relative difference
    drawn = page.heatmap.values()
    assert drawn is not None and drawn.shape == (3, len(c.tokens))
    np.testing.assert_allclose(drawn, np.log10(np.maximum(diff.hidden_rel, 1e-12)), rtol=1e-6)
    assert "first layer over tolerance: layer 2 (moe)" in page.summary.text()
    # the table says the same, and the page opened on the broken layer's worst cell
    assert page.layer_table.item(2, 3).text().endswith("(first over tolerance)")
    assert page.compare.cell == (2, diff.layers()[2].worst_position)
    assert page.tabs.currentWidget() is page.compare
    assert page.save_button.isEnabled()


def test_a_cell_clicks_through_to_both_engines_routing(qtbot, page, converted, tmp_path):
    """Layer 1's router rows of experts 0 and 2 swapped in a Mixtral file: the first divergence
    is at layer 1; its cell shows each engine's logits, choices and weights."""
    c = converted("mixtral-odd-tied-window")

    def swap_rows(w):
        w[[0, 2]] = w[[2, 0]]
    broken = edit_tensor(c.path, tmp_path / "router.colibri", "layers.1.moe_gate", swap_rows)
    _open(page, broken, c)
    _run(qtbot, page)
    diff = page.diff
    first = diff.first_divergence()
    assert first is not None and first.layer == 1
    page.heatmap.sig_cell_selected.emit(first.layer, first.position)   # a click on the cell
    assert page.compare.cell == (1, first.position)
    rows = page.compare.rows()
    m, p = 1, first.position
    assert sorted(rows) == list(range(5))
    for e, cells in rows.items():
        assert float(cells["colibri logit"]) == pytest.approx(diff.colibri.router_logits[p, m, e])
        assert float(cells["transformers logit"]) == pytest.approx(
            diff.ref.router_logits[p, m, e])
    ranked_c = sorted((int(r["colibri rank"]), e) for e, r in rows.items() if r["colibri rank"])
    ranked_r = sorted((int(r["transformers rank"]), e) for e, r in rows.items()
                      if r["transformers rank"])
    assert [e for _, e in ranked_c] == list(first.colibri)
    assert [e for _, e in ranked_r] == list(first.reference)
    assert "different experts" in page.compare.title.text()
    assert first.cause in page.compare.title.text()
    # a dense layer or any other cell: the layer table's rows select their worst position
    page.layer_table.cellClicked.emit(0, 0)
    assert page.compare.cell == (0, diff.layers()[0].worst_position)


def test_cancel_stops_the_run(qtbot, page, converted):
    c = converted("qwen3_moe-base")
    _open(page, c.path, c)
    with qtbot.waitSignal(page.runner.sig_cancelled, timeout=WAIT_MS):
        page.run_button.click()
        page.cancel()
    assert page.status.text() == "cancelled"
    assert page.diff is None and page.run_button.isEnabled()
    with Model.open(c.path) as model:   # the task itself stops between its steps
        task = make_task(model, str(c.hf_dir), "1,2,3", "f32", 1, None)
        with pytest.raises(Cancelled):
            task.fn(lambda *a: None, lambda: True)


def test_bad_input_is_said_not_run(qtbot, page, converted, tmp_path):
    c = converted("qwen3_moe-base")
    _open(page, c.path, c)
    page.hf_dir.setText("")
    page.run_button.click()
    assert page.status.text().startswith("cannot run: choose the Hugging Face checkpoint")
    page.hf_dir.setText(str(c.hf_dir))
    page.tolerance.setText("-1")
    page.run_button.click()
    assert "tolerance must be a number > 0" in page.status.text()
    page.tolerance.setText("")
    page.hf_dir.setText(str(tmp_path))          # a directory without config.json
    with qtbot.waitSignal(page.sig_failed, timeout=WAIT_MS):
        page.run_button.click()
    assert "no config.json" in page.status.text() and page.run_button.isEnabled()


def test_save_and_load_round_trip_and_read_the_cli_json(qtbot, page, swapped, tmp_path):
    c, broken = swapped
    _open(page, broken, c)
    _run(qtbot, page)
    saved = tmp_path / "page.json"
    page.save_json(str(saved))
    other = QtReferenceDiff()
    qtbot.addWidget(other)
    other.load_json(str(saved))
    assert other.diff is not None and other.diff.to_dict() == page.diff.to_dict()
    np.testing.assert_array_equal(other.heatmap.values(), page.heatmap.values())
    cli = tmp_path / "cli.json"
    assert main(["diff", str(broken), str(c.hf_dir), "--tokens", ",".join(map(str, c.tokens)),
                 "--json", str(cli)]) == 0
    other.load_json(str(cli))
    assert other.diff.summary() == page.diff.summary()
    assert ReferenceDiff.from_dict(json.loads(cli.read_text())).first_layer_over() == 2
    other.shutdown()


def test_the_debugger_opens_it_on_its_model_and_prompt(qtbot, converted):
    c = converted("olmoe-base")
    panel = QtDebuggerPanel()
    qtbot.addWidget(panel)
    with Model.open(c.path) as model:
        panel.set_model(model)
        panel.run_panel.prompt.setText("3, 4, 5")
        panel.nav_actions["Reference diff"].trigger()
        dialog = panel.reference_diff
        assert dialog is not None and dialog.isVisible()
        assert dialog.page.model is model and dialog.page.prompt.text() == "3, 4, 5"
        dialog.page.hf_dir.setText(str(c.hf_dir))
        with qtbot.waitSignal(dialog.page.sig_diff_ready, timeout=WAIT_MS):
            dialog.page.run_button.click()
        assert dialog.page.diff.first_layer_over() is None
        dialog.close()
        panel.shutdown()
