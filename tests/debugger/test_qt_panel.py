"""The Qt debugger: worker thread results equal a headless run, pause/resume through the UI,
the event loop stays live during a run, and the composite panel's navigation and files work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from colibri.debugging import AtPosition, Debugger, RunSettings  # noqa: E402
from colibri.debugging.trace_export import check_trace_events  # noqa: E402
from colibri.engine import Model  # noqa: E402
from colibri.interventions import Intervention  # noqa: E402
from colibri.inspector.debugger import DebuggerController, QtDebuggerPanel  # noqa: E402
from colibri.inspector.debugger.views import EventTableModel  # noqa: E402

from dbg_helpers import PROMPT  # noqa: E402
from ui_probe import GapProbe, assert_never_blocked  # noqa: E402

import numpy as np  # noqa: E402

WAIT_MS = 20000


def _headless(model: Model, settings: RunSettings) -> Debugger:
    dbg = Debugger(model, settings)
    dbg.run()
    return dbg


@pytest.fixture
def controller(qtbot):
    c = DebuggerController()
    yield c
    c.shutdown()


@pytest.fixture
def panel(model: Model, debugger_panel) -> QtDebuggerPanel:
    """A debugger panel on the test model, shut down after the test."""
    return debugger_panel(model)


def test_worker_run_equals_headless_run(qtbot, controller: DebuggerController,
                                        model: Model) -> None:
    settings = RunSettings(PROMPT, 8, decoding="sample", seed=11)
    with qtbot.waitSignal(controller.sig_started, timeout=WAIT_MS):
        controller.start(model, settings)
    with qtbot.waitSignal(controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        controller.run()
    snap = blocker.args[0]
    assert snap.result.reason == "finished" and snap.finished
    ref = _headless(model, settings)
    assert snap.record.equals(ref.record, timings=False)
    assert list(snap.generated) == ref.generated


def _paused_and_resumed_run(model: Model, qtbot) -> GapProbe:
    """Run 12 positions in slow motion (about 0.3 s), pausing at the first live update and
    resuming; the run must end equal to a headless one. Returns the UI thread's GapProbe."""
    c = DebuggerController(step_delay_s=0.02)
    try:
        settings = RunSettings(PROMPT, 12)
        with qtbot.waitSignal(c.sig_started, timeout=WAIT_MS):
            c.start(model, settings)
        probe = GapProbe()
        probe.start()
        # pause as soon as the first live update arrives
        c.sig_position_done.connect(lambda _s: c.pause())
        with qtbot.waitSignal(c.sig_run_finished, timeout=WAIT_MS) as blocker:
            c.run()
        assert blocker.args[0].result.reason == "paused"
        paused_at = blocker.args[0].record.n_positions
        assert 0 < paused_at < settings.n_positions
        c.sig_position_done.disconnect()
        with qtbot.waitSignal(c.sig_run_finished, timeout=WAIT_MS) as blocker:
            c.run()
        probe.stop()
        snap = blocker.args[0]
        assert snap.result.reason == "finished"
        assert snap.record.equals(_headless(model, settings).record, timings=False)
        return probe
    finally:
        c.shutdown()


def test_ui_stays_live_and_pause_resume_is_exact(qtbot, model: Model) -> None:
    probe = _paused_and_resumed_run(model, qtbot)
    assert probe.ticks > 10
    assert_never_blocked(probe, lambda: _paused_and_resumed_run(model, qtbot))


