"""Interventions in the Qt debugger: applied on the worker (the UI stays free), the counterfactual
in its tab equal to a headless one, a run paused between layers edited before the next layer runs,
a refused spec's message where it was typed, and a breakpoint that forbids and goes on."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from colibri.debugging import Debugger, ExpertChosen, RunSettings  # noqa: E402
from colibri.engine import Model  # noqa: E402
from colibri.inspector.debugger import QtDebuggerPanel  # noqa: E402
from colibri.inspector.debugger.views import EventTableModel  # noqa: E402
from colibri.interventions import Intervention  # noqa: E402

from dbg_helpers import PROMPT  # noqa: E402

WAIT_MS = 20000
SPEC = "force:pos=3,layer=2,experts=5+6"


@pytest.fixture
def panel(model: Model, debugger_panel) -> QtDebuggerPanel:
    p = debugger_panel(model)
    p.run_panel.prompt.setText(",".join(map(str, PROMPT)))
    p.run_panel.max_new.setValue(5)
    return p


def finished_run(qtbot, panel: QtDebuggerPanel) -> None:
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS):
        panel.run_panel.buttons["run"].click()


def apply(qtbot, panel: QtDebuggerPanel, *specs: str):
    view = panel.intervention_view
    for spec in specs:
        view.spec.setText(spec)
        view.buttons["add"].click()
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        view.buttons["apply"].click()
    return blocker.args[0]


def test_apply_shows_the_counterfactual_of_a_headless_debugger(qtbot, panel, model) -> None:
    finished_run(qtbot, panel)
    snap = apply(qtbot, panel, SPEC)
    assert snap.interventions == (Intervention.parse(SPEC),)
    headless = Debugger(model, RunSettings(PROMPT, 5))
    headless.run()
    expected = headless.set_interventions([Intervention.parse(SPEC)])
    assert snap.counterfactual is not None and expected is not None
    assert snap.counterfactual.to_dict() == expected.to_dict()
    assert snap.record.equals(headless.record, timings=False)
    view = panel.counterfactual_view
    qtbot.waitUntil(lambda: view.model.rowCount() == expected.n_positions - 3)
    assert panel.tabs.currentWidget() is panel.intervention_tab
    assert view.model.text(0, "pos") == "3" and "2*" in view.model.text(0, "layers changed")
    assert "from position 3" in view.summary.text()
    # the event list marks the decision the intervention acted on
    panel._repaint()
    row = snap.events.index_of(3, 1)
    edit = EventTableModel.COLUMNS.index("edit")
    assert panel.event_list.model.data(panel.event_list.model.index(row, edit)) == "force"
    assert "runs under" not in panel.intervention_view.message.text()
    assert "applies 1 intervention" in panel.intervention_view.message.text()


def test_a_refused_spec_is_named_where_it_was_typed(qtbot, panel) -> None:
    finished_run(qtbot, panel)
    view = panel.intervention_view
    view.spec.setText("force:pos=3,layer=1,experts=5")
    view.buttons["add"].click()
    with qtbot.waitSignal(panel.controller.sig_failed, timeout=WAIT_MS):
        view.buttons["apply"].click()
    assert "layer: layer 1 is dense" in view.message.text()
    view.spec.setText("force:pos=x,experts=1")
    assert not view.add_spec()
    assert "pos: 'x' is not N, A-B or A-" in view.message.text()


def test_a_run_paused_between_layers_is_edited_before_the_next_layer(qtbot, panel, model) -> None:
    for _ in range(7):   # positions 0..2 (two MoE layers each), then layer 0 of position 3
        with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
            panel.step_layer()
    snap = blocker.args[0]
    assert snap.layers_done == 1 and snap.record.n_positions == 3
    assert [e.key for e in snap.pending] == [(3, 0)] and snap.cursor == snap.pending[0].index
    qtbot.waitUntil(lambda: panel.event_list.model.rowCount() == 7)
    assert "paused after layer 0 of position 3" in panel.run_panel.status.text()
    apply(qtbot, panel, SPEC)
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        panel.step_layer()
    snap = blocker.args[0]
    event = snap.event(snap.cursor)
    assert event.key == (3, 1) and event.expert_ids == (5, 6)
    qtbot.waitUntil(lambda: "position 3" in panel.token_view.title.text()
                    and "layer 2" in panel.token_view.title.text())
    assert "made under intervention: force" in panel.token_view.details.text()


def test_a_forbid_breakpoint_from_the_form(qtbot, panel) -> None:
    bps = panel.breakpoint_view
    bps.kind.setCurrentIndex(0)
    bps.expert.setValue(1)
    bps.layer.setValue(2)
    bps.add_button.menu().actions()[1].trigger()
    assert bps.breakpoints[0] == ExpertChosen(1, 2, action="forbid")
    assert "then forbid it and continue" in bps.list.item(0).text()
    finished_run(qtbot, panel)
    snap = panel.snapshot
    assert snap.finished and not (snap.record.expert_ids[:, 1] == 1).any()
    assert all(i.kind == "forbid" for i in snap.interventions)


def test_the_table_models_pass_qt_model_checks(qtmodeltester, model: Model) -> None:
    from colibri.inspector.debugger.interventions_view import CounterfactualTableModel
    from colibri.inspector.debugger.views import EventTableModel

    dbg = Debugger(model, RunSettings(PROMPT, 5))
    dbg.run()
    cf = dbg.set_interventions([Intervention.parse(SPEC)])
    table = CounterfactualTableModel()
    table.set_counterfactual(cf, str)
    qtmodeltester.check(table)
    assert table.rowCount() == cf.n_positions - 3 and table.text(0, "pos") == "3"
    paused = Debugger(model, RunSettings(PROMPT, 5))
    while paused.step_layer().key != (2, 0):
        pass
    events = EventTableModel()
    events.set_events(paused.events, paused.cursor, tuple(paused.pending_events()))
    qtmodeltester.check(events)
    assert events.rowCount() == len(paused.events) + 1


def test_apply_to_run_changes_the_routing_and_shows_its_counterfactual(qtbot, panel, model
                                                                       ) -> None:
    """The run panel's routing and epsilon applied to the run on view: recomputed on the worker
    from the first changed decision, the counterfactual in its tab equal to a headless one."""
    finished_run(qtbot, panel)
    rp = panel.run_panel
    rp.routing.setCurrentText("gumbel")
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        rp.apply_routing.click()
    snap = blocker.args[0]
    assert snap.settings.routing == "gumbel"
    headless = Debugger(model, RunSettings(PROMPT, 5))
    headless.run()
    expected = headless.set_routing("gumbel")
    assert snap.counterfactual is not None and expected is not None
    assert snap.counterfactual.to_dict() == expected.to_dict()
    assert snap.record.equals(headless.record, timings=False)
    assert panel.tabs.currentWidget() is panel.intervention_tab
    assert "routing now gumbel; counterfactual from position" in panel.status.text()


def test_a_refused_routing_is_said_and_changes_nothing(qtbot, panel) -> None:
    finished_run(qtbot, panel)
    rp = panel.run_panel
    rp.routing.setCurrentText("soft")
    with qtbot.waitSignal(panel.controller.sig_failed, timeout=WAIT_MS):
        rp.apply_routing.click()
    assert "routing changes only among" in panel.status.text()
    assert panel.controller.worker.debugger.settings.routing == "topk"
    rp.epsilon.setText("abc")
    rp.routing.setCurrentText("stable")
    rp.apply_routing.click()
    assert "epsilon 'abc' is not a number" in rp.status.text()
