"""The validation report: every problem of one document, and the data checks' controls.

`QtValidationReport` shows a plain-language banner (the document's `plain_explanation()`), a
summary, and a table of problems (severity, code, message, offset, tensor) backed by a lazy
`ProblemTableModel`. The document is a `ModelDocument` or a GGUF/safetensors
`ForeignDocument`: both give `problems`, `status`, `opened`, `generation`, `kind` and
`stores_checksums`. It runs nothing itself: Run and Cancel emit `sig_run_requested` /
`sig_cancel_requested`; the file view runs the document's data check on a `TaskRunner` and
feeds progress and the result back. Clicking a problem emits `sig_problem_selected(offset, tensor)`
(a 64-bit offset: files are larger than 2 GiB).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QHBoxLayout, QHeaderView, QLabel,
                               QProgressBar, QPushButton, QSizePolicy, QTableView, QVBoxLayout,
                               QWidget)

from colibri.engine import Problem
from colibri.inspection.document import DataCheckResult, merge_problems
from colibri.inspector import resources
from colibri.inspector.table_model import ColumnTableModel, Index


def short_code(code_name: str) -> str:
    """'COL_ERR_SHAPE' -> 'SHAPE' (the table's code column)."""
    return code_name.removeprefix("COL_ERR_")


class ProblemTableModel(ColumnTableModel):
    """A read-only table over a list of `Problem` values, sortable by any column."""

    COLUMNS = ("Severity", "Code", "Message", "Offset", "Tensor")

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._problems: list[Problem] = []
        self._icons = {"error": resources.icon("error"), "warning": resources.icon("warning")}

    def set_problems(self, problems: list[Problem]) -> None:
        self.beginResetModel()
        self._problems = list(problems)
        self.endResetModel()

    def problem(self, row: int) -> Problem:
        return self._problems[row]

    @property
    def problems(self) -> list[Problem]:
        return list(self._problems)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 (Qt API)
        return 0 if parent.isValid() else len(self._problems)

    def _key(self, p: Problem, column: int) -> Any:
        return (p.severity, short_code(p.code_name), p.message, p.offset, p.tensor)[column]

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        p = self._problems[index.row()]
        column = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if column == 3:
                return f"0x{p.offset:X}"
            return str(self._key(p, column))
        if role == Qt.ItemDataRole.DecorationRole and column == 0:
            return self._icons.get(p.severity)
        if role == Qt.ItemDataRole.ToolTipRole:
            return str(p)
        if role == Qt.ItemDataRole.UserRole:
            return self._key(p, column)
        return None

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        self.layoutAboutToBeChanged.emit()
        self._problems.sort(key=lambda p: self._key(p, column),
                            reverse=order == Qt.SortOrder.DescendingOrder)
        self.layoutChanged.emit()


class QtValidationReport(QWidget):
    """The validation report of one document (see the module docstring)."""

    sig_problem_selected = Signal("qlonglong", str)
    sig_run_requested = Signal(bool, bool)     # checksums, nan_check
    sig_cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc: Any = None   # a ModelDocument or a ForeignDocument
        self._data: DataCheckResult | None = None
        self._running = False

        self.explanation = QLabel()
        self.explanation.setObjectName("explanation")
        self.explanation.setWordWrap(True)
        self.explanation.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.summary = QLabel()
        self.summary.setObjectName("summary")
        self.summary.setWordWrap(True)

        self.checksums = QCheckBox("Checksums (CRC-32 of every tensor)")
        self.checksums.setChecked(True)
        self.nan_check = QCheckBox("NaN / Inf scan")
        self.nan_check.setChecked(True)
        self.run_button = QPushButton(resources.icon("validate"), "Run data checks")
        self.run_button.setToolTip("Read every byte of tensor data (F5)")
        self.cancel_button = QPushButton(resources.icon("cancel"), "Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setRange(0, 10_000)
        self.progress.setTextVisible(True)
        # Fixed sizes, kept when hidden: progress updates every 50 ms must not relayout the view.
        self.progress.setFixedWidth(160)
        policy = self.progress.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.progress.setSizePolicy(policy)
        self.progress.setVisible(False)
        self.progress_text = QLabel()
        # Ignored width: the text changes every 50 ms and must neither relayout the view nor set
        # its minimum width (it is elided to whatever room there is).
        self.progress_text.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

        self.model = ProblemTableModel(self)
        self.table = QTableView()
        self.table.setObjectName("problemTable")
        self.table.setModel(self.model)
        self.table.setSortingEnabled(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(False)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        header.setSortIndicatorShown(True)
        header.setSectionsClickable(True)
        header.sectionClicked.connect(self._sort_by)
        self.table.setColumnWidth(0, 90)
        self.table.setColumnWidth(1, 140)
        self.table.setColumnWidth(3, 110)
        self.table.setColumnWidth(4, 180)

        # what to check on one line, the buttons and progress on the next, so the view stays
        # narrow enough to sit beside the hexdump on a 1280-pixel screen
        options = QHBoxLayout()
        options.addWidget(self.checksums)
        options.addWidget(self.nan_check)
        options.addStretch(1)
        controls = QHBoxLayout()
        controls.addWidget(self.run_button)
        controls.addWidget(self.cancel_button)
        controls.addWidget(self.progress)
        controls.addWidget(self.progress_text, 1)

        layout = QVBoxLayout(self)
        layout.addWidget(self.explanation)
        layout.addWidget(self.summary)
        layout.addLayout(options)
        layout.addLayout(controls)
        layout.addWidget(self.table, 1)

        self.run_button.clicked.connect(self._request_run)
        self.cancel_button.clicked.connect(self.sig_cancel_requested)
        self.table.clicked.connect(self._clicked)
        self.table.activated.connect(self._clicked)
        self._sort_order = Qt.SortOrder.AscendingOrder
        self._sort_column = -1

    # -- input ----------------------------------------------------------------------------------

    def set_document(self, doc: Any) -> None:
        """Show `doc`'s structural problems (data-check results of an older state are dropped)."""
        self._doc = doc
        self._data = None
        if doc is not None:
            self.checksums.setText("Checksums (CRC-32 of every tensor)" if doc.stores_checksums
                                   else "Read every tensor (no stored checksums)")
        self._refresh()

    def set_data_result(self, result: DataCheckResult) -> None:
        """Add a finished data check's problems (ignored if the document was reloaded since)."""
        if self._doc is None or result.generation != self._doc.generation:
            return
        self._data = result
        self._refresh()

    def set_running(self, running: bool) -> None:
        if running != self._running:
            self._running = running
            if running and self._data is None:
                self._refresh_banner()
        self.run_button.setEnabled(not running and self._doc is not None and self._doc.opened)
        self.cancel_button.setEnabled(running)
        self.progress.setVisible(running)
        if running:
            self.progress.setValue(0)
        else:
            self.progress_text.setText("")

    def set_progress(self, done: int, total: int, text: str = "") -> None:
        if self.progress.maximum() != max(total, 1):
            self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        metrics = self.progress_text.fontMetrics()
        self.progress_text.setText(metrics.elidedText(text, Qt.TextElideMode.ElideMiddle,
                                                      self.progress_text.width()))

    # -- output ---------------------------------------------------------------------------------

    @property
    def problems(self) -> list[Problem]:
        """The problems shown, in table order."""
        return self.model.problems

    def select_problem(self, row: int) -> None:
        """Select row `row` as a click would (emits sig_problem_selected)."""
        index = self.model.index(row, 0)
        self.table.setCurrentIndex(index)
        self._clicked(index)

    # -- internals ------------------------------------------------------------------------------

    def _request_run(self) -> None:
        self.sig_run_requested.emit(self.checksums.isChecked(), self.nan_check.isChecked())

    def _clicked(self, index: QModelIndex) -> None:
        if index.isValid():
            p = self.model.problem(index.row())
            self.sig_problem_selected.emit(p.offset, p.tensor)

    def _sort_by(self, column: int) -> None:
        if column == self._sort_column:
            self._sort_order = (Qt.SortOrder.DescendingOrder
                                if self._sort_order == Qt.SortOrder.AscendingOrder
                                else Qt.SortOrder.AscendingOrder)
        else:
            self._sort_column, self._sort_order = column, Qt.SortOrder.AscendingOrder
        self.table.horizontalHeader().setSortIndicator(column, self._sort_order)
        self.model.sort(column, self._sort_order)

    def _refresh(self) -> None:
        doc = self._doc
        if doc is None:
            self.model.set_problems([])
            self._set_banner("No file open.", "unreadable")
            self.summary.setText("")
            self.set_running(False)
            return
        problems = doc.problems
        if self._data is not None:
            problems = merge_problems(problems, self._data.problems)
        self.model.set_problems(problems)
        errors = sum(1 for p in problems if p.severity == "error")
        warnings = len(problems) - errors
        self._refresh_banner()
        parts = [f"{errors} error(s), {warnings} warning(s)"]
        if self._data is None:
            parts.append("structural checks only; run the data checks to read every tensor")
        else:
            read = "checksums" if doc.stores_checksums else "every tensor read"
            checks = " and ".join(c for c, on in ((read, self._data.checksums),
                                                   ("NaN/Inf scan", self._data.nan_check)) if on)
            ok = sum(1 for s in self._data.status.values() if s == "ok")
            parts.append(f"data checks ({checks}): {ok} of {len(self._data.status)} tensors ok")
        self.summary.setText("; ".join(parts))
        self.set_running(False)

    def _refresh_banner(self) -> None:
        doc = self._doc
        if doc is None:
            return
        errors = any(p.severity == "error" for p in doc.problems) or (
            self._data is not None and any(p.severity == "error" for p in self._data.problems))
        state = doc.status
        if self._data is not None and errors and state in ("valid", "warnings"):
            state = "invalid"
        text = doc.plain_explanation()
        reads = ("every tensor's checksum" if doc.stores_checksums
                 else "every byte of every tensor")
        if not text and self._data is None:
            # a valid structure says nothing about the bytes of the weights (one flipped bit)
            state = "unchecked"
            text = ("The file's structure is valid: every structural check passed. Its data is "
                    + (f"being checked now ({reads} and a NaN/Inf scan)."
                       if self._running else
                       f"not checked yet: Run data checks (F5) reads {reads} "
                       "and scans for NaN/Inf."))
        elif not text:
            found = ("found every tensor intact" if doc.stores_checksums else
                     "read every tensor (the format stores no checksums to compare)")
            text = (f"This is a valid {doc.kind}: every structural check passed, and the data "
                    f"checks {found}.")
        if self._data is not None and self._data.problems and doc.opened:
            bad = sum(1 for s in self._data.status.values() if s == "bad")
            why = ("the bytes changed after the file was written, or the weights contain "
                   "NaN/Inf values" if doc.stores_checksums else
                   "the weights contain NaN/Inf values")
            text = (f"The file's structure is valid, but the data checks found problems in "
                    f"{bad} tensor(s): {why}.")
        self._set_banner(text, state)

    def _set_banner(self, text: str, state: str) -> None:
        self.explanation.setText(text)
        self.explanation.setProperty("state", state)
        self.explanation.style().unpolish(self.explanation)
        self.explanation.style().polish(self.explanation)
