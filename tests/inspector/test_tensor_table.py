"""The tensor table widget on real files: a model that passes qtmodeltester in every grouping
(filtered and sorted too), numeric sort, name filter, grouping, selection signals, check status,
CSV export, and rows fetched on demand."""

from __future__ import annotations

import csv
from dataclasses import replace
from operator import itemgetter

import pytest
from PySide6.QtCore import QModelIndex, QPoint, QSize, Qt
from PySide6.QtGui import QColor, QImage, QPainter, QPalette
from PySide6.QtWidgets import QStyleOptionViewItem, QTreeView

from colibri.engine import Model
from colibri.inspection.tensors import group_rows, name_matcher, rows_for
from colibri.inspector.tensor_table import (COLUMNS, EXPAND_ALL_ROWS, SORT_ROLE, QtTensorTable,
                                            TensorTableModel)


@pytest.fixture
def table(qtbot, tiny_model_path):
    widget = QtTensorTable()
    qtbot.addWidget(widget)
    widget.set_model(Model.open(tiny_model_path("qwen2_moe")))
    widget.show()
    return widget


@pytest.mark.parametrize("grouping", ["none", "layer", "expert"])
def test_model_passes_qtmodeltester(qtmodeltester, tiny_model_path, grouping):
    model = TensorTableModel()
    model.set_rows(rows_for(Model.open(tiny_model_path())), grouping)
    qtmodeltester.check(model, force_py=True)


def test_filtered_sorted_model_passes_qtmodeltester(qtmodeltester, table):
    table.set_grouping("layer")
    table.set_filter("moe")
    table.view.sortByColumn(COLUMNS.index("bytes"), Qt.SortOrder.DescendingOrder)
    qtmodeltester.check(table.table_model, force_py=True)


def test_sort_by_bytes_is_numeric(table):
    table.view.sortByColumn(COLUMNS.index("bytes"), Qt.SortOrder.DescendingOrder)
    shown = [r.nbytes for r in table.visible_rows()]
    assert shown == sorted(shown, reverse=True)


def test_default_order_is_file_offset(table):
    offsets = [r.offset for r in table.visible_rows()]
    assert offsets == sorted(offsets)


@pytest.mark.parametrize("order", [Qt.SortOrder.AscendingOrder, Qt.SortOrder.DescendingOrder])
def test_offset_order_runs_shard_by_shard(tiny_model_path, order):
    """A checkpoint's rows sort by file (shard), then by offset in it, either way round."""
    rows = rows_for(Model.open(tiny_model_path()))
    sharded = [replace(r, shard=(7 * i) % 3) for i, r in enumerate(reversed(rows))]
    model = TensorTableModel()
    model.set_rows(sharded)
    model.sort(COLUMNS.index("bytes"))
    model.sort(COLUMNS.index("offset"), order)
    expected = sorted(sharded, key=lambda r: (r.shard, r.offset),
                      reverse=order == Qt.SortOrder.DescendingOrder)
    assert model.shown_rows() == expected


