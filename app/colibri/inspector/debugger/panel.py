"""`QtDebuggerPanel`: the routing debugger as one widget for the main window to dock.

    panel = QtDebuggerPanel(autosave_path=None)
    panel.set_model(model)          # a colibri.engine.Model (read-only; shared with the worker)
    ...
    panel.shutdown()                # before the model is closed

Layout: run panel and breakpoints (left), event browser and token view (centre), routing map,
latency, and the interventions with the counterfactual (right, tabs), a navigation bar on top. The engine runs on `DebuggerController`'s
thread; snapshots arrive by signal and are painted on a 30 Hz timer (only the visible tab).

Shortcuts (active while focus is inside the panel; RenderDoc / IDE conventions):
  Ctrl+R run · F5 continue to breakpoint · F6 pause · Shift+F5 stop · F10 step token ·
  F11 step layer · Ctrl+F find · F3 / Shift+F3 find next / previous · Ctrl+G go to event ·
  Ctrl+B toggle bookmark · F2 / Shift+F2 next / previous bookmark ·
  Alt+Down / Alt+Up next / previous routing change · Ctrl+Shift+S save session.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (QFileDialog, QLabel, QLineEdit, QSpinBox, QSplitter,
                               QTabWidget, QToolBar, QVBoxLayout, QWidget)

from colibri.debugging.anatomy import RuleBook
from colibri.debugging.events import Event, EventList
from colibri.debugging.run import token_piece
from colibri.debugging.session_file import (SUFFIX, SavedSession, checksum_when_ready, load_session,
                                             save_session)
from colibri.debugging.stats import cache_summary
from colibri.debugging.trace_export import write_chrome_trace, write_routing_csv
from colibri.inspector.debugger.interventions_view import QtCounterfactualView, QtInterventionList
from colibri.inspector.debugger.run_panel import QtRunPanel
from colibri.inspector.debugger.views import (QtBreakpointList, QtEventList, QtLatencyView,
                                              QtRoutingHeatmap, QtTokenView)
from colibri.inspector.debugger.worker import DebuggerController, DebuggerSnapshot
from colibri.inspector.export import save_with_dialog
from colibri.inspector.prompt import example_prompt
from colibri.inspector.readout import wrapping
from colibri.inspector.refdiff import QtReferenceDiffDialog
from colibri.interventions import Intervention
from colibri.values import RunSettings

REPAINT_MS = 33
CHECKSUM_POLL_MS = 200  # how often an opened session looks for the model file's checksum


class QtDebuggerPanel(QWidget):
    sig_status = Signal(str)
    sig_show_router_weights = Signal(int)   # layer index: open its router rows in the file views
    sig_analyses_loaded = Signal(object)    # dict: the analyses a reopened session carried

    def __init__(self, parent: QWidget | None = None, autosave_path: str | None = None,
                 step_delay_s: float = 0.0) -> None:
        super().__init__(parent)
        self.model: Any = None
        self._rules: RuleBook | None = None
        # Called when a session is saved: JSON-ready results of other analyses to store with it.
        self.analysis_provider: Callable[[], dict[str, Any]] | None = None
        self.snapshot: DebuggerSnapshot | None = None
        self.selected: int | None = None
        self.saved: SavedSession | None = None
        self.reference_diff: QtReferenceDiffDialog | None = None
        self.controller = DebuggerController(self, step_delay_s=step_delay_s,
                                             autosave_path=autosave_path)
        self.run_panel = QtRunPanel(self)
        self.breakpoint_view = QtBreakpointList(self)
        self.intervention_view = QtInterventionList(self)
        self.event_list = QtEventList(self)
        self.token_view = QtTokenView(self)
        self.routing_map = QtRoutingHeatmap(self)
        self.latency = QtLatencyView(self)
        self.counterfactual_view = QtCounterfactualView(self)
        # the list and what applying it changed, in one tab
        self.intervention_tab = QWidget(self)
        box = QVBoxLayout(self.intervention_tab)
        box.addWidget(self.intervention_view)
        box.addWidget(self.counterfactual_view, 1)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.routing_map, "Routing map")
        self.tabs.addTab(self.latency, "Latency")
        self.tabs.addTab(self.intervention_tab, "Interventions")

        self.find_box = QLineEdit(self)
        self.find_box.setPlaceholderText("find: expert N, pos N, or token text")
        self.goto_box = QSpinBox(self)
        self.goto_box.setRange(0, 10**9)
        self.goto_box.setPrefix("event ")
        # A tool bar, not a row of buttons: on a narrow window the last commands fold into its
        # overflow menu instead of widening the window past the screen.
        self.toolbar = QToolBar(self)
        self.toolbar.setObjectName("debuggerToolbar")
        self.toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.find_box.setMinimumWidth(220)
        self.toolbar.addWidget(self.find_box)
        self.toolbar.addWidget(self.goto_box)
        self.nav_actions: dict[str, QAction] = {}
        for text, slot, tip in (
                ("Go", self.go_to_box, "go to the event number (Ctrl+G)"),
                ("Bookmark", self.toggle_bookmark, "bookmark the current event (Ctrl+B)"),
                ("Prev change", self.previous_change, "earlier routing change (Alt+Up)"),
                ("Next change", self.next_change, "later routing change (Alt+Down)"),
                ("Router weights", self.show_router_weights,
                 "the router's weight rows of this event's layer"),
                ("Save session", self.save_dialog, "save the run (Ctrl+Shift+S)"),
                ("Open session", self.open_dialog, "view a saved run"),
                ("Export trace", self.export_trace_dialog, "Chrome Trace JSON (ui.perfetto.dev)"),
                ("Export CSV", self.export_csv_dialog, "every routing decision as CSV"),
                ("Reference diff", self.open_reference_diff,
                 "this file against its Hugging Face checkpoint run in transformers, layer by "
                 "layer")):
            action = self.toolbar.addAction(text)
            action.setToolTip(tip)
            action.triggered.connect(lambda _checked=False, f=slot: f())
            self.nav_actions[text] = action
        self.status = QLabel("open a model, enter a prompt and Run", self)

        left = QSplitter(Qt.Orientation.Vertical, self)
        left.addWidget(self.run_panel)
        left.addWidget(self.breakpoint_view)
        centre = QSplitter(Qt.Orientation.Vertical, self)
        centre.addWidget(self.event_list)
        centre.addWidget(self.token_view)
        main = QSplitter(Qt.Orientation.Horizontal, self)
        for w in (left, centre, self.tabs):
            main.addWidget(w)
        # the plots need the room; the run form is narrow by nature
        # the event list wide enough for position, token, layer, experts, weights and margin
        for index, stretch in enumerate((3, 4, 5)):
            main.setStretchFactor(index, stretch)
        main.setSizes([300, 430, 510])
        layout = QVBoxLayout(self)
        layout.addWidget(self.toolbar)
        layout.addWidget(main, 1)
        layout.addWidget(self.status)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(REPAINT_MS)
        self._timer.timeout.connect(self._repaint)

        c = self.controller
        c.sig_started.connect(self._started)
        c.sig_position_done.connect(self._snapshot)
        c.sig_run_finished.connect(self._run_finished)
        c.sig_failed.connect(self._failed)
        c.sig_running.connect(self.run_panel.set_running)
        rp = self.run_panel
        rp.sig_run.connect(self.start_run)
        rp.sig_continue.connect(self.continue_run)
        rp.sig_pause.connect(c.pause)
        rp.sig_stop.connect(c.stop)
        rp.sig_step_token.connect(self.step_token)
        rp.sig_step_layer.connect(self.step_layer)
        self.event_list.sig_event_selected.connect(self.select_event)
        self.routing_map.sig_cell_selected.connect(self._cell_selected)
        self.counterfactual_view.sig_decision_selected.connect(self._cell_selected)
        self.intervention_view.sig_apply.connect(self.apply_interventions)
        rp.sig_apply_routing.connect(self.apply_routing)
        self._applying = ""   # what a recomputation on the worker applies, for the status line
        self._applying_kind = ""   # 'interventions' or 'routing'
        self._counterfactual_before: Any = None
        self.tabs.currentChanged.connect(lambda _i: self._repaint())
        self.find_box.returnPressed.connect(self.find_next)
        self._shortcuts()
        # Labels carry run-dependent text (status, generated text, token details): let them
        # wrap rather than grow the panel's minimum width with every token.
        for label in (self.status, self.run_panel.status, self.token_view.title,
                      self.token_view.rule, self.token_view.bias_flag,
                      self.token_view.details, self.routing_map.balance, self.latency.summary,
                      self.intervention_view.message, self.counterfactual_view.summary):
            wrapping(label)

    def _shortcuts(self) -> None:
        for keys, slot in (("Ctrl+R", self.run_panel._run), ("F5", self.continue_run),
                           ("F6", self.controller.pause), ("Shift+F5", self.controller.stop),
                           ("F10", self.step_token), ("F11", self.step_layer),
                           ("Ctrl+F", self.find_box.setFocus), ("F3", self.find_next),
                           ("Shift+F3", self.find_previous), ("Ctrl+G", self.goto_box.setFocus),
                           ("Ctrl+B", self.toggle_bookmark), ("F2", self.next_bookmark),
                           ("Shift+F2", self.previous_bookmark),
                           ("Alt+Down", self.next_change), ("Alt+Up", self.previous_change),
                           ("Ctrl+Shift+S", self.save_dialog)):
            s = QShortcut(QKeySequence(keys), self)
            s.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            s.activated.connect(slot)

    # -- model and run control ------------------------------------------------------------------

    def set_model(self, model: Any) -> None:
        """Debug `model` (a colibri.engine.Model). The panel does not close it."""
        self.model = model
        self._rules = RuleBook(model) if model is not None else None
        self.token_view.set_rules(self._rules)
        if self.reference_diff is not None:
            self.reference_diff.page.set_model(model)
        tok = model.tokenizer if model is not None else None
        if tok is None:
            self.run_panel.set_tokenizer(None)
        else:
            def tokenize(text: str) -> list[tuple[int, str]]:
                ids = tok.encode(text).ids
                return [(i, token_piece(tok, i)) for i in ids]
            self.run_panel.set_tokenizer(tokenize)
        if model is not None:
            self.run_panel.set_n_experts(model.hparams.n_experts)
            self.run_panel.set_d_model(model.hparams.d_model)
        if model is not None and not self.run_panel.prompt.text():
            self.run_panel.prompt.setText(example_prompt(model))
        self._set_status(f"model {os.path.basename(model.path)}" if model is not None
                         else "no model")

    def start_run(self, settings: Any, run: bool = True) -> None:
        if self.model is None:
            self._set_status("no model: open one first")
            return
        self.saved = None
        self.token_view.set_rules(self._rules)
        self._run_after_start = run
        # a new run applies the interventions as listed
        settings = replace(settings, interventions=tuple(self.intervention_view.items))
        self.intervention_view.applied = settings.interventions
        self.controller.start(self.model, settings)

    def _started(self, snap: DebuggerSnapshot) -> None:
        self._snapshot(snap)
        if getattr(self, "_run_after_start", False):
            self.continue_run()

    def continue_run(self) -> None:
        if self.controller.worker.debugger is None and self.model is not None:
            try:
                settings = self.run_panel.settings()
            except ValueError as exc:
                self._set_status(f"cannot run: {exc}")
                return
            self.start_run(settings)
            return
        self.controller.run(list(self.breakpoint_view.breakpoints))

    def apply_interventions(self, interventions: list[Intervention]) -> None:
        """Run under `interventions`: on the worker, what they change is computed again and
        compared with the run as it was (the Counterfactual tab); without a run, a new one
        starts under them."""
        if self.saved is not None or self.controller.worker.debugger is None:
            settings = self._panel_settings()
            if settings is None:
                return
            self.intervention_view.items = list(interventions)
            self.start_run(settings, run=False)
            return
        self._begin_applying("interventions", f"applied {len(interventions)} intervention(s)")
        self._set_status(f"applying {len(interventions)} intervention(s)...")
        self.controller.set_interventions(interventions)

    def apply_routing(self, routing: str, epsilon: float | None) -> None:
        """Route the run on view by `routing` and `epsilon` from now on: on the worker, the
        computed positions are routed again and the run is computed again from the first one
        decided differently, compared with the run as it was (the Interventions tab)."""
        if self.saved is not None or self.controller.worker.debugger is None:
            self._set_status("no run to apply the routing to: Run starts one with it")
            return
        eps = "the model's default epsilon" if epsilon is None else f"epsilon {epsilon:g}"
        self._begin_applying("routing",
                             f"routing now {routing}" + (f", {eps}" if routing == "stable" else ""))
        self._set_status(f"applying {routing} routing...")
        self.controller.set_routing(routing, epsilon)

    def _begin_applying(self, kind: str, done_text: str) -> None:
        self._applying, self._applying_kind = done_text, kind
        self._counterfactual_before = self.snapshot.counterfactual if self.snapshot else None

    def step_token(self) -> None:
        self._ensure_session(self.controller.step_token)

    def step_layer(self) -> None:
        self._ensure_session(self.controller.step_layer)

    def _ensure_session(self, then: Any) -> None:
        if self.controller.worker.debugger is None:
            settings = self._panel_settings()
            if settings is None:
                return
            self.start_run(settings, run=False)
        then()

    def _panel_settings(self) -> RunSettings | None:
        """The run panel's settings for a new run; None with no model, or when they do not
        parse (said in the status line)."""
        if self.model is None:
            return None
        try:
            return self.run_panel.settings()
        except ValueError as exc:
            self._set_status(f"cannot start: {exc}")
            return None

    def shutdown(self) -> None:
        self.controller.shutdown()
        if self.reference_diff is not None:
            self.reference_diff.page.shutdown()

    def open_reference_diff(self) -> QtReferenceDiffDialog | None:
        """The reference diff window on this model (one per panel), the run's prompt in it."""
        if self.model is None:
            self._set_status("no model: open one first")
            return None
        if self.reference_diff is None:
            self.reference_diff = QtReferenceDiffDialog(self)
        self.reference_diff.page.set_model(self.model, self.run_panel.prompt.text())
        self.reference_diff.show()
        self.reference_diff.raise_()
        return self.reference_diff

    # -- snapshots ------------------------------------------------------------------------------

    def _snapshot(self, snap: DebuggerSnapshot) -> None:
        self.saved = None  # live data replaces a saved session on view
        self.snapshot = snap
        state = "running" if snap.running else (snap.stop_reason or "ready")
        if snap.layers_done is not None and not snap.running:
            state = f"paused after layer {snap.layers_done - 1} of position {snap.record.n_positions}"
        caching = cache_summary(snap.record).describe()
        self.run_panel.set_status(f"{snap.record.n_positions}/{snap.settings.n_positions} "
                                  f"positions, {state} ({snap.kernels} kernels); generated: "
                                  f"{snap.generated_text!r}" + (f"; {caching}" if caching else ""))
        self.intervention_view.set_applied(snap.interventions)
        self.counterfactual_view.set_counterfactual(snap.counterfactual, self._token_label)
        self.selected = snap.cursor
        if not self._timer.isActive():
            self._timer.start()

    def _run_finished(self, snap: DebuggerSnapshot) -> None:
        self._snapshot(snap)
        if self._applying:
            done, self._applying = self._applying, ""
            cf = snap.counterfactual
            new = cf is not None and cf is not self._counterfactual_before
            self._set_status(done + (
                f"; counterfactual from position {cf.from_position} in the Interventions tab"
                if new and cf is not None else "; no position computed so far changed"))
            if new:
                self.tabs.setCurrentWidget(self.intervention_tab)
            return
        r = snap.result
        if r is not None and r.reason == "breakpoint" and r.event is not None:
            self._set_status(f"breakpoint: {r.breakpoint.describe() if r.breakpoint else ''} "
                             f"at {r.event.label()}")
        elif r is not None:
            self._set_status(f"{r.reason} after {snap.record.n_positions} positions; "
                             f"generated {snap.generated_text!r}")

    def _failed(self, message: str) -> None:
        self._set_status(f"error: {message.splitlines()[0]}")
        if self._applying:
            if self._applying_kind == "interventions":
                self.intervention_view.show_error(message.splitlines()[0])
            self._applying = ""

    def _token_label(self, token: int) -> str:
        tok = self.model.tokenizer if self.model is not None else None
        return token_piece(tok, token) if tok is not None else str(token)

    @property
    def events(self) -> EventList | None:
        if self.saved is not None:
            return self._saved_events
        return self.snapshot.events if self.snapshot is not None else None

    @property
    def run_settings(self) -> RunSettings | None:
        """The settings of the run shown: the saved session's, else the live run's."""
        if self.saved is not None:
            return self.saved.settings
        return self.snapshot.settings if self.snapshot is not None else None

    @property
    def pending(self) -> tuple[Event, ...]:
        """The decisions of the position in progress (the run paused between its layers)."""
        return self.snapshot.pending if self.saved is None and self.snapshot is not None else ()

    def event_at(self, index: int | None) -> Event | None:
        events = self.events
        if events is None or index is None:
            return None
        if 0 <= index < len(events):
            return events[index]
        return next((e for e in self.pending if e.index == index), None)

    def _repaint(self) -> None:
        events, cursor = self.events, self.selected
        self.event_list.set_events(events, cursor, self.pending)
        event = self.event_at(cursor)
        self.token_view.set_event(event)
        self.intervention_view.set_event(event)
        current = self.tabs.currentWidget()
        if current is self.routing_map:
            self.routing_map.set_events(events, cursor)
        elif current is self.latency:
            settings = self.run_settings
            self.latency.set_events(events, cursor,
                                    len(settings.prompt_tokens) if settings is not None else 0)

    def _set_status(self, text: str) -> None:
        self.status.setText(text)
        self.sig_status.emit(text)

    # -- navigation -----------------------------------------------------------------------------

    def select_event(self, index: int) -> Event | None:
        event = self.event_at(index)
        if event is None:
            return None
        self.selected = index
        if self.saved is None and not self.controller.running:
            self.controller.go_to(index)  # the debugger's cursor follows (Continue resumes here)
        self._repaint()
        return event

    def show_router_weights(self) -> None:
        """Jump from the selected routing decision to its layer's router weight rows."""
        events = self.events
        if events is None or self.selected is None or not 0 <= self.selected < len(events):
            self._set_status("select a routing decision first")
            return
        self.sig_show_router_weights.emit(int(events[self.selected].layer))

    def _cell_selected(self, position: int, moe_index: int) -> None:
        if self.events is not None and position < self.events.n_positions:
            self.select_event(self.events.index_of(position, moe_index))

    def _go(self, event: Event | None, what: str) -> None:
        if event is None:
            self._set_status(f"no {what}")
        else:
            self.select_event(event.index)

    def _find(self, backward: bool) -> None:
        events = self.events
        text = self.find_box.text().strip()
        if events is None or not text:
            return
        words = text.split()
        kwargs: dict[str, Any] = {}
        if len(words) == 2 and words[0] in ("expert", "pos", "position", "layer") and \
                words[1].lstrip("-").isdigit():
            key = {"pos": "position"}.get(words[0], words[0])
            kwargs[key] = int(words[1])
        else:
            kwargs["token"] = text
        self._go(events.find(start=self.selected, backward=backward, **kwargs), f"match for {text!r}")

    def find_next(self) -> None:
        self._find(False)

    def find_previous(self) -> None:
        self._find(True)

    def go_to_box(self) -> None:
        self.select_event(self.goto_box.value())

    def toggle_bookmark(self) -> None:
        if self.events is not None and self.selected is not None:
            self.events.toggle_bookmark(self.selected)
            if self.saved is None and self.controller.worker.debugger is not None:
                # bookmarks live in the worker's list too, so saved sessions keep them
                self.controller.worker.debugger.events.bookmarks = set(self.events.bookmarks)
            self._repaint()

    def next_bookmark(self) -> None:
        if self.events is not None:
            self._go(self.events.next_bookmark(self.selected), "next bookmark")

    def previous_bookmark(self) -> None:
        if self.events is not None:
            self._go(self.events.previous_bookmark(self.selected), "previous bookmark")

    def next_change(self) -> None:
        if self.events is not None:
            self._go(self.events.next_change(self.selected), "later routing change")

    def previous_change(self) -> None:
        if self.events is not None:
            self._go(self.events.previous_change(self.selected), "earlier routing change")

    # -- files ----------------------------------------------------------------------------------

    def current_session(self) -> SavedSession | None:
        if self.saved is not None:
            return self.saved
        snap = self.snapshot
        if snap is None or self.model is None:
            return None
        dbg = self.controller.worker.debugger
        # the checksum only if known: hashing a large model would hold the UI thread for seconds
        base = SavedSession.from_debugger(dbg, checksum=False) \
            if dbg is not None and not self.controller.running else None
        if base is not None:
            base.bookmarks = sorted(snap.events.bookmarks)
            base.breakpoints = self.breakpoint_view.breakpoints
            return base
        m = self.model
        info = {"path": os.path.abspath(m.path), "size": int(m.size), "arch": m.arch,
                "n_layers": m.hparams.n_layers, "n_experts": m.hparams.n_experts,
                "n_experts_active": m.hparams.n_experts_active,
                "vocab_size": m.hparams.vocab_size, "sha256": checksum_when_ready(m.path)}
        return SavedSession(info, snap.settings, snap.record, list(snap.generated),
                            snap.finished, snap.stop_reason, self.selected,
                            sorted(snap.events.bookmarks), self.breakpoint_view.breakpoints,
                            counterfactual=snap.counterfactual)

    def save_session(self, path: str) -> None:
        session = self.current_session()
        if session is None:
            self._set_status("nothing to save")
            return
        if self.analysis_provider is not None:
            session.analyses = self.analysis_provider()
        save_session(path, session)
        self._set_status(f"saved session {path}")

    def open_session(self, path: str) -> SavedSession:
        saved = load_session(path)
        self.saved = saved
        self._saved_events = saved.events()
        self.selected = saved.cursor
        self.breakpoint_view.set_breakpoints(saved.breakpoints)
        self.intervention_view.items = list(saved.settings.interventions)
        self.intervention_view.set_applied(saved.settings.interventions)
        self.counterfactual_view.set_counterfactual(saved.counterfactual, self._token_label)
        if saved.analyses:
            self.sig_analyses_loaded.emit(saved.analyses)
        self._show_saved_model_check(saved, path)
        return saved

    def _show_saved_model_check(self, saved: SavedSession, path: str) -> None:
        """Whether the open model is the one the session was recorded on decides the routing
        rules shown and the status line. A large model's checksum takes seconds to compute: it
        runs on a background thread and this looks again until it is known."""
        if self.saved is not saved:
            return  # another session or a run replaced it
        try:
            same_model = self.model is not None and saved.model_matches(self.model.path,
                                                                         wait=False)
        except OSError:   # the open model's file is gone or unreadable: nothing to compare
            same_model = False
        # another file's rules would explain these decisions wrongly
        self.token_view.set_rules(self._rules if same_model else None)
        self._repaint()
        note = "" if self.model is None or same_model else " (recorded on a different model file)"
        if same_model is None:
            note = " (checking the model file's checksum)"
            QTimer.singleShot(CHECKSUM_POLL_MS, self,  # not after the panel is gone
                              lambda: self._show_saved_model_check(saved, path))
        if saved.kernels_note():
            note += f" ({saved.kernels_note()})"
        if saved.engine_note():
            note += f" ({saved.engine_note()})"
        self._set_status(f"viewing saved session {os.path.basename(path)}{note}; Run starts "
                         f"a new run")

    def export_trace(self, path: str) -> None:
        events = self.events
        if events is None:
            return
        settings = self.run_settings
        name = os.path.basename(self.model.path) if self.model is not None else "engine"
        write_chrome_trace(path, events, settings, other={"model_name": name})
        self._set_status(f"wrote trace {path} (open in ui.perfetto.dev)")

    def export_csv(self, path: str) -> None:
        if self.events is not None:
            n = write_routing_csv(path, self.events)
            self._set_status(f"wrote {n} routing rows to {path}")

    def save_dialog(self) -> None:
        save_with_dialog(self, "Save debugging session", self.save_session, f"Sessions (*{SUFFIX})")

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open debugging session", "",
                                              f"Sessions (*{SUFFIX});;All (*)")
        if path:
            try:
                self.open_session(path)
            except (OSError, ValueError) as exc:
                self._set_status(f"cannot open {path}: {exc}")

    def export_trace_dialog(self) -> None:
        save_with_dialog(self, "Export Chrome trace", self.export_trace, "Trace JSON (*.json)")

    def export_csv_dialog(self) -> None:
        save_with_dialog(self, "Export routing CSV", self.export_csv, "CSV (*.csv)")
