"""The application shell: opening files (command line, drag and drop, recent files that survive
a restart), tabs, closing, shortcuts, status bar, reload when the file changes on disk, the demo
fallback, the Qt-free layering and the resource registry."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QKeySequence

from colibri.inspection.document import ModelDocument, load_state
from colibri.inspection.recent import RecentFiles
from colibri.inspector import app as inspector_app
from colibri.inspector import main_window, resources
from colibri.inspector.main_window import VIEW_NAMES, MainWindow
from corrupt_files import corrupt_cases

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("inspector_settings")


def _copy(path: Path, directory: Path, name: str = "model.colibri") -> Path:
    target = directory / name
    shutil.copyfile(path, target)
    return target


# -- opening --------------------------------------------------------------------------------------


def test_command_line_files_open_in_tabs(qtbot, tiny_model_path):
    w = inspector_app.build_window([str(tiny_model_path()), str(tiny_model_path("olmoe"))])
    qtbot.addWidget(w)
    assert [v.path for v in w.views()] == [str(tiny_model_path()), str(tiny_model_path("olmoe"))]


def test_opening_an_open_file_switches_to_its_tab(window, tiny_model_path):
    first = window.open_path(tiny_model_path())
    window.open_path(tiny_model_path("olmoe"))
    assert window.open_path(tiny_model_path()) is first
    assert window.files.count() == 2 and window.current_view() is first


def test_dropped_files_open(window, tiny_model_path):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(tiny_model_path()))])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)
    assert [v.path for v in window.views()] == [str(tiny_model_path())]


def test_missing_file_opens_into_report_without_crashing(window, tmp_path):
    view = window.open_path(tmp_path / "nowhere.colibri")
    assert view.doc.status == "unreadable"
    assert "cannot be read" in view.validation.explanation.text()


def test_no_argument_without_demo_shows_empty_state(qtbot, monkeypatch):
    monkeypatch.setattr(resources, "demo_model_path", lambda: None)
    w = inspector_app.build_window([])
    qtbot.addWidget(w)
    assert w.files.count() == 0 and w.stack.currentWidget() is w.empty
    assert "demo model" in w.empty.text()


def test_no_argument_opens_the_demo_model(qtbot, monkeypatch, tiny_model_path):
    monkeypatch.setattr(resources, "demo_model_path", lambda: Path(tiny_model_path()))
    w = inspector_app.build_window([])
    qtbot.addWidget(w)
    assert [v.path for v in w.views()] == [str(tiny_model_path())]


# -- recent files and persistence -----------------------------------------------------------------


def test_recent_files_survive_a_restart(qtbot, tiny_model_path):
    w = MainWindow()
    qtbot.addWidget(w)
    w.open_path(tiny_model_path())
    w.open_path(tiny_model_path("olmoe"))
    w.close()
    again = MainWindow()
    qtbot.addWidget(again)
    assert again.recent.paths == [str(tiny_model_path("olmoe")), str(tiny_model_path())]


def test_recent_menu_lists_existing_files(window, tiny_model_path):
    window.open_path(tiny_model_path())
    window._fill_recent_menu()
    texts = [a.text() for a in window.recent_menu.actions()]
    assert str(tiny_model_path()) in texts


def test_window_geometry_survives_a_restart(qtbot):
    w = MainWindow()
    qtbot.addWidget(w)
    w.resize(701, 455)
    w.close()
    again = MainWindow()
    qtbot.addWidget(again)
    assert (again.width(), again.height()) == (701, 455)


def test_recent_list_is_most_recent_first_and_bounded(tmp_path):
    recent = RecentFiles(limit=3)
    for name in "abcdb":
        recent.add(tmp_path / name)
    assert recent.paths == [str(tmp_path / n) for n in "bdc"]


def test_recent_list_ignores_junk_from_settings():
    assert RecentFiles([None, 3, "", "/x/model.colibri"]).paths == ["/x/model.colibri"]


# -- closing, shortcuts, status bar ---------------------------------------------------------------


def test_close_removes_the_tab_and_shows_the_empty_state(window, tiny_model_path):
    window.open_path(tiny_model_path())
    window.close_action.trigger()
    assert window.files.count() == 0 and window.stack.currentWidget() is window.empty


def test_shortcuts_are_the_desktop_conventions(window):
    assert window.open_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Open)
    assert window.find_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Find)
    assert window.close_action.shortcut() == QKeySequence("Ctrl+W")
    assert window.goto_action.shortcut() == QKeySequence("Ctrl+G")
    assert window.run_action.shortcut() == QKeySequence("F5")
    assert window.cancel_action.shortcut() == QKeySequence("Esc")
    assert [window.view_actions[n].shortcut().toString() for n in VIEW_NAMES] == [
        f"Ctrl+{i}" for i in range(1, len(VIEW_NAMES) + 1)]


def test_routing_decision_jumps_to_router_weights(window, tiny_model_path, qtbot):
    view = window.open_path(tiny_model_path())
    window.view_actions["debugger"].trigger()
    view.debugger.sig_show_router_weights.emit(1)
    assert view.current_view() == "values"
    assert view.tensors.selected_row().name == "layers.1.moe_gate"
    qtbot.waitUntil(lambda: not view.values.is_busy(), timeout=20000)


def test_jitter_lab_view_gets_the_model(window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    window.view_actions["jitter"].trigger()
    assert view.tabs.currentWidget() is view._jitter_page
    assert view.jitter.path == view.doc.model.path


def test_debugger_view_takes_over_its_shortcuts(window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    window.view_actions["debugger"].trigger()
    assert view.tabs.currentWidget() is view._debugger_page
    assert view.debugger.model is view.doc.model
    assert not window.reload_action.isEnabled() and not window.run_action.isEnabled()
    window.view_actions["header"].trigger()
    assert window.reload_action.isEnabled() and window.run_action.isEnabled()


def test_view_shortcuts_switch_views(window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    window.view_actions["header"].trigger()
    assert view.tabs.currentWidget() is view.header
    window.view_actions["tensors"].trigger()
    assert view.tabs.currentWidget() is view.tensors and view.current_view() == "tensors"


def test_find_focuses_the_tensor_filter(qtbot, window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    window.activateWindow()
    window.find_action.trigger()
    assert view.tabs.currentWidget() is view.tensors
    qtbot.waitUntil(lambda: view.tensors.filter_edit.hasFocus(), timeout=2000)


def test_status_bar_shows_size_and_validation_state(window, tiny_model_path, monkeypatch):
    monkeypatch.setattr(main_window, "AUTO_CHECK_BYTES", 0)   # as for a file above the limit
    window.open_path(tiny_model_path())
    size = Path(tiny_model_path()).stat().st_size
    assert window.size_label.text() == f"{size / 1024:.2f} KiB"
    assert window.state_label.text() == "structure valid, data not checked"


def test_a_small_file_checks_its_data_when_it_opens(qtbot, window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    qtbot.waitUntil(lambda: view.data_result is not None and not view.is_checking(),
                    timeout=20000)
    assert window.state_label.text() == "valid (structure and data)"
    assert view.validation.explanation.property("state") == "valid"


@pytest.mark.parametrize("kind", ["colibri", "gguf"])
def test_the_validation_report_s_run_and_cancel_buttons_drive_the_data_checks(
        qtbot, window, tiny_model_path, monkeypatch, kind):
    """In a .colibri file's tab and in a foreign file's alike, Run in the validation report runs
    the data checks again and Cancel cancels them."""
    path = tiny_model_path() if kind == "colibri" else (
        REPO / "tests" / "fixtures" / "gguf" / "qwen2_moe-q4_0.gguf")
    view = window.open_path(path)
    qtbot.waitUntil(lambda: view.data_result is not None and not view.is_checking(),
                    timeout=20000)
    first = view.data_result
    view.validation.run_button.click()
    assert view.is_checking()
    qtbot.waitUntil(lambda: not view.is_checking(), timeout=20000)
    assert view.data_result is not first and view.data_result.status == first.status
    cancel, cancelled = view.checks.cancel, []
    monkeypatch.setattr(view.checks, "cancel", lambda: cancelled.append(True) or cancel())
    view.validation.run_button.click()
    before = len(cancelled)                      # (starting may cancel what ran before)
    view.validation.cancel_button.click()        # enabled while the checks run
    assert len(cancelled) == before + 1
    qtbot.waitUntil(lambda: not view.is_checking(), timeout=20000)
    view.shutdown()


def test_status_bar_shows_progress_while_checking(qtbot, window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    view.run_checks()
    assert window.state_label.text() == "checking data…"
    assert not window.progress.isHidden() and not window.cancel_button.isHidden()
    qtbot.waitUntil(lambda: not view.is_checking(), timeout=10000)
    assert window.state_label.text() == "valid (structure and data)"
    assert window.progress.isHidden()


def test_export_csv_of_the_problem_table(window, tiny_image, tmp_path):
    case = next(c for c in corrupt_cases(tiny_image()) if c.name == "overlap")
    view = window.open_path(case.write(tmp_path))
    out = tmp_path / "problems.csv"
    view.export_csv(str(out))
    lines = out.read_text().splitlines()
    assert lines[0] == "severity,code,message,offset,tensor"
    assert "COL_ERR_OVERLAP" in lines[1]


def test_export_png_of_the_current_view(window, tiny_model_path, tmp_path):
    view = window.open_path(tiny_model_path())
    view.set_view("header")
    out = tmp_path / "header.png"
    view.export_png(str(out))
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_the_export_menu_offers_a_name_after_the_file_and_view_and_writes_there(
        window, tiny_model_path, tmp_path, monkeypatch):
    """File > Export View as PNG asks where, offering `<file stem>-<view>.png`; a path it cannot
    write is a warning, not an exception into the event loop."""
    from colibri.inspector import export

    view = window.open_path(tiny_model_path())
    view.set_view("header")
    asked: list[str] = []
    out = tmp_path / "chosen.png"

    def choose(_parent, _title, name, _pattern):
        asked.append(name)
        return str(out), ""

    monkeypatch.setattr(export.QFileDialog, "getSaveFileName", choose)
    window.export_png_action.trigger()
    assert asked == [f"{Path(view.path).stem}-header.png"]
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert window.statusBar().currentMessage() == f"Wrote {out}"

    warned: list[str] = []
    monkeypatch.setattr(main_window.QMessageBox, "warning",
                        lambda _parent, title, text: warned.append(text))
    out = tmp_path / "no such directory" / "chosen.png"
    window.export_png_action.trigger()
    assert len(warned) == 1 and warned[0].startswith(f"Could not write {out}")


# -- reload ---------------------------------------------------------------------------------------


def test_file_replaced_on_disk_is_reloaded(qtbot, window, tiny_model_path, tiny_image, tmp_path):
    path = _copy(Path(tiny_model_path()), tmp_path)
    view = window.open_path(path)
    assert view.doc.model is not None
    broken = next(c for c in corrupt_cases(tiny_image()) if c.name == "overlap")
    tmp = tmp_path / "incoming.tmp"
    tmp.write_bytes(broken.data)
    os.replace(tmp, path)
    # a replacement that does not open is announced, not swapped in silently
    qtbot.waitUntil(lambda: view.changed_banner.isVisibleTo(view), timeout=10000)
    assert view.doc.generation == 0
    view.reopen()
    assert view.doc.generation == 1
    assert "COL_ERR_OVERLAP" in [p.code_name for p in view.validation.problems]


def test_reload_keeps_the_old_model_until_the_new_one_validated(tiny_model_path, tiny_image,
                                                                tmp_path):
    path = _copy(Path(tiny_model_path()), tmp_path)
    doc = ModelDocument(path)
    old = doc.model
    old_bytes = bytes(old.bytes()[:64])
    state_before = doc.state
    tmp = tmp_path / "incoming.tmp"
    tmp.write_bytes(next(c for c in corrupt_cases(tiny_image()) if c.name == "misaligned").data)
    os.replace(tmp, path)
    new_state = load_state(path)       # what the worker does first
    assert doc.state is state_before   # nothing swapped yet
    assert bytes(old.bytes()[:64]) == old_bytes
    doc.adopt(new_state)
    assert doc.model is None and doc.generation == 1
    assert bytes(old.bytes()[:64]) == old_bytes  # views of the old mapping stay valid


def test_reload_if_changed_ignores_an_unchanged_file(tiny_model_path):
    doc = ModelDocument(tiny_model_path())
    assert doc.reload_if_changed() is False and doc.generation == 0


# -- layering and resources -----------------------------------------------------------------------


def test_inspection_models_import_without_qt():
    code = ("import sys, pkgutil, importlib\n"
            "sys.modules['PySide6'] = None\n"
            "sys.modules['pyqtgraph'] = None\n"
            "import colibri.inspection as pkg\n"
            "for m in pkgutil.iter_modules(pkg.__path__):\n"
            "    importlib.import_module('colibri.inspection.' + m.name)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_every_icon_used_exists():
    used: set[str] = set()
    for source in (REPO / "app" / "colibri" / "inspector").glob("*.py"):
        used |= set(re.findall(r"""icon\(\s*["']([\w-]+)["']""", source.read_text()))
        used |= set(re.findall(r"""_action\([^)]*?["']([\w-]+)["']\)""", source.read_text()))
    used -= {"Ctrl"}
    assert used, "no icon use found: the scan is broken"
    for name in used:
        resources.icon_path(name)


def test_unknown_icon_fails_loudly():
    with pytest.raises(KeyError, match="unknown icon"):
        resources.icon("no-such-icon")


def test_style_sheets_load_in_name_order():
    sheet = resources.style_sheet()
    assert sheet.index("Base look") < sheet.index("validation report")


def test_saved_session_carries_the_jitter_lab_results(window, tiny_model_path, tmp_path):
    from colibri.debugging import Debugger, RunSettings
    from colibri.debugging.session_file import SavedSession, save_session
    from colibri.jitter.analysis import Runner
    from colibri.jitter.passes import analyze_jitter

    path = tiny_model_path()
    view = window.open_path(path)
    with Runner.open(path) as runner:
        report = analyze_jitter(runner, [3, 4, 5, 6], "seq,noise1")
    view.jitter.set_reports(report, None)
    state = view.jitter.state()
    dbg = Debugger(view.doc.model, RunSettings([3, 4, 5], 2))
    dbg.run()
    session_path = tmp_path / "s.colibri-session"
    saved = SavedSession.from_debugger(dbg)
    saved.analyses = view._analyses()
    save_session(session_path, saved)

    other = window.open_path(tiny_model_path(dtype="f16"))
    other.debugger.open_session(str(session_path))
    assert other.jitter.state() == state


def test_a_truncated_file_keeps_the_old_view_and_offers_to_reopen(window, tiny_model_path,
                                                                  tmp_path, qtbot):
    path = tmp_path / "model.colibri"
    path.write_bytes(tiny_model_path().read_bytes())
    view = window.open_path(path)
    old_model = view.doc.model
    with open(path, "r+b") as f:      # a download cut short, in place
        f.truncate(path.stat().st_size // 2)
    view.reload_if_changed()
    qtbot.waitUntil(lambda: view.changed_banner.isVisibleTo(view), timeout=20000)
    assert view.doc.model is old_model                   # still showing the file as it was
    assert "no longer opens" in view.changed_text.text()
    view.reopen()
    assert view.doc.model is None
    assert any(p.code_name == "COL_ERR_TRUNCATED" for p in view.validation.problems)
    assert not view.changed_banner.isVisibleTo(view)


def test_a_valid_replacement_is_swapped_in(window, tiny_model_path, tmp_path, qtbot):
    path = tmp_path / "model.colibri"
    path.write_bytes(tiny_model_path().read_bytes())
    view = window.open_path(path)
    replacement = tmp_path / "new.colibri"
    replacement.write_bytes(tiny_model_path(dtype="f16").read_bytes())
    os.replace(replacement, path)   # an atomic replace, as converters do
    with qtbot.waitSignal(view.sig_reloaded, timeout=20000):
        view.reload_if_changed()
    assert view.doc.model.tensor_info("layers.0.moe_w1").dtype == "f16"
    assert not view.changed_banner.isVisibleTo(view)
