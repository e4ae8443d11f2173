"""Expert caching in the Qt debugger: the run form's threshold and expert cache reach the
session, a 'cache kept' breakpoint from the form stops the run, and the event list, token view,
routing map and status show what the engine recorded."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from colibri.debugging import Debugger  # noqa: E402
from colibri.debugging.stats import cache_summary  # noqa: E402
from colibri.engine import Model  # noqa: E402
from colibri.inspector.debugger import QtDebuggerPanel  # noqa: E402
from colibri.inspector.debugger.views import AnatomyTableModel, EventTableModel  # noqa: E402

from dbg_helpers import PROMPT  # noqa: E402

WAIT_MS = 20000


@pytest.fixture
def panel(moe3_model: Model, debugger_panel) -> QtDebuggerPanel:
    return debugger_panel(moe3_model)


def test_the_form_needs_a_threshold_for_cached_routing(qtbot, panel: QtDebuggerPanel) -> None:
    form = panel.run_panel
    form.prompt.setText(" ".join(map(str, PROMPT)))
    assert not form.cache_threshold.isEnabled()
    form.routing.setCurrentText("cached")
    assert form.cache_threshold.isEnabled()
    with pytest.raises(ValueError, match="cached routing needs a cache threshold"):
        form.settings()
    form.buttons["run"].click()
    assert "cannot run: cached routing needs a cache threshold" in form.status.text()
    form.cache_threshold.setText("abc")
    with pytest.raises(ValueError, match="cache threshold 'abc' is not a number"):
        form.settings()
    assert form.expert_cache.maximum() == 8


def test_a_cached_run_from_the_form_and_what_the_views_show(qtbot,
                                                            panel: QtDebuggerPanel) -> None:
    form = panel.run_panel
    form.prompt.setText(" ".join(map(str, PROMPT)))
    form.max_new.setValue(8)
    form.routing.setCurrentText("cached")
    form.cache_threshold.setText("0.5")
    form.expert_cache.setValue(3)
    breakpoints = panel.breakpoint_view
    breakpoints.kind.setCurrentText("cache kept")
    breakpoints.add_from_form()
    assert breakpoints.list.item(0).text() == \
        "cached routing kept the previous experts at any MoE layer"
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        form.buttons["run"].click()
    snap = blocker.args[0]
    assert snap.settings.cache_threshold == 0.5 and snap.settings.expert_cache == 3
    headless = Debugger(panel.model, snap.settings)
    headless.run()
    first = next(e for e in headless.events if e.cache_kept)
    assert snap.result.reason == "breakpoint" and snap.result.event.index == first.index
    qtbot.waitUntil(lambda: panel.token_view.event is not None
                    and panel.token_view.event.index == first.index)
    details = panel.token_view.details.text()
    assert (f"cached routing: kept the previous position's experts {sorted(first.expert_ids)} "
            f"over the new top-k {list(first.fresh_ids)}") in details
    assert "expert cache: hits " in details
    table = panel.token_view.anatomy_model
    columns = AnatomyTableModel.COLUMNS
    assert not panel.token_view.table.isColumnHidden(columns.index("top-k"))
    assert not panel.token_view.table.isColumnHidden(columns.index("cache"))
    assert [table.text(e, "top-k") for e in first.fresh_ids] == ["1", "2"]
    assert {table.text(e, "cache") for e in first.expert_ids} <= {"hit", "miss"}
    events = panel.event_list.model
    cell = events.data(events.index(first.index, EventTableModel.COLUMNS.index("cache")))
    assert cell.startswith("kept ") and cell.endswith(" hit")
    # the hit rate so far, in the run panel's status and the routing map
    summary = cache_summary(snap.record).describe()
    assert summary.startswith("expert cache: ") and summary in form.status.text()
    panel.tabs.setCurrentWidget(panel.routing_map)
    panel._repaint()
    assert f"run: {summary}" in panel.routing_map.balance.text()
    headless.close()
