"""The debugger's engine thread: one long-lived `DebuggerWorker` on a `QThread` owns the Debugger.

Style points 11 and 14: the worker never touches a widget. It receives commands as queued signals
from `DebuggerController` (which lives on the UI thread) and answers with signals carrying
immutable `DebuggerSnapshot`s: a `RoutingRecord.snapshot()` and `EventList.snapshot()` share the
rows already written (they never change), so a snapshot costs O(1) arrays however long the run.

While `run` executes, the worker's own event loop is busy, so Pause and Stop do not go through
the queue: the controller sets the Debugger's thread-safe flags directly, and the run loop checks
them between positions. Position updates are coalesced: at most one `sig_position_done` per
`UPDATE_INTERVAL_S`, plus one when the run returns. cffi releases the GIL during each engine step,
so the UI thread keeps painting throughout.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from colibri.debugging.breakpoints import Breakpoint, BreakpointList
from colibri.debugging.counterfactual import Counterfactual
from colibri.debugging.events import Event, EventList
from colibri.debugging.run import Debugger, RoutingRecord, RunResult
from colibri.debugging.session_file import Autosaver
from colibri.interventions import Intervention
from colibri.values import RunSettings

UPDATE_INTERVAL_S = 0.05


@dataclass(frozen=True, eq=False)
class DebuggerSnapshot:
    """What the views show after a position (or a navigation step): immutable."""

    settings: RunSettings
    record: RoutingRecord
    events: EventList
    cursor: int | None
    generated: tuple[int, ...]
    generated_text: str
    finished: bool
    stop_reason: str
    running: bool
    result: RunResult | None = None
    prompt_pieces: tuple[tuple[int, str], ...] = field(default=())
    kernels: str = ""                       # the kernel path the session runs
    # the position in progress when the run pauses between layers: its decisions so far
    pending: tuple[Event, ...] = ()
    layers_done: int | None = None          # its model layers run
    counterfactual: Counterfactual | None = None

    @property
    def interventions(self) -> tuple[Intervention, ...]:
        return self.settings.interventions

    def event(self, index: int | None) -> Event | None:
        """The event at `index`: a computed one, or one of the position in progress."""
        if index is None:
            return None
        if 0 <= index < len(self.events):
            return self.events[index]
        return next((e for e in self.pending if e.index == index), None)


class DebuggerWorker(QObject):
    """Owns the Debugger; all slots run on the worker thread."""

    sig_started = Signal(object)          # DebuggerSnapshot of the fresh session
    sig_position_done = Signal(object)    # DebuggerSnapshot, coalesced
    sig_run_finished = Signal(object)     # DebuggerSnapshot with .result set
    sig_failed = Signal(str)

    def __init__(self, step_delay_s: float = 0.0, autosave_path: str | None = None) -> None:
        super().__init__()
        self.debugger: Debugger | None = None
        self.step_delay_s = step_delay_s  # slow motion (and a test knob): sleep between positions
        self.autosave_path = autosave_path
        self._autosaver: Autosaver | None = None
        self._last_emit = 0.0

    def snapshot(self, running: bool, result: RunResult | None = None) -> DebuggerSnapshot:
        dbg = self.debugger
        assert dbg is not None
        record = dbg.record.snapshot()
        return DebuggerSnapshot(dbg.settings, record, dbg.events.snapshot(record), dbg.cursor,
                                tuple(dbg.generated), dbg.generated_text(), dbg.finished,
                                dbg.stop_reason, running, result, tuple(dbg.prompt_pieces()),
                                dbg.kernels, tuple(dbg.pending_events()), dbg.layers_done,
                                dbg.counterfactual)

    @Slot(object, object)
    def start(self, model: Any, settings: RunSettings) -> None:
        try:
            if self.debugger is not None:
                self.debugger.close()
            self.debugger = Debugger(model, settings)
            self._autosaver = Autosaver(self.autosave_path) if self.autosave_path else None
            self.sig_started.emit(self.snapshot(False))
        except Exception as exc:  # the worker must report, never die silently
            self.debugger = None
            self.sig_failed.emit(f"{type(exc).__name__}: {exc}")

    def _on_position(self, _position: int) -> None:
        assert self.debugger is not None
        if self._autosaver is not None:
            self._autosaver.notify(self.debugger)
        now = time.monotonic()
        if now - self._last_emit >= UPDATE_INTERVAL_S:
            self._last_emit = now
            self.sig_position_done.emit(self.snapshot(True))
        if self.step_delay_s:
            time.sleep(self.step_delay_s)

    @Slot(object, object)
    def run(self, breakpoints: list[Breakpoint] | None, max_positions: int | None) -> None:
        dbg = self.debugger
        if dbg is None:
            self.sig_failed.emit("no debugging session: start a run first")
            return
        try:
            until = BreakpointList(list(breakpoints)) if breakpoints else None
            result = dbg.run(until=until, max_positions=max_positions,
                             on_position=self._on_position)
            if self._autosaver is not None:
                self._autosaver.flush(dbg)
        except Exception as exc:
            self.sig_failed.emit(f"{type(exc).__name__}: {exc}\n"
                                 f"{traceback.format_exc(limit=4)}")
            return
        self.sig_run_finished.emit(self.snapshot(False, result))

    @Slot(object)
    def set_interventions(self, interventions: list[Intervention]) -> None:
        """Run under `interventions` from now on; what they change is computed again (Pause and
        Stop end that early) and compared with the run as it was."""
        dbg = self.debugger
        if dbg is None:
            self.sig_failed.emit("no debugging session: start a run first")
            return
        try:
            dbg.set_interventions(interventions)
            dbg.clear_requests()   # a pause or stop ended the recomputation: it is honoured
            if self._autosaver is not None:
                self._autosaver.flush(dbg)
        except Exception as exc:  # a refused spec names its field
            self.sig_failed.emit(f"{type(exc).__name__}: {exc}")
            return
        self.sig_run_finished.emit(self.snapshot(False))

    @Slot(str, object)
    def set_routing(self, routing: str, epsilon: float | None) -> None:
        """Route the run by `routing` and `epsilon` from now on; what that changes is computed
        again (Pause and Stop end that early) and compared with the run as it was."""
        dbg = self.debugger
        if dbg is None:
            self.sig_failed.emit("no debugging session: start a run first")
            return
        try:
            dbg.set_routing(routing, epsilon)
            dbg.clear_requests()
            if self._autosaver is not None:
                self._autosaver.flush(dbg)
        except Exception as exc:  # the engine's refusal names the modes it takes
            self.sig_failed.emit(f"{type(exc).__name__}: {exc}")
            return
        self.sig_run_finished.emit(self.snapshot(False))

    @Slot()
    def step_token(self) -> None:
        self._navigate(lambda d: d.step_token())

    @Slot()
    def step_layer(self) -> None:
        self._navigate(lambda d: d.step_layer())

    @Slot(int)
    def go_to(self, index: int) -> None:
        self._navigate(lambda d: d.go_to(index))

    def _navigate(self, action: Any) -> None:
        dbg = self.debugger
        if dbg is None:
            self.sig_failed.emit("no debugging session: start a run first")
            return
        try:
            action(dbg)
        except Exception as exc:
            self.sig_failed.emit(f"{type(exc).__name__}: {exc}")
            return
        self.sig_run_finished.emit(self.snapshot(False))

    @Slot()
    def close(self) -> None:
        if self.debugger is not None:
            self.debugger.close()
            self.debugger = None


class DebuggerController(QObject):
    """The UI thread's handle on the worker: starts the thread, forwards commands as queued
    signals, and sets pause/stop flags directly. Re-emits the worker's signals."""

    sig_started = Signal(object)
    sig_position_done = Signal(object)
    sig_run_finished = Signal(object)
    sig_failed = Signal(str)
    sig_running = Signal(bool)

    _sig_start = Signal(object, object)
    _sig_run = Signal(object, object)
    _sig_step_token = Signal()
    _sig_step_layer = Signal()
    _sig_go_to = Signal(int)
    _sig_interventions = Signal(object)
    _sig_routing = Signal(str, object)
    _sig_close = Signal()

    def __init__(self, parent: QObject | None = None, step_delay_s: float = 0.0,
                 autosave_path: str | None = None) -> None:
        super().__init__(parent)
        self.running = False
        self.thread = QThread()
        self.thread.setObjectName("colibri-debugger")
        self.worker = DebuggerWorker(step_delay_s, autosave_path)
        self.worker.moveToThread(self.thread)
        self._sig_start.connect(self.worker.start)
        self._sig_run.connect(self.worker.run)
        self._sig_step_token.connect(self.worker.step_token)
        self._sig_step_layer.connect(self.worker.step_layer)
        self._sig_go_to.connect(self.worker.go_to)
        self._sig_interventions.connect(self.worker.set_interventions)
        self._sig_routing.connect(self.worker.set_routing)
        self._sig_close.connect(self.worker.close)
        self.worker.sig_started.connect(self.sig_started)
        self.worker.sig_position_done.connect(self.sig_position_done)
        self.worker.sig_run_finished.connect(self._finished)
        self.worker.sig_failed.connect(self._failed)
        self.thread.start()

    def _set_running(self, running: bool) -> None:
        if running != self.running:
            self.running = running
            self.sig_running.emit(running)

    def _finished(self, snap: DebuggerSnapshot) -> None:
        self._set_running(False)
        self.sig_run_finished.emit(snap)

    def _failed(self, message: str) -> None:
        self._set_running(False)
        self.sig_failed.emit(message)

    # -- commands (UI thread) -------------------------------------------------------------------

    def start(self, model: Any, settings: RunSettings) -> None:
        self._sig_start.emit(model, settings)

    def run(self, breakpoints: list[Breakpoint] | None = None,
            max_positions: int | None = None) -> None:
        dbg = self.worker.debugger
        if dbg is not None:
            dbg.clear_pause()  # a stale request must not pause this run at once
        self._set_running(True)
        self._sig_run.emit(list(breakpoints) if breakpoints else None, max_positions)

    def step_token(self) -> None:
        self._sig_step_token.emit()

    def step_layer(self) -> None:
        self._sig_step_layer.emit()

    def go_to(self, index: int) -> None:
        self._sig_go_to.emit(index)

    def set_interventions(self, interventions: list[Intervention]) -> None:
        """Apply interventions on the worker (a recomputation: Pause and Stop end it early)."""
        dbg = self.worker.debugger
        if dbg is not None:
            dbg.clear_pause()
        self._set_running(True)
        self._sig_interventions.emit(list(interventions))

    def set_routing(self, routing: str, epsilon: float | None) -> None:
        """Change the run's routing on the worker (a recomputation: Pause and Stop end it
        early)."""
        dbg = self.worker.debugger
        if dbg is not None:
            dbg.clear_pause()
        self._set_running(True)
        self._sig_routing.emit(routing, epsilon)

    def pause(self) -> None:
        dbg = self.worker.debugger
        if dbg is not None:
            dbg.request_pause()

    def stop(self) -> None:
        """Stop the run; a paused run is finished at once (nothing produced is lost)."""
        dbg = self.worker.debugger
        if dbg is not None:
            dbg.request_stop()
            if not self.running:
                self.run(max_positions=0)  # the run loop sees the stop flag first

    def shutdown(self) -> None:
        """Stop any run, free the session on its own thread, and join the thread."""
        self.stop()
        self._sig_close.emit()
        self.thread.quit()
        self.thread.wait()