@pytest.mark.parametrize("grouping", ["none", "layer", "expert"])
def test_each_arrangement_is_a_plain_filter_group_and_sort(tiny_model_path, grouping):
    """However filters, sorts and check results follow one another (rows sorted once a column
    are reused), each group shows its rows (as grouping every row gives them) that the filter
    keeps, ordered by the sort column's key, ties in file order."""
    rows = rows_for(Model.open(tiny_model_path()))
    model = TensorTableModel()
    model.set_rows(rows, grouping)
    position = {(r.name, r.expert): i for g in (rows, model.leaf_rows()) for i, r in enumerate(g)}
    for step, pattern in enumerate(("", "moe", "layers.1.*", "")):
        model.set_pattern(pattern)
        model.set_check_status({r.name: ("ok", "bad")[(i + step) % 2] for i, r in enumerate(rows)})
        for col in range(len(COLUMNS)):
            for order in (Qt.SortOrder.AscendingOrder, Qt.SortOrder.DescendingOrder):
                model.sort(col, order)
                kept = {r.name for r in rows if name_matcher(pattern)(r.label)}
                expected = {label: {(r.name, r.expert) for r in members if r.name in kept}
                            for label, members in group_rows(rows, grouping)}
                if grouping != "none":
                    assert model.group_labels() == [
                        label for label, _members in group_rows(rows, grouping) if expected[label]]
                for g, label in enumerate(model.group_labels()):
                    parent = QModelIndex() if grouping == "none" else model.index(g, 0)
                    while model.canFetchMore(parent):
                        model.fetchMore(parent)
                    shown = [model.index(i, col, parent) for i in range(model.rowCount(parent))]
                    assert {(r.name, r.expert) for r in map(model.row_at, shown)} == \
                        expected[label]
                    keys = [(i.data(SORT_ROLE), position[model.row_at(i).name,
                                                           model.row_at(i).expert]) for i in shown]
                    in_file_order = sorted(keys, key=itemgetter(1))   # then the stable sort:
                    assert keys == sorted(in_file_order, key=itemgetter(0),
                                          reverse=order == Qt.SortOrder.DescendingOrder)


def test_filter_by_glob(table):
    table.set_filter("layers.1.moe_w*")
    assert [r.name for r in table.visible_rows()] == [
        "layers.1.moe_w1", "layers.1.moe_w2", "layers.1.moe_w3"]
    assert table.count_label.text() == f"3 / {len(table.table_model.leaf_rows())} tensors"


def test_group_by_layer_has_one_group_per_layer(table):
    table.set_grouping("layer")
    labels = [table.table_model.index(r, 0).data() for r in range(table.table_model.rowCount())]
    assert labels[1].startswith("layer 0 (") and labels[2].startswith("layer 1 (")
    assert len(labels) == 4


def test_group_by_expert_shows_expert_slices(table):
    table.set_grouping("expert")
    group = table.table_model.index(2, 0)
    assert group.data().startswith("expert 2")
    names = [table.table_model.index(r, 0, group).data() for r in range(table.table_model.rowCount(group))]
    assert "layers.0.moe_w2[2]" in names


def test_selecting_a_row_emits_the_tensor_name_and_range(table):
    table.set_grouping("expert")
    names: list[str] = []
    ranges: list[tuple[int, int]] = []
    table.sig_tensor_selected.connect(names.append)
    table.sig_range_selected.connect(lambda offset, nbytes: ranges.append((offset, nbytes)))
    assert table.select_tensor("layers.1.moe_w3", expert=1)
    row = table.table_model.row_at(table.table_model.find("layers.1.moe_w3", 1))
    assert names == ["layers.1.moe_w3"]
    assert ranges == [(row.offset, row.nbytes)] and row.expert == 1


def test_select_tensor_clears_a_filter_hiding_it(table):
    table.set_filter("attn")
    assert table.select_tensor("token_embd")
    assert table.selected_row().name == "token_embd"


def test_check_status_is_shown(table):
    table.set_check_status({"token_embd": "bad", "output": "ok"})
    col = COLUMNS.index("check")
    texts = {table.table_model.index(r, 0).data(): table.table_model.index(r, col).data()
             for r in range(table.table_model.rowCount())}
    assert texts["token_embd"] == "bad" and texts["output"] == "ok"
    assert texts["layers.0.attn_q"] == "unchecked"


