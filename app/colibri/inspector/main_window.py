"""The Inspector's main window: one tab per open file, menus, status bar, persistence.

`MainWindow` owns the application shell: opening files (File > Open, Open Recent, drag and drop,
the command line), closing them, the menus and shortcuts, the status bar (file size, validation
state, progress with cancel) and what survives a restart (window geometry and state, splitter
sizes, recent files) in QSettings "Colibri"/"Inspector" (or an INI file in the directory named
by $COLIBRI_INSPECTOR_SETTINGS, which tests use to stay isolated).

`FileView` is one open file: a `ModelDocument` shown by the validation report, header tree,
tensor table and tensor values (tabs on the left) beside the hexdump (right), wired together so
a click in one view shows the same bytes in the others. It runs every file-wide job (data
checks, reloads) on a `TaskRunner`, so the UI thread only ever does bounded work, and watches
its file: a change on disk (debounced) reloads it on a worker, and the new state replaces the
old one only once it is fully opened and validated.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import (QByteArray, QFileSystemWatcher, QSettings, QStandardPaths, Qt, QTimer,
                            Signal)
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QInputDialog, QLabel, QMainWindow,
                               QMessageBox, QProgressBar, QPushButton, QSizePolicy, QSplitter,
                               QStackedWidget, QTabWidget, QToolButton, QVBoxLayout, QWidget)

from colibri.inspection.document import (DataCheckResult, DocumentState, ModelDocument,
                                         data_check, explain, load_state, size_text,
                                         validation_phrase)
from colibri.debugging.session_file import SUFFIX as SESSION_SUFFIX
from colibri.errors import ColibriFileChangedError
from colibri.files import atomic_write_csv
from colibri.inspection.recent import RecentFiles
from colibri.inspection.stats import EngineTensors
from colibri.serving.client import parse_address
from colibri.inspector import resources
from colibri.inspection.foreign import is_foreign
from colibri.inspector.attach import QtServerMonitor, wait_for_retired
from colibri.inspector.data_checks import DataCheckTab, first_line
from colibri.inspector.export import save_png, save_with_dialog
from colibri.inspector.foreign_view import QtForeignFileView
from colibri.inspector.debugger.panel import QtDebuggerPanel
from colibri.inspector.header_view import QtHeaderView
from colibri.inspector.corpus import QtCorpusView
from colibri.inspector.jitter.lab import QtJitterLab
from colibri.inspector.hexview import QtHexView
from colibri.inspector.tasks import Task, TaskRunner
from colibri.inspector.tensor_table import QtTensorTable
from colibri.inspector.tensor_values import QtTensorValues, QtTensorValuesPage
from colibri.inspector.validation_view import QtValidationReport



ORGANIZATION, APPLICATION = "Colibri", "Inspector"
ENV_SETTINGS = "COLIBRI_INSPECTOR_SETTINGS"
VIEW_NAMES = ("validation", "header", "tensors", "hex", "values", "debugger", "jitter", "corpus")
VIEW_TITLES = {"validation": "Validation", "header": "Header", "tensors": "Tensors",
               "hex": "Hexdump", "values": "Tensor values", "debugger": "Debugger",
               "jitter": "Jitter lab", "corpus": "Corpus"}
# Window-wide shortcuts the debugger panel uses for itself while it is the current view.
DEBUGGER_SHORTCUT_ACTIONS = ("reload_action", "run_action", "find_action", "goto_action")
RELOAD_DEBOUNCE_MS = 400
# Files up to this size get their data checks (every tensor's CRC-32, NaN/Inf scan) started as
# soon as they open: about a second of reading on a worker, cancellable; larger files wait for
# F5 and say "data not checked" until then.
AUTO_CHECK_BYTES = 1 << 30
FILE_FILTER = ("Models (*.colibri *.gguf *.safetensors *.json);;Colibri models (*.colibri);;"
               "GGUF files (*.gguf);;safetensors (*.safetensors *.safetensors.index.json);;"
               "All files (*)")


def make_settings() -> QSettings:
    """The Inspector's settings: an INI file under $COLIBRI_INSPECTOR_SETTINGS when set (tests),
    else the platform's store for Colibri/Inspector."""
    directory = os.environ.get(ENV_SETTINGS)
    if directory:
        return QSettings(os.path.join(directory, "Inspector.ini"), QSettings.Format.IniFormat)
    return QSettings(ORGANIZATION, APPLICATION)


def autosave_path_for(model_path: str) -> str:
    """Where the debugger autosaves a run on `model_path`: the sessions directory beside the
    settings ($COLIBRI_INSPECTOR_SETTINGS in tests, the platform's app-data folder otherwise)."""
    base = os.environ.get(ENV_SETTINGS) or QStandardPaths.writableLocation(
        QStandardPaths.StandardLocation.AppDataLocation)
    directory = os.path.join(base, "sessions")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"{Path(model_path).stem}-autosave{SESSION_SUFFIX}")


