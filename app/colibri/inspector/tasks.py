"""Running file-wide work off the UI thread, with progress and cancel.

A `Task` wraps a plain function `fn(progress, cancelled) -> result` written without Qt:
`progress(done, total, text="")` reports, `cancelled()` says whether to stop (the function then
raises `colibri.values.Cancelled`, the one exception for it, or returns early).
`TaskRunner.start(task)` runs it on a `QThread` and delivers signals on the UI thread:
`sig_progress(done, total, text)`, `sig_finished(result)`, `sig_failed(message)`,
`sig_cancelled()`. The engine's C calls release the GIL, so the UI keeps painting while a worker
checksums a file.

Progress signals are rate-limited (at most one per 50 ms) so a fast loop cannot flood the event
queue.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from colibri.values import CancelFlag, Cancelled, Progress

TaskFn = Callable[[Progress, CancelFlag], Any]

_PROGRESS_INTERVAL_S = 0.05


@dataclass
class Task:
    name: str
    fn: TaskFn


class _Worker(QObject):
    sig_progress = Signal("qlonglong", "qlonglong", str)  # byte counts pass 2**31
    sig_finished = Signal(object)
    sig_failed = Signal(str)
    sig_cancelled = Signal()

    def __init__(self, task: Task, cancel_event: threading.Event) -> None:
        super().__init__()
        self._task = task
        self._cancel = cancel_event
        self._last_progress = 0.0

    def _progress(self, done: int, total: int, text: str = "") -> None:
        now = time.monotonic()
        if done >= total or now - self._last_progress >= _PROGRESS_INTERVAL_S:
            self._last_progress = now
            self.sig_progress.emit(int(done), int(total), text)

    @Slot()
    def run(self) -> None:
        try:
            result = self._task.fn(self._progress, self._cancel.is_set)
        except Cancelled:
            self.sig_cancelled.emit()
            return
        except Exception as exc:  # a worker must report, never die silently
            self.sig_failed.emit(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
            return
        if self._cancel.is_set():
            self.sig_cancelled.emit()
        else:
            self.sig_finished.emit(result)


class TaskRunner(QObject):
    """Runs one task at a time on its own thread; starting a new task cancels the previous one."""

    sig_started = Signal(str)
    sig_progress = Signal("qlonglong", "qlonglong", str)  # byte counts pass 2**31
    sig_finished = Signal(object)
    sig_failed = Signal(str)
    sig_cancelled = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread: QThread | None = None
        self._worker: _Worker | None = None
        self._cancel = threading.Event()
        self._retired: list[tuple[QThread, _Worker | None]] = []
        self.task_name = ""

    def _forget(self, thread: QThread) -> None:
        self._retired = [(t, w) for t, w in self._retired if t is not thread]

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.isRunning()

    def start(self, task: Task) -> None:
        self.cancel()
        if not self.wait(2000):
            # Still running (a long C call): keep it referenced until it ends; a QThread object
            # destroyed while running aborts the process.
            old = self._thread
            assert old is not None
            self._retired.append((old, self._worker))
            old.finished.connect(lambda t=old: self._forget(t))
            self._thread = None
        self._cancel = threading.Event()
        self.task_name = task.name
        thread = QThread()
        worker = _Worker(task, self._cancel)
        worker.moveToThread(thread)
        thread.started.connect(worker.run)
        worker.sig_progress.connect(self.sig_progress)
        worker.sig_finished.connect(self.sig_finished)
        worker.sig_failed.connect(self.sig_failed)
        worker.sig_cancelled.connect(self.sig_cancelled)
        # QThread.quit is thread-safe; a direct call lets wait() on the UI thread return without
        # the UI thread's event loop having to deliver a queued quit (which wait() would block).
        for done in (worker.sig_finished, worker.sig_failed, worker.sig_cancelled):
            done.connect(thread.quit, Qt.ConnectionType.DirectConnection)
        self._thread, self._worker = thread, worker
        thread.start()
        self.sig_started.emit(task.name)

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout_ms: int = 30000) -> bool:
        """Block until the current thread (if any) has stopped. For shutdown and tests."""
        if self._thread is None:
            return True
        finished = self._thread.wait(timeout_ms)
        if finished:
            self._thread = None
            self._worker = None
        return finished