@pytest.mark.parametrize("grouping", ["none", "layer"])
def test_cells_are_painted_as_the_model_answers(table, grouping):
    """The view's delegate fills a cell without asking the model's roles; what it paints (text,
    alignment, the check column's colour) is what data() answers for that cell."""
    table.set_grouping(grouping)
    table.set_check_status({"token_embd": "bad", "output": "ok"})
    model, view = table.table_model, table.view
    parents = [QModelIndex()] if grouping == "none" else [QModelIndex(), model.index(1, 0)]
    delegate = view.itemDelegate()
    for parent, row in ((p, r) for p in parents for r in range(model.rowCount(p))):
        for col in range(len(COLUMNS)):
            index = model.index(row, col, parent)
            option = QStyleOptionViewItem()
            delegate.initStyleOption(option, index)
            assert option.text == (index.data() or "")
            alignment = index.data(Qt.ItemDataRole.TextAlignmentRole)
            if alignment is not None:
                assert option.displayAlignment == Qt.AlignmentFlag(alignment)
            brush = index.data(Qt.ItemDataRole.ForegroundRole)
            if brush is not None:
                assert option.palette.color(QPalette.ColorRole.Text) == brush.color()


class _RecordingPainter(QPainter):
    """A painter on an image that records each text drawn: (x, y, text, pen colour)."""

    def __init__(self, size: QSize) -> None:
        self.image = QImage(size, QImage.Format.Format_ARGB32)
        super().__init__(self.image)
        self.texts: list[tuple[int, int, str, QColor]] = []

    def drawText(self, x, y, text):  # noqa: N802 (Qt API)
        self.texts.append((x, y, text, self.pen().color()))
        super().drawText(x, y, text)


def _painted_rows(table) -> dict[int, list[tuple[int, int, str, QColor]]]:
    """What the flat table paints for a screenful, by row: the texts left to right."""
    view = table.view
    painter = _RecordingPainter(view.viewport().size())
    try:
        view.paint_rows(painter, view.viewport().rect())
    finally:
        painter.end()
    rows: dict[int, list[tuple[int, int, str, QColor]]] = {}
    for x, y, text, colour in painter.texts:
        rows.setdefault(view.rowAt(y), []).append((x, y, text, colour))
    return {r: sorted(texts, key=lambda t: t[0]) for r, texts in rows.items()}


def test_flat_rows_are_painted_as_the_model_answers(qtbot, table):
    """The flat table paints its rows itself; each row shows, column by column, the text data()
    answers, inside its column and right-aligned where the model says, the check column in its
    colour."""
    table.resize(1600, 400)
    qtbot.waitUntil(lambda: table.header().sectionViewportPosition(len(COLUMNS) - 1)
                    + table.header().sectionSize(len(COLUMNS) - 1) < table.view.width())
    table.set_check_status({"token_embd": "bad", "output": "ok"})
    model, view, header = table.table_model, table.view, table.header()
    painted = _painted_rows(table)
    assert len(painted) == view.rowAt(view.viewport().height() - 1) + 1 > 5
    for row, texts in painted.items():
        shown = [c for c in range(len(COLUMNS)) if model.index(row, c).data()]   # "" not drawn
        assert len(texts) == len(shown)
        for col, (x, _y, text, colour) in zip(shown, texts):
            index = model.index(row, col)
            left, width = header.sectionViewportPosition(col), header.sectionSize(col)
            text_width = view.fontMetrics().horizontalAdvance(text)
            assert text == index.data() and left <= x and x + text_width <= left + width
            if index.data(Qt.ItemDataRole.TextAlignmentRole) is not None:   # right-aligned
                assert left + width - (x + text_width) < 6
            brush = index.data(Qt.ItemDataRole.ForegroundRole)
            if brush is not None:
                assert colour == brush.color()


def test_a_long_name_is_elided_to_its_column(table):
    table.header().resizeSection(0, 60)
    name, *_ = _painted_rows(table)[0][0][2:]
    assert name.endswith("…") and table.view.fontMetrics().horizontalAdvance(name) <= 60


def test_the_selected_row_is_highlighted(table):
    table.select_tensor("output")
    view = table.view
    row = view.currentIndex().row()
    image = view.viewport().grab().toImage()
    palette = view.palette()
    y = view.rowViewportPosition(row) + 1
    assert image.pixelColor(1, y) == palette.color(QPalette.ColorRole.Highlight)
    other = row - 1
    expected = palette.color(QPalette.ColorRole.AlternateBase if other % 2
                             else QPalette.ColorRole.Base)
    assert image.pixelColor(1, view.rowViewportPosition(other) + 1) == expected
    assert {c.rgba() for _x, _y, _t, c in _painted_rows(table)[row]} == {
        palette.color(QPalette.ColorRole.HighlightedText).rgba()}


