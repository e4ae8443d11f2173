"""The data checks of a file tab, whatever the file: `DataCheckTab`, mixed into `FileView`
(.colibri) and `QtForeignFileView` (GGUF, safetensors).

One `TaskRunner` (`checks`) runs the document's data-check task on a worker; the validation
report follows it (running, progress, the result, a failure) and the tensor table shows each
tensor's outcome. A tab says what else a change means through two hooks: `_checks_running`
(started or stopped) and `_result_is_current` (whether a result still describes the document).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from colibri.inspection.document import DataCheckResult
from colibri.inspector.tasks import Task, TaskRunner
from colibri.inspector.tensor_table import QtTensorTable
from colibri.inspector.validation_view import QtValidationReport
from colibri.values import CancelFlag, Progress


class DataCheckTab:
    """Mixed in before QWidget; the tab has `validation`, `tensors`, `sig_progress` and
    `sig_status_changed`, defines `run_checks`, and calls `_connect_checks()` once while it is
    built (after `validation`)."""

    validation: QtValidationReport
    tensors: QtTensorTable
    sig_progress: Any
    sig_status_changed: Any
    checks: TaskRunner
    data_result: DataCheckResult | None = None
    _checking = False

    def run_checks(self, checksums: bool = True, nan_check: bool = True) -> None:
        """Start the data checks of the tab's document on the `checks` runner."""
        raise NotImplementedError

    def _connect_checks(self) -> None:
        """The runner, and the validation report's Run and Cancel buttons driving it."""
        self.validation.sig_run_requested.connect(self.run_checks)
        self.validation.sig_cancel_requested.connect(self.cancel_checks)
        self.checks = TaskRunner(self)  # type: ignore[arg-type]
        self.checks.sig_progress.connect(self._check_progress)
        self.checks.sig_finished.connect(self._checks_done)
        self.checks.sig_cancelled.connect(self._checks_stopped)
        self.checks.sig_failed.connect(self._checks_failed)

    def _start_checks(self, fn: Callable[[Progress, CancelFlag], DataCheckResult]) -> None:
        self.checks.start(Task("data checks", fn))
        self._checking = True
        self.validation.set_running(True)
        self._checks_running(True)
        self.sig_status_changed.emit()

    def cancel_checks(self) -> None:
        self.checks.cancel()

    def is_checking(self) -> bool:
        return self._checking

    def _checks_running(self, running: bool) -> None:
        """Hook: the checks started (True) or stopped (False)."""

    def _result_is_current(self, result: DataCheckResult) -> bool:
        """Hook: whether `result` still describes the document (a reload may have come since)."""
        return True

    def _check_progress(self, done: int, total: int, text: str) -> None:
        self.validation.set_progress(done, total, text)
        self.sig_progress.emit(done, total, text)

    def _checks_done(self, result: DataCheckResult) -> None:
        if self._result_is_current(result):
            self.data_result = result
            self.validation.set_data_result(result)
            self.tensors.set_check_status(dict(result.status))
        self._checks_stopped()

    def _checks_stopped(self) -> None:
        self._checking = False
        self.validation.set_running(False)
        self._checks_running(False)
        self.sig_status_changed.emit()

    def _checks_failed(self, message: str) -> None:
        self.validation.summary.setText(f"The check failed: {first_line(message)}")
        self._checks_stopped()


def first_line(message: str) -> str:
    """A worker's error message as one line for a status ("failed" when it is empty)."""
    return message.splitlines()[0] if message else "failed"