# ---------------------------------------------------------------------------------------------
# One open file


class FileView(DataCheckTab, QWidget):
    """Every view of one `ModelDocument`, wired together (see the module docstring)."""

    sig_status_changed = Signal()
    sig_progress = Signal("qlonglong", "qlonglong", str)
    sig_view_changed = Signal(str)
    sig_running = Signal(bool)
    sig_reloaded = Signal(str)
    sig_file_broken = Signal(str)

    def __init__(self, doc: ModelDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.data_result: DataCheckResult | None = None
        self.last_error = ""
        self._current_view = "validation"

        self.validation = QtValidationReport()
        self.header = QtHeaderView()
        self.tensors = QtTensorTable()
        self._values_page = QtTensorValuesPage()
        # The debugger (engine worker thread, plots) is built on first use as well.
        self._debugger: QtDebuggerPanel | None = None
        self._debugger_page = QWidget()
        QVBoxLayout(self._debugger_page).setContentsMargins(0, 0, 0, 0)
        self._jitter: QtJitterLab | None = None
        self._jitter_page = QWidget()
        QVBoxLayout(self._jitter_page).setContentsMargins(0, 0, 0, 0)
        self._corpus: QtCorpusView | None = None
        self._corpus_page = QWidget()
        QVBoxLayout(self._corpus_page).setContentsMargins(0, 0, 0, 0)
        self.hex = QtHexView()

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        for name, widget in (("validation", self.validation), ("header", self.header),
                             ("tensors", self.tensors), ("values", self._values_page),
                             ("debugger", self._debugger_page), ("jitter", self._jitter_page),
                             ("corpus", self._corpus_page)):
            widget.setObjectName(f"view_{name}")
            self.tabs.addTab(widget, VIEW_TITLES[name])
        self.hex.setObjectName("view_hex")
        # Shown when the file changed on disk into something that does not validate: the old view
        # stays (its mapping is guarded by the engine) until the user chooses to reopen.
        self.changed_banner = QWidget()
        self.changed_banner.setObjectName("changedBanner")
        self.changed_text = QLabel()
        self.changed_text.setWordWrap(True)
        self.reopen_button = QPushButton("Reopen")
        self.dismiss_button = QPushButton("Keep the old view")
        banner = QHBoxLayout(self.changed_banner)
        banner.addWidget(self.changed_text, 1)
        banner.addWidget(self.reopen_button)
        banner.addWidget(self.dismiss_button)
        self.changed_banner.hide()
        self._pending_state: DocumentState | None = None
        self.reopen_button.clicked.connect(self.reopen)
        self.dismiss_button.clicked.connect(self.changed_banner.hide)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("fileSplitter")
        self.splitter.addWidget(self.tabs)
        self.splitter.addWidget(self.hex)
        # a wider window widens the views; the hexdump's rows are a fixed number of characters
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.changed_banner)
        layout.addWidget(self.splitter)

        # File-wide jobs: one runner for data checks, one for reloads (each cancels its own).
        self._connect_checks()
        self.reloader = TaskRunner(self)
        self.reloader.sig_finished.connect(self._reload_done)
        self.reloader.sig_failed.connect(self._checks_failed)

        self.validation.sig_problem_selected.connect(self.show_problem)
        self.header.sig_field_selected.connect(self.show_bytes)
        self.tensors.sig_tensor_selected.connect(self._tensor_selected)
        self.tensors.sig_range_selected.connect(self.show_bytes)
        self.tabs.currentChanged.connect(self._tab_changed)

        # Watch the file and its directory (an atomic replace removes the watched file).
        self.watcher = QFileSystemWatcher(self)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(RELOAD_DEBOUNCE_MS)
        self._debounce.timeout.connect(self.reload_if_changed)
        self.watcher.fileChanged.connect(lambda _p: self._debounce.start())
        self.watcher.directoryChanged.connect(lambda _p: self._debounce.start())
        self._watch()
        self._fit_hexdump()

        self._show_document()

    # -- document -------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self.doc.path

    def _watch(self) -> None:
        for path in (self.doc.path, os.path.dirname(self.doc.path)):
            if os.path.exists(path) and path not in self.watcher.files() + self.watcher.directories():
                self.watcher.addPath(path)

    def _show_document(self) -> None:
        doc = self.doc
        self.data_result = None
        self.validation.set_document(doc)
        self.header.set_document(doc)
        self.tensors.set_model(doc.model)
        self._values_page.set_store(EngineTensors(doc.model) if doc.model is not None else None)
        if self._debugger is not None:  # a running debug session finishes on the old mapping
            self._debugger.set_model(doc.model)
        if self._jitter is not None:
            self._jitter.set_model(doc.model)
        self.hex.set_source(doc.source())
        self.hex.set_regions(doc.regions())
        if doc.model is None:
            self.set_view("validation")
        elif doc.size <= AUTO_CHECK_BYTES:
            QTimer.singleShot(0, self._auto_check)   # once the window has wired its signals
        self.sig_status_changed.emit()

    def _auto_check(self) -> None:
        if self.doc.model is not None and self.data_result is None and not self._checking:
            self.run_checks(True, True)

    def reload_if_changed(self) -> None:
        """Debounced watcher callback: reload on a worker when the file's identity changed."""
        self._watch()
        if self.doc.changed_on_disk() and not self.reloader.is_running():
            self.reload()

    def reload(self) -> None:
        """Open and validate the file again on a worker; swap in the result when complete."""
        path = self.doc.path
        self.reloader.start(Task("reload", lambda _progress, _cancelled: load_state(path)))

    def _reload_done(self, state: DocumentState) -> None:
        """A replacement that opens is swapped in at once. One that does not (truncated, being
        written, corrupt) is not: the user is told why and offered to reopen into its report."""
        self._watch()
        if state.model is None and self.doc.model is not None:
            self._pending_state = state
            self.changed_text.setText(
                f"{self.doc.name} changed on disk and no longer opens: {explain(state)} "
                "The views still show the file as it was.")
            self.changed_banner.show()
            self.sig_file_broken.emit(self.doc.path)
            return
        self._adopt(state)

    def reopen(self) -> None:
        """Show the file as it is now (the pending broken state, or a fresh load)."""
        state, self._pending_state = self._pending_state, None
        if state is None:
            self.reload()
            return
        self._adopt(state)

    def _adopt(self, state: DocumentState) -> None:
        self.changed_banner.hide()
        self._pending_state = None
        self.cancel_checks()
        self.checks.wait()
        self.doc.adopt(state)
        self._show_document()
        self.sig_reloaded.emit(self.doc.path)

    # -- data checks ----------------------------------------------------------------------------

    def run_checks(self, checksums: bool = True, nan_check: bool = True) -> None:
        """Start the data checks (every tensor's CRC and/or NaN scan) on a worker."""
        if self.doc.model is None or not (checksums or nan_check):
            return
        fn = data_check(self.doc, checksums, nan_check)
        self.last_error = ""
        self._start_checks(fn)

    def _checks_running(self, running: bool) -> None:
        self.sig_running.emit(running)

    def _result_is_current(self, result: DataCheckResult) -> bool:
        return result.generation == self.doc.generation

    def _checks_failed(self, message: str) -> None:
        """Also for a failed reload; a file changed under the scan is offered for reopening."""
        self.last_error = first_line(message)
        super()._checks_failed(message)
        if message.startswith(ColibriFileChangedError.__name__) or self.doc.changed_on_disk():
            self.reload()   # the file moved under the scan: say so and offer to reopen

    def validation_state(self) -> str:
        """One phrase for the status bar."""
        return validation_phrase(self.doc.problems, self.doc.opened, self.data_result,
                                 self._checking)

    # -- cross-view navigation ------------------------------------------------------------------

    def show_bytes(self, offset: int, size: int = 1) -> None:
        self.hex.goto(int(offset), max(1, int(size)))

    def show_problem(self, offset: int, tensor: str) -> None:
        """A problem clicked: its tensor in the table, its bytes in the hexdump."""
        model = self.doc.model
        if tensor and model is not None and tensor in model:
            self.tensors.select_tensor(tensor)
        length = next((f.size for f in self.doc.header_fields
                       if f.present and f.offset <= offset < f.offset + f.size), 1)
        self.show_bytes(offset, length)

    def show_tensor(self, name: str) -> None:
        """Select tensor `name`: the table row, its data in the hexdump, its values."""
        model = self.doc.model
        if model is not None and name in model:
            self.tensors.select_tensor(name)

    def show_router_weights(self, layer: int) -> None:
        """From a routing decision to the router that made it: select `layers.L.moe_gate` in the
        table (its bytes in the hexdump) and show the layer's expert comparison, whose heatmap is
        the router's weight rows."""
        name = f"layers.{layer}.moe_gate"
        self.show_tensor(name)
        self.set_view("values")
        self.values.show_layer_experts(layer)

    def _tensor_selected(self, name: str) -> None:
        """The table's selection changed (its range goes to the hexdump by sig_range_selected):
        statistics of the tensor, or of the expert slice when the row is one expert."""
        model = self.doc.model
        if model is None or name not in model:
            return
        row = self.tensors.selected_row()
        expert = getattr(row, "expert", None) if row is not None and row.name == name else None
        self._values_page.show_tensor(name, expert,
                                      self.tabs.currentWidget() is self._values_page)

    @property
    def values(self) -> QtTensorValues:
        """The tensor values view, built on first use."""
        return self._values_page.view

    @property
    def debugger(self) -> QtDebuggerPanel:
        """The routing debugger for this file, built on first use. Its autosave file lives in the
        sessions directory, named after the model, so a crash loses nothing of a run."""
        if self._debugger is None:
            self._debugger = QtDebuggerPanel(autosave_path=autosave_path_for(self.doc.path))
            self._debugger.sig_show_router_weights.connect(self.show_router_weights)
            self._debugger.analysis_provider = self._analyses
            self._debugger.sig_analyses_loaded.connect(self._restore_analyses)
            self._debugger_page.layout().addWidget(self._debugger)
            if self.doc.model is not None:
                self._debugger.set_model(self.doc.model)
        return self._debugger

    def _analyses(self) -> dict[str, Any]:
        """What a saved debugging session carries besides the run: the jitter lab's results."""
        return {} if self._jitter is None else {"jitter_lab": self._jitter.state()}

    def _restore_analyses(self, analyses: dict[str, Any]) -> None:
        if "jitter_lab" in analyses:
            self.jitter.restore(analyses["jitter_lab"])

    @property
    def jitter(self) -> QtJitterLab:
        """The routing-jitter lab for this file, built on first use."""
        if self._jitter is None:
            self._jitter = QtJitterLab()
            self._jitter_page.layout().addWidget(self._jitter)
            if self.doc.model is not None:
                self._jitter.set_model(self.doc.model)
        return self._jitter

    @property
    def corpus(self) -> QtCorpusView:
        """The Corpus view (profiles made by `colibri profile`), built on first use."""
        if self._corpus is None:
            self._corpus = QtCorpusView()
            self._corpus_page.layout().addWidget(self._corpus)
        return self._corpus

    # -- views ----------------------------------------------------------------------------------

    def set_view(self, name: str) -> None:
        if name not in VIEW_NAMES:
            raise ValueError(f"unknown view {name!r}; expected one of {', '.join(VIEW_NAMES)}")
        self._current_view = name
        if name == "hex":
            if self.tabs.currentWidget() in (self._debugger_page, self._jitter_page,
                                             self._corpus_page):
                self.tabs.setCurrentWidget(self.validation)   # the hexdump sits beside the file views
                self._current_view = name
            self.hex.setVisible(True)
            sizes = self.splitter.sizes()
            if len(sizes) == 2 and sizes[1] == 0:
                self.splitter.setSizes([sum(sizes) // 2, sum(sizes) - sum(sizes) // 2])
            self.hex.setFocus()
            return
        widget = {"validation": self.validation, "header": self.header, "tensors": self.tensors,
                  "values": self._values_page, "debugger": self._debugger_page,
                  "jitter": self._jitter_page, "corpus": self._corpus_page}[name]
        self.tabs.setCurrentWidget(widget)

    def current_view(self) -> str:
        return self._current_view

    # Views that need the whole width: the hexdump is hidden while they are shown and comes
    # back at its previous width afterwards.
    WIDE_VIEWS = ("debugger", "jitter", "corpus")

    def _fit_hexdump(self) -> None:
        # hidden rather than collapsed: a hidden widget's minimum width does not count
        self.hex.setVisible(self._current_view not in self.WIDE_VIEWS)
        # A tab widget is as large as its largest page, shown or not: the debugger's minimum
        # width beside the hexdump would push the window past a 1280-pixel screen. A page's
        # minimum counts only while it is the current one (Ignored pages count as 0).
        current = self.tabs.currentWidget()
        for i in range(self.tabs.count()):
            page = self.tabs.widget(i)
            policy = QSizePolicy.Policy.Preferred if page is current else \
                QSizePolicy.Policy.Ignored
            page.setSizePolicy(policy, policy)

    def _tab_changed(self, _index: int) -> None:
        names = {self.validation: "validation", self.header: "header", self.tensors: "tensors",
                 self._values_page: "values", self._debugger_page: "debugger",
                 self._jitter_page: "jitter", self._corpus_page: "corpus"}
        self._current_view = names.get(self.tabs.currentWidget(), self._current_view)
        if self._current_view == "values":
            _ = self.values   # build it now that it is shown
        elif self._current_view == "debugger":
            _ = self.debugger
        elif self._current_view == "jitter":
            _ = self.jitter
        elif self._current_view == "corpus":
            _ = self.corpus
        self._fit_hexdump()
        self.sig_view_changed.emit(self._current_view)

    def export_csv(self, path: str) -> None:
        """The current view's table as CSV (validation, header, tensors)."""
        view = self._current_view
        if view == "tensors":
            self.tensors.export_csv(path)
            return
        if view == "validation":
            atomic_write_csv(path, ["severity", "code", "message", "offset", "tensor"],
                             ([p.severity, p.code_name, p.message, p.offset, p.tensor]
                              for p in self.validation.problems))
        elif view == "header":
            rows = []
            for fld in self.doc.header_fields:
                raw = self.doc.head[fld.offset:fld.offset + fld.size] if fld.present else b""
                value = fld.value.hex() if isinstance(fld.value, bytes) else fld.value
                rows.append([fld.group, fld.name, fld.offset, fld.size, fld.kind, raw.hex(),
                             "" if value is None else value])
            atomic_write_csv(path, ["group", "field", "offset", "size", "kind", "raw", "value"],
                             rows)
        else:
            raise ValueError(f"the {VIEW_TITLES[view]} view has no table to export")

    def export_png(self, path: str) -> None:
        """The current view as a PNG (the plot itself for the values view)."""
        if self._current_view == "values":
            self.values.export_png(path)
            return
        widget = self.hex if self._current_view == "hex" else self.tabs.currentWidget()
        save_png(widget, path)

    def shutdown(self) -> None:
        """Stop workers before the view goes away."""
        self._debounce.stop()
        if self._debugger is not None:
            self._debugger.shutdown()
        if self._jitter is not None:
            self._jitter.shutdown()
        if self._corpus is not None:
            self._corpus.shutdown()
        for runner in (self.checks, self.reloader):
            runner.cancel()
            runner.wait()


# ---------------------------------------------------------------------------------------------
# The window


def freeze_long_lived_objects() -> None:
    """Collect, then move every object alive into the collector's permanent generation, as a
    window is made and again once colibri-inspector has built it: the modules and the window
    live as long as the process, and a full collection that scans them (about 100 000 objects,
    80-110 ms of CPU here) runs on whichever thread allocates, often the UI thread while a worker
    checksums a file or a checkpoint of 20 000 tensors opens. After this it scans only what was
    made since; the collect first frees the garbage a freeze would keep forever. Called before
    any file opens, so no file's objects are frozen with them."""
    gc.collect()
    gc.freeze()


class MainWindow(QMainWindow):
    """The application window (see the module docstring)."""

    sig_file_opened = Signal(str)

    def __init__(self, settings: QSettings | None = None) -> None:
        freeze_long_lived_objects()
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Colibri Inspector")
        self.setWindowIcon(resources.icon("colibri"))
        self.setAcceptDrops(True)
        self.settings = settings if settings is not None else make_settings()
        self.persist = True   # False: nothing is written to the settings (screenshot mode)
        self.recent = RecentFiles(self._settings_list("recent_files"))
        self._splitter_state: QByteArray | None = None

        self.files = QTabWidget()
        self.files.setObjectName("fileTabs")
        self.files.setTabsClosable(True)
        self.files.setMovable(True)
        self.files.tabCloseRequested.connect(self.close_file)
        self.files.currentChanged.connect(self._current_file_changed)
        self.empty = QLabel()
        self.empty.setObjectName("emptyState")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.set_empty_message("")
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.files)
        self.setCentralWidget(self.stack)

        self._build_status_bar()
        self._build_menus()
        self._restore_window()
        self._update_status()

    # -- settings -------------------------------------------------------------------------------

    def _settings_list(self, key: str) -> list[str]:
        value = self.settings.value(key, [])
        if isinstance(value, str):
            return [value]
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []

    def _restore_window(self) -> None:
        geometry = self.settings.value("window/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        else:
            self.resize(1280, 800)
        state = self.settings.value("window/state")
        if isinstance(state, QByteArray):
            self.restoreState(state)
        splitter = self.settings.value("window/splitter")
        if isinstance(splitter, QByteArray):
            self._splitter_state = splitter

    def save_settings(self) -> None:
        if not self.persist:
            return
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/state", self.saveState())
        view = self.current_view()
        if view is not None:
            self.settings.setValue("window/splitter", view.splitter.saveState())
        self.settings.setValue("recent_files", self.recent.paths)
        self.settings.sync()

    # -- menus ----------------------------------------------------------------------------------

    def _action(self, text: str, slot: Any, shortcut: QKeySequence | str | None = None,
                icon: str | None = None) -> QAction:
        action = QAction(text, self)
        if icon is not None:
            action.setIcon(resources.icon(icon))
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(lambda _checked=False: slot())
        self.addAction(action)
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self.open_action = self._action("&Open…", self.open_dialog, QKeySequence.StandardKey.Open,
                                        "open")
        file_menu.addAction(self.open_action)
        self.open_directory_action = self._action("Open Checkpoint &Directory…",
                                                  self.open_directory_dialog, "Ctrl+Shift+O")
        file_menu.addAction(self.open_directory_action)
        self.recent_menu = file_menu.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        self._fill_recent_menu()
        self.close_action = self._action("&Close", self.close_current, "Ctrl+W", "close")
        self.reload_action = self._action("Re&load", self.reload_current, "Ctrl+R", "reload")
        file_menu.addAction(self.close_action)
        file_menu.addAction(self.reload_action)
        file_menu.addSeparator()
        self.attach_action = self._action("&Attach to Server…", self.attach_dialog,
                                          "Ctrl+Shift+A")
        file_menu.addAction(self.attach_action)
        file_menu.addSeparator()
        self.export_csv_action = self._action("Export Table as &CSV…", self.export_csv_dialog,
                                              "Ctrl+Shift+C", "export")
        self.export_png_action = self._action("Export View as &PNG…", self.export_png_dialog,
                                              "Ctrl+Shift+P", "export")
        file_menu.addAction(self.export_csv_action)
        file_menu.addAction(self.export_png_action)
        file_menu.addSeparator()
        self.quit_action = self._action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        file_menu.addAction(self.quit_action)

        edit_menu = bar.addMenu("&Edit")
        self.find_action = self._action("&Find Tensor…", self.find, QKeySequence.StandardKey.Find,
                                        "find")
        self.goto_action = self._action("&Go to Offset…", self.goto_offset, "Ctrl+G", "goto")
        edit_menu.addAction(self.find_action)
        edit_menu.addAction(self.goto_action)

        view_menu = bar.addMenu("&View")
        self.view_actions: dict[str, QAction] = {}
        for i, name in enumerate(VIEW_NAMES, start=1):
            action = self._action(VIEW_TITLES[name], lambda n=name: self.set_view(n), f"Ctrl+{i}")
            view_menu.addAction(action)
            self.view_actions[name] = action

        validate_menu = bar.addMenu("&Validate")
        self.run_action = self._action("&Run Data Checks (checksums + NaN)", self.run_checks,
                                       "F5", "validate")
        self.cancel_action = self._action("&Cancel", self.cancel_checks, "Esc", "cancel")
        validate_menu.addAction(self.run_action)
        validate_menu.addAction(self.cancel_action)

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        existing = self.recent.existing()
        for path in existing:
            action = self.recent_menu.addAction(path)
            action.triggered.connect(lambda _checked=False, p=path: self.open_path(p))
        if not existing:
            self.recent_menu.addAction("(no recent files)").setEnabled(False)
        self.recent_menu.addSeparator()
        self.recent_menu.addAction("Clear Menu", self._clear_recent)

    def _clear_recent(self) -> None:
        self.recent.clear()
        self.settings.setValue("recent_files", [])

    # -- status bar -----------------------------------------------------------------------------

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.size_label = QLabel()
        self.size_label.setObjectName("statusSize")
        self.state_label = QLabel()
        self.state_label.setObjectName("statusState")
        self.progress = QProgressBar()
        self.progress.setObjectName("statusProgress")
        self.progress.setFixedWidth(160)
        self.progress.setRange(0, 10_000)
        self.progress.setVisible(False)
        self.cancel_button = QToolButton()
        self.cancel_button.setIcon(resources.icon("cancel"))
        self.cancel_button.setToolTip("Cancel the data checks (Esc)")
        self.cancel_button.setVisible(False)
        self.cancel_button.clicked.connect(self.cancel_checks)
        bar.addPermanentWidget(self.state_label)
        bar.addPermanentWidget(self.progress)
        bar.addPermanentWidget(self.cancel_button)
        bar.addPermanentWidget(self.size_label)

    def _update_status(self) -> None:
        view = self.current_view()
        foreign = self.files.currentWidget()
        if view is None and isinstance(foreign, QtForeignFileView):
            self.size_label.setText(size_text(foreign.doc.size) if foreign.doc is not None
                                    else "")
            self.state_label.setText(foreign.validation_state())
            self._set_running(foreign.is_checking())
            self.setWindowTitle(f"{foreign.name} — Colibri Inspector")
            return
        if view is None:
            self.size_label.setText("")
            self.state_label.setText("no file")
            self._set_running(False)
            return
        self.size_label.setText(size_text(view.doc.size))
        self.state_label.setText(view.validation_state())
        self._set_running(view.is_checking())
        self.setWindowTitle(f"{view.doc.name} — Colibri Inspector")

    def _set_running(self, running: bool) -> None:
        self.progress.setVisible(running)
        self.cancel_button.setVisible(running)

    def _progress(self, done: int, total: int, _text: str) -> None:
        if self.sender() is self.file_tab():
            if self.progress.maximum() != max(total, 1):
                self.progress.setRange(0, max(total, 1))
            self.progress.setValue(done)

    # -- files ----------------------------------------------------------------------------------

    def views(self) -> list[Any]:
        """Every open file's tab: `FileView`s (.colibri) and `QtForeignFileView`s (GGUF,
        safetensors); attached servers are `monitors()`."""
        return [w for w in map(self.files.widget, range(self.files.count()))
                if not isinstance(w, QtServerMonitor)]

    def monitors(self) -> list[QtServerMonitor]:
        return [w for w in map(self.files.widget, range(self.files.count()))
                if isinstance(w, QtServerMonitor)]

    def current_view(self) -> FileView | None:
        widget = self.files.currentWidget()
        return widget if isinstance(widget, FileView) else None

    def file_tab(self) -> FileView | QtForeignFileView | None:
        """The current tab when it shows a file (.colibri, GGUF or safetensors)."""
        widget = self.files.currentWidget()
        return widget if isinstance(widget, (FileView, QtForeignFileView)) else None

    def set_empty_message(self, message: str) -> None:
        """The text shown while no file is open."""
        self.empty.setText(message or (
            "No model open.\n\nOpen a .colibri file with File > Open (Ctrl+O), pick one from "
            "File > Open Recent, or drop it on this window."))

    def open_path(self, path: str | os.PathLike[str]) -> Any:
        """Open `path` in a new tab (or switch to its tab). A broken file opens into its
        validation report; this never raises for a bad file. GGUF files and safetensors
        checkpoints (a file, an index or a directory; detected by content) open in a
        `QtForeignFileView`, everything else in a `FileView`."""
        absolute = os.path.abspath(os.fspath(path))
        for view in self.views():
            if view.path == absolute:
                self.files.setCurrentWidget(view)
                return view
        if is_foreign(absolute):
            return self._open_foreign(absolute)
        doc = ModelDocument.open(absolute)
        view = FileView(doc)
        self._wire_file_tab(view)
        view.sig_view_changed.connect(self._view_changed)
        view.sig_reloaded.connect(
            lambda p: self.statusBar().showMessage(f"Reloaded {os.path.basename(p)}: "
                                                   "the file changed on disk", 5000))
        index = self.files.addTab(view, doc.name)
        self.files.setTabToolTip(index, absolute)
        self.files.setCurrentIndex(index)
        self.stack.setCurrentWidget(self.files)
        if doc.identity is not None and self.persist:
            self.recent.add(absolute)
            self.settings.setValue("recent_files", self.recent.paths)
        self._update_status()
        self.sig_file_opened.emit(absolute)
        return view

    def _open_foreign(self, absolute: str) -> QtForeignFileView:
        foreign = QtForeignFileView(absolute, auto_check_bytes=AUTO_CHECK_BYTES)
        self._wire_file_tab(foreign)
        foreign.sig_imported.connect(self._run_imported)
        foreign.sig_import_failed.connect(
            lambda message: QMessageBox.warning(self, "Import failed", message))
        index = self.files.addTab(foreign, foreign.name)
        self.files.setTabToolTip(index, absolute)
        self.files.setCurrentIndex(index)
        self.stack.setCurrentWidget(self.files)
        if self.persist:
            self.recent.add(absolute)
            self.settings.setValue("recent_files", self.recent.paths)
        self._update_status()
        self.sig_file_opened.emit(absolute)
        return foreign

    def _wire_file_tab(self, view: FileView | QtForeignFileView) -> None:
        """What every file tab gets: the last splitter layout (or the hexdump as wide as one row
        of it, the views the rest), and its status and progress in the status bar."""
        if self._splitter_state is not None:
            view.splitter.restoreState(self._splitter_state)
        else:
            width = max(self.width(), 800)
            hexdump = view.hex.minimumSizeHint().width() + 8
            view.splitter.setSizes([width - hexdump, hexdump])
        view.sig_status_changed.connect(self._view_status_changed)
        view.sig_progress.connect(self._progress)

    def _run_imported(self, colibri_path: str) -> None:
        """A GGUF file's import is ready: open it and show the debugger."""
        view = self.open_path(colibri_path)
        if isinstance(view, FileView):
            view.set_view("debugger")

    def open_dialog(self) -> None:
        view = self.current_view()
        start = os.path.dirname(view.path) if view is not None else str(Path.home())
        paths, _ = QFileDialog.getOpenFileNames(self, "Open Colibri model", start, FILE_FILTER)
        for path in paths:
            self.open_path(path)

    def open_directory_dialog(self) -> None:
        """A checkpoint's directory (its shards with or without an index): the file dialog
        picks files only."""
        view = self.current_view()
        start = os.path.dirname(view.path) if view is not None else str(Path.home())
        path = QFileDialog.getExistingDirectory(self, "Open checkpoint directory", start)
        if path:
            self.open_path(path)

    def close_file(self, index: int) -> None:
        view = self.files.widget(index)
        if isinstance(view, FileView):
            self._splitter_state = view.splitter.saveState()
            view.shutdown()
        elif isinstance(view, (QtForeignFileView, QtServerMonitor)):
            view.shutdown()
        self.files.removeTab(index)
        if view is not None:
            view.deleteLater()
        if self.files.count() == 0:
            self.stack.setCurrentWidget(self.empty)
        self._update_status()

    def attach_dialog(self) -> None:
        last = str(self.settings.value("attach/address", "127.0.0.1:8080"))
        text, ok = QInputDialog.getText(self, "Attach to a Colibri server",
                                        "Address of `colibri serve --http` (host:port):",
                                        text=last)
        if ok:
            self.attach(text)

    def attach(self, address: str) -> QtServerMonitor | None:
        """Follow the server at `address` in a tab of its own (or switch to its tab)."""
        try:
            host, port = parse_address(address)
        except ValueError as exc:
            QMessageBox.warning(self, "Attach to a Colibri server", str(exc))
            return None
        for monitor in self.monitors():
            if (monitor.host, monitor.port) == (host, port):
                self.files.setCurrentWidget(monitor)
                monitor.attach()
                return monitor
        monitor = QtServerMonitor(host, port)
        index = self.files.addTab(monitor, f"server {monitor.address}")
        self.files.setTabToolTip(index, f"colibri serve --http {monitor.address}")
        self.files.setCurrentIndex(index)
        self.stack.setCurrentWidget(self.files)
        monitor.sig_status.connect(lambda text: self.statusBar().showMessage(text, 5000))
        monitor.attach()
        if self.persist:
            self.settings.setValue("attach/address", address.strip())
        return monitor

    def close_current(self) -> None:
        if self.files.count():
            self.close_file(self.files.currentIndex())

    def reload_current(self) -> None:
        view = self.current_view()
        if view is not None:
            view.reload()

    def _current_file_changed(self, _index: int) -> None:
        self._update_status()
        view = self.current_view()
        for attr in DEBUGGER_SHORTCUT_ACTIONS:
            if hasattr(self, attr):
                getattr(self, attr).setEnabled(view is None or view.current_view() != "debugger")

    def _view_changed(self, name: str) -> None:
        """While the debugger is shown its own shortcuts (Ctrl+R run, F5 continue, Ctrl+F find
        event, Ctrl+G go to event) win over the window's file commands of the same keys."""
        if self.sender() is self.current_view():
            for attr in DEBUGGER_SHORTCUT_ACTIONS:
                getattr(self, attr).setEnabled(name != "debugger")

    def _view_status_changed(self) -> None:
        if self.sender() is self.file_tab():
            self._update_status()

    # -- commands -------------------------------------------------------------------------------

    def set_view(self, name: str) -> None:
        view = self.file_tab()
        if view is not None:
            view.set_view(name)

    def find(self) -> None:
        view = self.file_tab()
        if view is not None:
            view.set_view("tensors")
            view.tensors.focus_filter()

    def goto_offset(self) -> None:
        view = self.file_tab()
        if view is not None:
            view.set_view("hex")
            view.hex.prompt_goto()

    def run_checks(self) -> None:
        view = self.file_tab()
        if view is not None:
            view.run_checks(True, True)

    def cancel_checks(self) -> None:
        view = self.file_tab()
        if view is not None:
            view.cancel_checks()

    def export_csv_dialog(self) -> None:
        view = self.file_tab()
        if view is None:
            return
        if view.current_view() not in ("validation", "header", "tensors"):
            QMessageBox.information(self, "Export CSV", "Switch to the Validation, Header or "
                                    "Tensors view to export its table.")
            return
        self._export_dialog(view, "Export table as CSV", "CSV (*.csv)", "csv", view.export_csv)

    def export_png_dialog(self) -> None:
        view = self.file_tab()
        if view is not None:
            self._export_dialog(view, "Export view as PNG", "PNG image (*.png)", "png",
                                view.export_png)

    def _export_dialog(self, view: FileView | QtForeignFileView, title: str, pattern: str,
                       suffix: str, write: Callable[[str], object]) -> None:
        """Ask where to export `view`'s current view (offering a name after its file and view)
        and write it there; a write that fails is said, not raised."""
        name = f"{Path(view.path).stem}-{view.current_view()}.{suffix}"
        save_with_dialog(self, title, lambda path: self._export(write, path), pattern, name)

    def _export(self, write: Callable[[str], object], path: str) -> None:
        try:
            write(path)
        except (OSError, ValueError) as exc:
            QMessageBox.warning(self, "Export failed", f"Could not write {path}:\n{exc}")
            return
        self.statusBar().showMessage(f"Wrote {path}", 5000)

    # -- drag and drop --------------------------------------------------------------------------

    @staticmethod
    def _local_paths(event: QDragEnterEvent | QDropEvent) -> list[str]:
        mime = event.mimeData()
        if not mime.hasUrls():
            return []
        return [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt API)
        if self._local_paths(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        paths = self._local_paths(event)
        for path in paths:
            self.open_path(path)
        if paths:
            event.acceptProposedAction()

    # -- shutdown -------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.save_settings()
        for view in self.views():
            view.shutdown()
        for monitor in self.monitors():
            monitor.shutdown()
        wait_for_retired()
        super().closeEvent(event)


__all__ = ["FileView", "MainWindow", "VIEW_NAMES", "make_settings"]