def test_grouped_rows_are_painted_as_the_model_answers(qtbot, table):
    """Grouped, each row shown paints what data() answers, column by column: a tensor's name
    indented under its group, a group's label past its branch indicator."""
    table.resize(1600, 400)
    table.set_grouping("layer")
    view, model = table.view, table.table_model
    qtbot.waitUntil(lambda: view.header().sectionViewportPosition(len(COLUMNS) - 1)
                    + view.header().sectionSize(len(COLUMNS) - 1) < view.width())
    assert view.isExpanded(model.index(1, 0))
    painter = _RecordingPainter(view.viewport().size())
    try:
        view.paint_rows(painter, view.viewport().rect())
    finally:
        painter.end()
    rows: dict[tuple[int, int], list[tuple[int, int, str, QColor]]] = {}
    for x, y, text, colour in painter.texts:
        index = view.indexAt(QPoint(x, y))
        rows.setdefault((index.internalId(), index.row()), []).append((x, y, text, colour))
    assert len(rows) >= view.viewport().height() // view.visualRect(model.index(0, 0)).height() \
        > 10   # every row shown
    for (gid, row), texts in rows.items():
        index = model.index(row, 0, QModelIndex() if gid == 0 else model.index(gid - 1, 0))
        texts.sort(key=lambda t: t[0])
        assert [t[2] for t in texts] == [index.siblingAtColumn(c).data()
                                         for c in range(len(COLUMNS))
                                         if index.siblingAtColumn(c).data()]
        depth = 1 if gid == 0 else 2
        assert texts[0][0] >= view.indentation() * depth   # past the indentation


def _stock_tree_like(view: QTreeView) -> QTreeView:
    """A plain QTreeView showing what `view` shows: its model, delegate, columns, expanded
    groups, current row and size."""
    stock = QTreeView()
    stock.setModel(view.model())
    stock.setItemDelegate(view.itemDelegate())
    for setting in ("alternatingRowColors", "uniformRowHeights", "selectionBehavior",
                    "selectionMode", "indentation", "rootIsDecorated"):
        getter = getattr(view, setting)
        getattr(stock, "set" + setting[0].upper() + setting[1:])(getter())
    stock.header().restoreState(view.header().saveState())
    model = view.model()
    for g in range(model.rowCount()):
        stock.setExpanded(model.index(g, 0), view.isExpanded(model.index(g, 0)))
    stock.setCurrentIndex(view.currentIndex())
    stock.resize(view.size())
    return stock


@pytest.mark.parametrize("current, scrolled", [("tensor", 0), ("group", 0), ("tensor", 3)])
def test_the_grouped_tree_paints_as_the_stock_tree_does(qtbot, table, current, scrolled):
    """The tree's own paint of tensor and group rows gives the stock tree's pixels (with the
    same delegate's cells) in every left-aligned column, scrolled or not: alternating
    backgrounds by the row's place, branch indicators, the selected row and its focus frame,
    the indented names, the check's colour. Right-aligned columns differ in the anti-aliasing
    of a text the stock places at a fractional pixel, and the stock elides a group's bytes a
    few pixels early."""
    table.resize(1600, 400)
    table.set_grouping("layer")
    view, model = table.view, table.table_model
    header = view.header()
    qtbot.waitUntil(lambda: header.sectionViewportPosition(len(COLUMNS) - 1)
                    + header.sectionSize(len(COLUMNS) - 1) < view.width())
    view.collapse(model.index(0, 0))   # a closed group above an open one
    view.setCurrentIndex(model.index(2, 0, model.index(1, 0)) if current == "tensor"
                         else model.index(1, 0))
    view.setFocus()
    qtbot.waitUntil(lambda: view.hasFocus() or view.viewport().hasFocus())
    view.verticalScrollBar().setValue(scrolled)   # rows scrolled away above: 3 (odd, so the
    ours = view.viewport().grab().toImage()       # alternation is the rows' place, not y)
    stock_view = _stock_tree_like(view)
    qtbot.addWidget(stock_view)
    stock_view.show()
    stock_view.verticalScrollBar().setValue(scrolled)
    stock_view.setFocus()
    qtbot.waitUntil(lambda: stock_view.hasFocus() or stock_view.viewport().hasFocus())
    stock = stock_view.viewport().grab().toImage()
    assert stock.size() == ours.size()
    tensor = model.index(0, 0, model.index(1, 0))
    left_aligned = [(header.sectionViewportPosition(c),
                     header.sectionViewportPosition(c) + header.sectionSize(c))
                    for c in range(len(COLUMNS))
                    if tensor.siblingAtColumn(c).data(Qt.ItemDataRole.TextAlignmentRole) is None]
    assert len(left_aligned) == 5
    differing = [(x, y) for left, right in left_aligned for x in range(left, right)
                 for y in range(ours.height()) if ours.pixel(x, y) != stock.pixel(x, y)]
    assert differing == []


