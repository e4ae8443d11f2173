"""Every view of the Inspector, on the demo model after real runs (data checks, a debugger run,
the jitter analysis and the epsilon sweep), and every tab of a GGUF file made by llama.cpp
(data checks, its metadata tree, an expert matrix's values and its layer's experts compared),
rendered at 1280x800 and 1920x1080: the window keeps
the size it was given, and nothing a person would see as broken is there (visual_checks: no
widget outside its parent or the window, no clipped text, no overlapping or fractional tick
labels, colour bars with numbers, no label outside its plot, no legend over bars). The key
columns of the tables are in view without scrolling, and header values read as the CLI prints
them.

Each page is also written as a PNG to $COLIBRI_VISUAL_ARTIFACTS (default build/visual) under
<platform>-<W>x<H>/, for a person to look at; `docs/images/` is refreshed from the 1280x800
offscreen pictures (tools/refresh_images.sh). CI runs this file offscreen and under Xvfb with the
real xcb platform.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication

from colibri.inspector import resources
from colibri.inspector.examples import prepare, settle
from colibri.inspector.export import save_png
from colibri.inspector.foreign_view import QtForeignFileView
from colibri.inspector.header_view import VALUE_COLUMN
from colibri.inspector.main_window import ENV_SETTINGS, FileView, MainWindow

from visual_checks import findings

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "resources" / "demo" / "demo.colibri"
GGUF = REPO / "tests" / "fixtures" / "gguf" / "qwen2_moe-q4_0.gguf"
SIZES = ((1280, 800), (1920, 1080))
# fewer variants than the lab's default list, the same kinds (orders, FMA, split-K, bf16, noise)
VARIANTS = "seq,blocked16,blocked4+fma,seq+split2,act-bf16,w-bf16,noise1,noise2"


def _artifacts(size: tuple[int, int]) -> Path:
    root = Path(os.environ.get("COLIBRI_VISUAL_ARTIFACTS", REPO / "build" / "visual"))
    directory = root / f"{QGuiApplication.platformName()}-{size[0]}x{size[1]}"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@contextmanager
def _window(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[MainWindow]:
    """A shown window at the first size, its settings in a directory of their own (a module
    fixture outlives a test's monkeypatch), closed at the end."""
    old = os.environ.get(ENV_SETTINGS)
    os.environ[ENV_SETTINGS] = str(tmp_path_factory.mktemp(name))
    window = MainWindow()
    window.persist = False
    window.resize(*SIZES[0])
    window.show()
    try:
        yield window
    finally:
        window.close()
        if old is None:
            os.environ.pop(ENV_SETTINGS, None)
        else:
            os.environ[ENV_SETTINGS] = old


def _render(window: MainWindow, pages: list[tuple[str, Callable[[], None]]],
            size: tuple[int, int]) -> list[str]:
    """Show every page with the window at `size` and save its picture; what visual_checks finds
    wrong on each, one line a finding."""
    window.resize(*size)
    settle()
    out = _artifacts(size)
    problems: list[str] = []
    for page, show in pages:
        show()
        settle(120)
        assert (window.width(), window.height()) == size, f"{page} resized the window"
        problems += [f"{page}: {f}" for f in findings(window)]
        save_png(window, out / f"{page}.png")
    return problems


def _pages(view: FileView) -> list[tuple[str, Callable[[], None]]]:
    """(name, show) for every view and every tab inside one."""

    def tab(name: str, tabs: Callable[[], object], index: int) -> Callable[[], None]:
        def show() -> None:
            view.set_view(name)
            tabs().setCurrentIndex(index)   # type: ignore[attr-defined]
        return show

    def plain(name: str) -> Callable[[], None]:
        return lambda: prepare(view, name)   # quick for these: selections, no runs

    def interventions() -> None:
        """The Interventions tab after a forbid of the selected decision's first choice."""
        from colibri.inspector.examples import wait_while
        from colibri.interventions import Intervention

        view.set_view("debugger")
        panel = view.debugger
        if panel.snapshot is not None and panel.snapshot.counterfactual is None:
            e = panel.event_at(panel.selected)
            assert e is not None
            panel.apply_interventions([Intervention("forbid", (e.top1,), first=e.position,
                                                    last=e.position, layer=e.layer)])
            settle(50)
            wait_while(lambda: panel.controller.running)
        panel.tabs.setCurrentWidget(panel.intervention_tab)

    return [("validation", plain("validation")), ("header", plain("header")),
            ("tensors", plain("tensors")), ("hex", plain("hex")),
            ("values-tensor", tab("values", lambda: view.values.tabs, 0)),
            ("values-experts", tab("values", lambda: view.values.tabs, 1)),
            ("debugger-routing", tab("debugger", lambda: view.debugger.tabs, 0)),
            ("debugger-latency", tab("debugger", lambda: view.debugger.tabs, 1)),
            ("debugger-experts", tab("debugger", lambda: view.debugger.token_view.tabs, 1)),
            ("debugger-interventions", interventions),
            ("jitter", tab("jitter", lambda: view.jitter.tabs, 0)),
            ("jitter-token", tab("jitter", lambda: view.jitter.tabs, 1)),
            ("jitter-epsilon", tab("jitter", lambda: view.jitter.tabs, 2)),
            ("jitter-ab", tab("jitter", lambda: view.jitter.tabs, 3))]


@pytest.fixture(scope="module", autouse=True)
def styled(qapp) -> Iterator[None]:
    """The application's own style sheets, as `colibri-inspector` applies them."""
    before = qapp.styleSheet()
    qapp.setStyleSheet(resources.style_sheet())
    yield
    qapp.setStyleSheet(before)


@pytest.fixture(scope="module")
def demo(qapp, tmp_path_factory) -> Iterator[tuple[MainWindow, FileView]]:
    """The demo open in a window, every view filled by real runs (done once for both sizes)."""
    with _window(tmp_path_factory, "visual-settings") as window:
        view = window.open_path(DEMO)
        for name in ("validation", "hex", "values", "debugger", "jitter"):
            prepare(view, name, jitter_variants=VARIANTS)
        view.values.show_layer_experts(1)
        settle(50)
        from colibri.inspector.examples import wait_while
        wait_while(view.values.is_busy)
        yield window, view


def test_the_runs_filled_every_view(demo) -> None:
    _window, view = demo
    assert view.data_result is not None
    assert view.debugger.events is not None and len(view.debugger.events) > 0
    lab = view.jitter
    assert lab.jitter_report is not None and lab.epsilon_report is not None
    assert lab.jitter_report.summary()["flipped_cells"] > 0   # the demo's near-ties show
    assert lab.token.cell is not None
    assert view.values.analysis is not None and view.values.comparison is not None


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_view_renders_cleanly(demo, size) -> None:
    window, view = demo
    problems = _render(window, _pages(view), size)
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def gguf(qapp, tmp_path_factory) -> Iterator[tuple[MainWindow, QtForeignFileView]]:
    """A GGUF file open in a window of its own, its data checked (once for both sizes)."""
    with _window(tmp_path_factory, "visual-gguf-settings") as window:
        view = window.open_path(GGUF)
        prepare(view, "validation")
        yield window, view
        view.shutdown()


def _gguf_pages(view: QtForeignFileView) -> list[tuple[str, Callable[[], None]]]:
    def experts() -> None:
        prepare(view, "values")
        view.values.tabs.setCurrentWidget(view.values.experts_page)   # compares the layer
        settle(50)
        from colibri.inspector.examples import wait_while
        wait_while(view.values.is_busy)

    return [(f"gguf-{name}", lambda n=name: prepare(view, n))
            for name in ("validation", "header", "tensors", "hex", "values")] + [
        ("gguf-values-experts", experts)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_gguf_tab_renders_cleanly(gguf, size) -> None:
    window, view = gguf
    problems = _render(window, _gguf_pages(view), size)
    assert view.data_result is not None and view.values.comparison is not None
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_key_columns_are_in_view(demo, size) -> None:
    """The tensor table's offset and size, and the event table's experts and weights, show
    without scrolling sideways."""
    window, view = demo
    window.resize(*size)
    view.set_view("tensors")
    settle()
    rows, header = view.tensors.view, view.tensors.header()
    from colibri.inspector.tensor_table import COLUMNS
    for column in ("name", "dtype", "shape", "offset", "bytes"):
        index = COLUMNS.index(column)
        right = header.sectionViewportPosition(index) + header.sectionSize(index)
        assert right <= rows.viewport().width(), f"tensor table column {column!r} out of view"
    view.set_view("debugger")
    settle()
    table = view.debugger.event_list.table
    columns = view.debugger.event_list.model.COLUMNS
    for column in ("pos", "token", "layer", "experts", "weights", "margin"):
        index = columns.index(column)
        header = table.horizontalHeader()
        right = header.sectionViewportPosition(index) + header.sectionSize(index)
        assert right <= table.viewport().width(), f"event table column {column!r} out of view"


def test_header_values_read_as_the_cli_prints_them(demo) -> None:
    _window, view = demo
    header = view.header
    assert header.field_item("norm_eps").text(VALUE_COLUMN) == "1e-05"
    hparams = header.tree.topLevelItem(header.tree.topLevelItemCount() - 2)
    shown = {hparams.child(i).text(0): hparams.child(i).text(VALUE_COLUMN)
             for i in range(hparams.childCount())}
    assert shown["norm_eps"] == "1e-05" and shown["rope_theta"] == "10000"


def test_views_before_any_run_read_sensibly(qtbot, tmp_path, monkeypatch) -> None:
    """Every view of the demo before anything ran: no clipped text, and the empty plots show
    plain ranges (no negative counts, no SI-scaled '-500..500 (x0.001)' axes)."""
    monkeypatch.setenv(ENV_SETTINGS, str(tmp_path))
    window = MainWindow()
    qtbot.addWidget(window)
    window.persist = False
    window.resize(*SIZES[0])
    window.show()
    view = window.open_path(DEMO)
    problems = []
    for page, show in _pages(view):
        if page in ("validation", "header", "tensors", "hex"):
            view.set_view(page)
        else:
            show()
        settle(60)
        problems += [f"{page}: {f}" for f in findings(window)]
        for axis in _count_axes(window):
            values = [v for _spacing, vs in axis.tickValues(*axis.range, 300) for v in vs]
            assert all(v >= 0 for v in values), f"{page}: negative ticks {values}"
            assert not axis.autoSIPrefixScale != 1.0, f"{page}: an SI-scaled axis"
    view.shutdown()
    assert not problems, "\n".join(problems)


def _count_axes(window: MainWindow) -> list:
    import pyqtgraph as pg

    from colibri.inspector.plots import IndexAxis
    return [item for view in window.findChildren(pg.GraphicsView) if view.isVisible()
            for item in view.scene().items() if isinstance(item, IndexAxis) and item.isVisible()]


def test_an_all_zero_epsilon_sweep_shows_no_negative_cells(qtbot, tiny_model_path) -> None:
    """A model without near-ties: every count of the sweep is 0 and the axis starts at 0."""
    from colibri.inspector.jitter import QtJitterLab

    from colibri.engine import Model

    lab = QtJitterLab()
    qtbot.addWidget(lab)
    lab.resize(1000, 600)
    lab.show()
    model = Model.open(tiny_model_path())
    lab.set_model(model)
    lab.prompt.setText("3, 4, 5, 6")
    lab.variants.setText("seq,blocked8")
    lab.eps.setText("0,1e-9,1e-6")
    with qtbot.waitSignal(lab.sig_report_ready, timeout=60000):
        lab.start("epsilon")
    assert [c["jitter_left"] for c in lab.curve.curve()] == [0, 0, 0]
    low, high = lab.curve.plot.getViewBox().viewRange()[1]
    assert low == 0 and high > 0
    axis = lab.curve.plot.getAxis("left")
    ticks = [v for _s, vs in axis.tickValues(low, high, 300) for v in vs]
    assert ticks and min(ticks) >= 0 and all(float(t).is_integer() for t in ticks)
    lab.shutdown()
    model.close()