def test_stop_a_paused_run_keeps_everything(qtbot, controller: DebuggerController,
                                            model: Model) -> None:
    with qtbot.waitSignal(controller.sig_started, timeout=WAIT_MS):
        controller.start(model, RunSettings(PROMPT, 12))
    with qtbot.waitSignal(controller.sig_run_finished, timeout=WAIT_MS):
        controller.run(max_positions=4)
    with qtbot.waitSignal(controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        controller.stop()
    snap = blocker.args[0]
    assert snap.result.reason == "stopped" and snap.record.n_positions == 4
    assert snap.stop_reason == "stopped"


def test_the_routing_maps_text_grows_with_a_run_as_a_fresh_one_shows_it(qtbot,
                                                                         model: Model) -> None:
    """A live run's updates append their positions to the tokens coloured by expert; the text
    is the one a view shown the whole run at once has, and an edit that changes earlier
    positions rebuilds it."""
    from colibri.inspector.debugger.views import QtRoutingHeatmap

    dbg = Debugger(model, RunSettings(PROMPT, 12))
    live, fresh = QtRoutingHeatmap(), QtRoutingHeatmap()
    qtbot.addWidget(live)
    qtbot.addWidget(fresh)
    while not dbg.finished:
        dbg.run(max_positions=3)
        live.set_events(dbg.events.snapshot(), None)
    fresh.set_events(dbg.events.snapshot(), None)
    assert live.text.toPlainText() == fresh.text.toPlainText()
    assert len(live.text.toPlainText().split(" ")) == dbg.position
    revision = live.text.document().revision()
    live.set_events(dbg.events.snapshot(), None)   # nothing new: nothing laid out again
    assert live.text.document().revision() == revision
    first = int(dbg.record.expert_ids[2, 0, 0])
    dbg.set_interventions([Intervention.parse(f"forbid:pos=2,layer={int(dbg.record.moe_layers[0])},"
                                              f"experts={first}")])
    live.set_events(dbg.events.snapshot(), None)
    rebuilt = QtRoutingHeatmap()
    qtbot.addWidget(rebuilt)
    rebuilt.set_events(dbg.events.snapshot(), None)
    assert live.text.toHtml() == rebuilt.text.toHtml()
    dbg.close()


def test_event_table_model(qtmodeltester, model: Model) -> None:
    dbg = _headless(model, RunSettings(PROMPT, 4))
    table = EventTableModel()
    table.set_events(dbg.events, 3)
    qtmodeltester.check(table)
    assert table.rowCount() == len(dbg.events)
    assert table.data(table.index(3, 2)) == dbg.events[3].token_text


def test_panel_end_to_end(qtbot, panel: QtDebuggerPanel, tmp_path: Path) -> None:
    panel.run_panel.prompt.setText("the cat sat on")
    assert "'cat':4" in panel.run_panel.pieces.text()
    panel.run_panel.max_new.setValue(6)
    panel.breakpoint_view.add(AtPosition(3))
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        panel.run_panel.buttons["run"].click()
    snap = blocker.args[0]
    assert snap.result.reason == "breakpoint" and snap.result.event.key == (3, 0)
    qtbot.waitUntil(lambda: panel.event_list.model.rowCount() == len(snap.events))
    assert panel.event_list.model.cursor == snap.cursor
    assert "position 3" in panel.token_view.title.text()
    # step layer: next MoE layer of the same position, nothing computed
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        panel.step_layer()
    assert blocker.args[0].events[blocker.args[0].cursor].key == (3, 1)
    assert blocker.args[0].record.n_positions == 4
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        panel.continue_run()
    final = blocker.args[0]
    assert final.result.reason == "finished"
    qtbot.waitUntil(lambda: panel.event_list.model.rowCount() == len(final.events))
    # views
    panel.tabs.setCurrentWidget(panel.routing_map)
    panel._repaint()
    assert panel.routing_map.layer_box.count() == final.record.n_moe_layers
    assert "load balance" in panel.routing_map.balance.text()
    panel.tabs.setCurrentWidget(panel.latency)
    panel._repaint()
    summary = panel.latency.summary.text()
    assert "prompt, 4 positions:" in summary and "generated positions" in summary
    assert panel.latency.prompt_end.isVisible() and panel.latency.prompt_end.value() == 3.5
    # navigation
    panel.find_box.setText("sat")
    panel.selected = None
    panel.find_next()
    assert panel.events[panel.selected].token_text == "sat"
    panel.toggle_bookmark()
    marked = panel.selected
    panel.select_event(0)
    panel.next_bookmark()
    assert panel.selected == marked
    panel.select_event(0)
    panel.next_change()
    assert panel.events[panel.selected].routing_changed
    # files
    qtbot.waitUntil(lambda: not panel.controller.running)
    session = tmp_path / "s.colibri-session"
    panel.save_session(str(session))
    trace, table = tmp_path / "t.json", tmp_path / "r.csv"
    panel.export_trace(str(trace))
    panel.export_csv(str(table))
    assert check_trace_events(json.loads(trace.read_text())) == []
    assert table.read_text().startswith("position,token")
    saved = panel.open_session(str(session))
    assert saved.record.equals(final.record)
    assert saved.bookmarks == [marked]
    assert panel.event_list.model.rowCount() == len(final.events)


def test_the_save_and_export_dialogs_write_where_the_user_chose(
        qtbot, panel: QtDebuggerPanel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Save session, Export trace and Export CSV ask for a path and write there; a cancelled
    dialog writes nothing."""
    from colibri.inspector import export

    panel.run_panel.prompt.setText("the cat sat on")
    panel.run_panel.max_new.setValue(2)
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS):
        panel.run_panel.buttons["run"].click()
    qtbot.waitUntil(lambda: not panel.controller.running)
    chosen: list[str] = []
    monkeypatch.setattr(export.QFileDialog, "getSaveFileName",
                        lambda *_args: (chosen.pop(0), ""))
    session, trace, table = (tmp_path / "s.colibri-session", tmp_path / "t.json",
                             tmp_path / "r.csv")
    chosen[:] = [str(session), str(trace), str(table), ""]
    panel.save_dialog()
    panel.export_trace_dialog()
    panel.export_csv_dialog()
    panel.export_csv_dialog()                              # cancelled
    assert panel.open_session(str(session)).record.equals(panel.snapshot.record)
    assert check_trace_events(json.loads(trace.read_text())) == []
    assert table.read_text().startswith("position,token")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "s.colibri-session", "t.json"]


def test_run_panel_kernel_choice_reaches_the_session(qtbot, panel: QtDebuggerPanel, tmp_path: Path) -> None:
    panel.run_panel.prompt.setText("the cat")
    panel.run_panel.max_new.setValue(2)
    panel.run_panel.kernels.setCurrentText("portable")
    assert panel.run_panel.settings().kernels == "portable"
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        panel.run_panel.buttons["run"].click()
    assert blocker.args[0].kernels == "portable"
    assert "(portable kernels)" in panel.run_panel.status.text()
    qtbot.waitUntil(lambda: not panel.controller.running)
    session = tmp_path / "k.colibri-session"
    panel.save_session(str(session))
    saved = panel.open_session(str(session))
    assert saved.kernels == "portable" and saved.settings.kernels == "portable"
    panel.run_panel.kernels.setCurrentText("best")
    assert panel.run_panel.settings().kernels is None


def test_opening_a_session_never_waits_for_the_models_checksum(
        qtbot, panel: QtDebuggerPanel, model: Model, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's checksum, which decides whether the session was recorded on the open file,
    is computed on a background thread: the session shows at once, its routing rules once the
    checksum matches."""
    import threading

    from colibri.debugging import session_file

    dbg = Debugger(model, RunSettings(PROMPT, 2))
    dbg.run()
    session = tmp_path / "s.colibri-session"
    session_file.save_session(session, dbg)   # with the model's checksum
    monkeypatch.setattr(session_file, "_checksums", {})
    monkeypatch.setattr(session_file, "_hashing", set())
    release = threading.Event()
    real_checksum = session_file.model_checksum

    def slow_checksum(path):  # type: ignore[no-untyped-def]
        release.wait(30)
        return real_checksum(path)

    monkeypatch.setattr(session_file, "model_checksum", slow_checksum)
    panel.open_session(str(session))
    assert "checking the model file's checksum" in panel.status.text()
    assert panel.token_view.rules is None
    release.set()
    qtbot.waitUntil(lambda: "checking" not in panel.status.text(), timeout=WAIT_MS)
    assert "different model file" not in panel.status.text()
    assert panel.token_view.rules is not None
    dbg.close()


@pytest.fixture
def v3_panel(v3_model: Model, debugger_panel) -> QtDebuggerPanel:
    return debugger_panel(v3_model)


def test_bias_changed_breakpoint_from_the_form_and_the_rule_in_the_token_view(
        qtbot, v3_panel: QtDebuggerPanel, v3_model: Model) -> None:
    """'bias changed' chosen in the breakpoint form stops the run at the first decision whose
    correction bias changed the choice; the token view flags it and lays the rule out expert by
    expert (logit, score, bias, selection score beside each other, the winners ranked)."""
    panel = v3_panel
    form = panel.breakpoint_view
    form.kind.setCurrentText("bias changed")
    form.add_from_form()
    assert form.list.item(0).text() == "the correction bias changed the choice at any MoE layer"
    panel.run_panel.prompt.setText(" ".join(map(str, PROMPT)))
    panel.run_panel.max_new.setValue(6)
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=WAIT_MS) as blocker:
        panel.run_panel.buttons["run"].click()
    snap = blocker.args[0]
    assert snap.result.reason == "breakpoint"
    headless = _headless(v3_model, snap.settings)
    first = next(e for e in headless.events if e.bias_changed)
    assert snap.result.event.index == first.index
    qtbot.waitUntil(lambda: panel.token_view.event is not None
                    and panel.token_view.event.index == first.index)
    view = panel.token_view
    assert not view.bias_flag.isHidden() and "correction bias changed" in view.bias_flag.text()
    assert view.rule.text().startswith("rule: sigmoid over 8 experts, + correction bias")
    table = view.anatomy_model
    assert table.rowCount() == 8
    a = view.anatomy
    for expert in range(8):
        row = {c: table.text(expert, c) for c in table.COLUMNS}
        assert float(row["logit"]) == a.logits[expert]
        assert float(row["selection"]) == a.selection[expert]
        assert np.float32(float(row["score"])) + np.float32(float(row["bias"])) == \
            a.selection[expert]
        assert row["rank"] == (str(first.expert_ids.index(expert) + 1)
                               if expert in first.expert_ids else "")
        assert row["group"].rstrip("*") == str(expert // 4)
    assert panel.token_view.plot.getPlotItem().getAxis("left").labelText == "selection score"
    # a decision the bias did not change hides the flag
    calm = next(e for e in headless.events if not e.bias_changed)
    assert calm.index < len(panel.events)
    panel.select_event(calm.index)
    qtbot.waitUntil(lambda: view.event is not None and view.event.index == calm.index)
    assert view.bias_flag.isHidden()


def test_anatomy_table_model(qtmodeltester, v3_model: Model) -> None:
    from colibri.debugging import RuleBook
    from colibri.inspector.debugger.views import AnatomyTableModel
    dbg = _headless(v3_model, RunSettings(PROMPT, 2))
    table = AnatomyTableModel()
    table.set_anatomy(RuleBook(v3_model).of(dbg.events[0]))
    qtmodeltester.check(table)


def test_stepping_or_intervening_with_unreadable_settings_says_why_and_starts_nothing(
        qtbot, panel: QtDebuggerPanel) -> None:
    panel.run_panel.routing.setCurrentText("cached")
    panel.run_panel.cache_threshold.setText("abc")
    for act in (panel.step_token, lambda: panel.apply_interventions([])):
        panel.status.setText("")
        act()
        assert panel.status.text() == "cannot start: cache threshold 'abc' is not a number"
        assert panel.controller.worker.debugger is None