def test_grouping_many_rows_expands_only_the_groups_that_were(qtbot, tiny_model_path):
    """Past EXPAND_ALL_ROWS rows the groups start collapsed (the tree lays out every row of an
    expanded group); a group the user expanded stays expanded through a sort."""
    rows = rows_for(Model.open(tiny_model_path("qwen2_moe")))
    many = [replace(r, name=f"{r.name}.{i}") for i in range(EXPAND_ALL_ROWS // len(rows) + 1)
            for r in rows]
    table = QtTensorTable()
    qtbot.addWidget(table)
    table.set_rows(many)
    table.set_grouping("layer")
    model, view = table.table_model, table.view
    assert model.shown_count() > EXPAND_ALL_ROWS
    assert not any(view.isExpanded(model.index(g, 0)) for g in range(model.rowCount()))
    view.expand(model.index(1, 0))
    label = model.group_labels()[1]
    view.sortByColumn(COLUMNS.index("bytes"), Qt.SortOrder.DescendingOrder)
    expanded = [lab for g, lab in enumerate(model.group_labels())
                if view.isExpanded(model.index(g, 0))]
    assert expanded == [label]


@pytest.mark.parametrize("grouping", ["none", "layer"])
def test_the_selected_row_stays_selected_through_a_sort(table, grouping):
    table.set_grouping(grouping)
    assert table.select_tensor("layers.1.attn_k")
    table.view.sortByColumn(COLUMNS.index("bytes"), Qt.SortOrder.DescendingOrder)
    assert table.selected_row().name == "layers.1.attn_k"
    index = table.view.currentIndex()
    assert table.view.selectionModel().isRowSelected(index.row(), index.parent())


def test_column_widths_survive_a_change_of_grouping(table):
    """Only the view shown holds the model; a width the user gave a column stays when the
    grouping goes and comes back."""
    table.header().resizeSection(COLUMNS.index("dtype"), 123)
    table.set_grouping("layer")
    assert table.view.model() is table.table_model
    table.set_grouping("none")
    assert table.header().sectionSize(COLUMNS.index("dtype")) == 123


def test_export_csv_writes_the_shown_rows(table, tmp_path):
    table.set_filter("attn_q")
    table.set_check_status({"layers.0.attn_q": "ok"})
    path = tmp_path / "shown.csv"
    assert table.export_csv(path) == len(table.visible_rows())
    with open(path, newline="") as handle:
        records = list(csv.DictReader(handle))
    assert {r["name"] for r in records} == {r.label for r in table.visible_rows()}
    assert next(r for r in records if r["name"] == "layers.0.attn_q")["check"] == "ok"


def test_set_model_none_empties_the_table(table):
    table.set_model(None)
    assert table.table_model.rowCount(QModelIndex()) == 0
