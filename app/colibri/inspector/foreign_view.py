"""One GGUF file or safetensors checkpoint in an Inspector tab (`QtForeignFileView`).

Shows a `ForeignDocument` with the views `.colibri` files have: the validation report with its
data checks (`QtValidationReport`), the metadata as a lazily fetched tree (`QtMetadataTree`:
GGUF key/values, arrays and tensor infos; safetensors JSON headers and the index), the tensor
table (`QtTensorTable`: GGUF block types as dtypes, routers and stacked or per-expert tensors
marked), and the tensor values (`QtTensorValues` over the document's `TensorStore`: statistics,
histogram, heatmap, every ggml block type dequantised, and the per-expert comparison of a MoE
layer). Beside them the hexdump shows one file at a time (a checkpoint's shards, then its
index) with the header structures and every tensor as regions; selecting a tensor, a metadata
node or a problem moves it to those bytes, in their file.

Opening validates every header, which grows with the number of tensors, so the document is
read on a worker: the tab paints at once and fills in when `sig_opened` comes. Data checks run
on a worker too (started by themselves for files up to `auto_check_bytes`), as does "Run in the
debugger" (a GGUF file of a supported family imported into the cache, then opened).
"""

from __future__ import annotations

import gc
import os
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QPushButton, QSplitter, QTabWidget,
                               QVBoxLayout, QWidget)

from colibri.files import atomic_write_csv
from colibri.inspection.document import DataCheckResult, validation_phrase
from colibri.inspection.foreign import (ForeignDocument, can_run, data_check,
                                        import_for_debugger)
from colibri.inspection.foreign_tree import metadata_tree
from colibri.inspection.tensors import TensorRow
from colibri.inspector.data_checks import DataCheckTab
from colibri.inspector.export import save_png
from colibri.inspector.hexview import QtHexView
from colibri.inspector.metadata_view import QtMetadataTree
from colibri.inspector.tasks import Task, TaskRunner
from colibri.inspector.tensor_table import QtTensorTable
from colibri.inspector.tensor_values import QtTensorValues, QtTensorValuesPage
from colibri.inspector.validation_view import QtValidationReport

TAB_NAMES = ("validation", "metadata", "tensors", "values")
# The main window's view names that mean one of these tabs here ("hex" shows the hexdump).
_ALIASES = {"header": "metadata"}


class QtForeignFileView(DataCheckTab, QWidget):
    """A tab for a GGUF file or a safetensors checkpoint (see the module docstring)."""

    sig_opened = Signal()               # the document is read and every view shows it
    sig_status_changed = Signal()
    sig_progress = Signal("qlonglong", "qlonglong", str)
    sig_imported = Signal(str)          # the .colibri import to open in the debugger
    sig_import_failed = Signal(str)

    def __init__(self, path: str | os.PathLike[str], auto_check_bytes: int = 0,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = os.path.abspath(os.fspath(path))
        self.doc: ForeignDocument | None = None
        self.data_result: DataCheckResult | None = None
        self.auto_check_bytes = auto_check_bytes
        self._current_view = "validation"
        self._files: list[str] = []

        self.validation = QtValidationReport(self)
        self.validation.summary.setText(f"Reading {self.name}…")
        self.metadata = QtMetadataTree(self)
        self.tensors = QtTensorTable(self)
        self._values_page = QtTensorValuesPage(self)
        self.tabs = QTabWidget(self)
        self.tabs.setDocumentMode(True)
        for widget, title in ((self.validation, "Validation"), (self.metadata, "Metadata"),
                              (self.tensors, "Tensors"), (self._values_page, "Tensor values")):
            self.tabs.addTab(widget, title)

        self.hex = QtHexView(self)
        self.file_combo = QComboBox(self)
        self.file_combo.setToolTip("The file the hexdump shows")
        self.file_combo.setVisible(False)
        self.file_combo.currentIndexChanged.connect(self._show_file)
        self.run_button = QPushButton("Run in the debugger", self)
        self.run_button.setToolTip("Import this GGUF file into Colibri's cache (once per file "
                                   "version) and open it in the debugger")
        self.run_button.setVisible(False)
        self.run_button.clicked.connect(self.run_in_debugger)
        right = QWidget(self)
        rbox = QVBoxLayout(right)
        rbox.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.file_combo, 1)
        top.addStretch(0)
        top.addWidget(self.run_button)
        rbox.addLayout(top)
        rbox.addWidget(self.hex, 1)
        self.splitter = QSplitter(self)
        self.splitter.addWidget(self.tabs)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 0)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)

        self.opener = TaskRunner(self)
        self.opener.sig_finished.connect(self._opened)
        self.opener.sig_failed.connect(self._open_failed)
        self._connect_checks()
        self.importer = TaskRunner(self)
        self.importer.sig_progress.connect(self._import_progress)
        self.importer.sig_finished.connect(self._imported)
        self.importer.sig_failed.connect(self._import_failed)

        self.validation.sig_problem_selected.connect(self._problem_selected)
        self.metadata.sig_range_selected.connect(self.show_bytes)
        self.tensors.sig_tensor_selected.connect(self._tensor_selected)
        self.tabs.currentChanged.connect(self._tab_changed)

        path_now = self.path

        def read(_progress: Any, _cancelled: Any) -> tuple[ForeignDocument, list[TensorRow]]:
            doc = ForeignDocument(path_now)
            rows = doc.tensor_rows()
            # The full collection a checkpoint's tens of thousands of new objects are bound to
            # trigger, here and now instead of in whichever UI tick allocates next (20-40 ms).
            gc.collect()
            return doc, rows
        self.opener.start(Task(f"open {self.name}", read))

    # -- document -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip(os.sep))

    def is_open(self) -> bool:
        """Whether the document has been read (valid or not) and is shown."""
        return self.doc is not None

    def _opened(self, result: tuple[ForeignDocument, list[TensorRow]]) -> None:
        doc, rows = result
        self.doc = doc
        self.validation.set_document(doc)
        self.metadata.set_root(metadata_tree(doc))
        self.tensors.set_rows(rows)
        self._values_page.set_store(doc.store())
        self._files = doc.file_paths()
        self.file_combo.blockSignals(True)
        self.file_combo.clear()
        for path in self._files:
            self.file_combo.addItem(os.path.basename(path))
        self.file_combo.blockSignals(False)
        self.file_combo.setVisible(len(self._files) > 1)
        self.run_button.setVisible(can_run(doc))
        self._show_file(0)
        self.set_view("validation" if doc.problems or not doc.opened else "tensors")
        if doc.opened and doc.size <= self.auto_check_bytes:
            self.run_checks(True, True)
        self.sig_status_changed.emit()
        self.sig_opened.emit()

    def _open_failed(self, message: str) -> None:   # pragma: no cover (the document never raises)
        self.validation.summary.setText(f"{self.name} could not be read: {message.splitlines()[0]}")
        self.sig_status_changed.emit()

    def validation_state(self) -> str:
        """One phrase for the status bar."""
        doc = self.doc
        if doc is None:
            return "reading…"
        if doc.status == "unreadable":
            return "unreadable"
        return validation_phrase(doc.problems, doc.opened, self.data_result, self._checking)

    # -- data checks ----------------------------------------------------------------------------

    def run_checks(self, checksums: bool = True, nan_check: bool = True) -> None:
        """Start the data checks (every tensor read, NaN/Inf scan) on a worker."""
        if self.doc is None or not self.doc.opened or not (checksums or nan_check):
            return
        self._start_checks(data_check(self.doc, checksums, nan_check))

    # -- navigation -----------------------------------------------------------------------------

    def _show_file(self, index: int) -> None:
        if self.doc is None or index < 0:
            return
        if self.file_combo.currentIndex() != index:
            self.file_combo.setCurrentIndex(index)   # comes back here through the signal
            return
        self.hex.set_source(self.doc.source(index))
        self.hex.set_regions(self.doc.regions(index))

    def show_bytes(self, file: int, offset: int, size: int = 1) -> None:
        """Show bytes [offset, offset + size) of file `file` (of `doc.file_paths()`)."""
        if 0 <= file < len(self._files) and file != self.file_combo.currentIndex():
            self._show_file(file)
        self.hex.goto(int(offset), max(1, min(int(size), 1 << 20)))

    def show_tensor(self, name: str, expert: int | None = None) -> bool:
        """Select tensor `name` in the table: its bytes in the hexdump, its values."""
        return self.tensors.select_tensor(name, expert)

    def _tensor_selected(self, name: str) -> None:
        row = self.tensors.selected_row()
        if row is None or self.doc is None or self.doc.file is None:
            return
        info = self.doc.file.tensor_info(name)
        file = self._files.index(info.path) if info.path in self._files else 0
        self.show_bytes(file, row.offset, row.nbytes)
        expert = row.expert
        self._values_page.show_tensor(name, expert,
                                      self.tabs.currentWidget() is self._values_page)

    def _problem_selected(self, offset: int, tensor: str) -> None:
        doc = self.doc
        if doc is None:
            return
        if tensor and doc.file is not None and tensor in doc.file:
            self.tensors.select_tensor(tensor)
        problem = next((p for p in self.validation.problems
                        if p.offset == offset and p.tensor == tensor), None)
        self.show_bytes(doc.file_of(problem) if problem is not None else 0, offset, 1)

    @property
    def values(self) -> QtTensorValues:
        """The tensor values view, built on first use."""
        return self._values_page.view

    # -- views ----------------------------------------------------------------------------------

    def set_view(self, name: str) -> None:
        """Show tab `name` (TAB_NAMES; "header" is the metadata, "hex" focuses the hexdump;
        the debugger's views do not apply here)."""
        name = _ALIASES.get(name, name)
        if name == "hex":
            self.hex.setFocus()
            self._current_view = "hex"
            return
        if name in TAB_NAMES:
            self.tabs.setCurrentIndex(TAB_NAMES.index(name))

    def current_view(self) -> str:
        return self._current_view

    def _tab_changed(self, index: int) -> None:
        self._current_view = TAB_NAMES[index] if 0 <= index < len(TAB_NAMES) else "validation"
        if self._current_view == "values":
            _ = self.values   # build it now that it is shown

    def export_csv(self, path: str) -> None:
        """The current tab's table as CSV (validation, tensors)."""
        if self._current_view == "tensors":
            self.tensors.export_csv(path)
        elif self._current_view == "validation":
            atomic_write_csv(path, ["severity", "code", "message", "offset", "tensor"],
                             ([p.severity, p.code_name, p.message, p.offset, p.tensor]
                              for p in self.validation.problems))
        else:
            raise ValueError(f"the {self._current_view} view has no table to export")

    def export_png(self, path: str) -> None:
        if self._current_view == "values":
            self.values.export_png(path)
            return
        save_png(self.hex if self._current_view == "hex" else self.tabs.currentWidget(), path)

    # -- running a GGUF model -------------------------------------------------------------------

    def run_in_debugger(self) -> None:
        """Import the file on a worker; `sig_imported(path)` when the import is ready."""
        doc = self.doc
        if doc is None or not can_run(doc) or self.importer.is_running():
            return
        self.run_button.setEnabled(False)
        path = doc.path

        def work(progress: Any, _cancelled: Any) -> str:
            return import_for_debugger(path, lambda done, total: progress(done, total,
                                                                           "importing"))
        self.importer.start(Task(f"import {doc.name}", work))

    def _import_progress(self, done: int, total: int, _text: str) -> None:
        self.run_button.setText(f"Importing… {100 * done // max(total, 1)}%")

    def _imported(self, target: Any) -> None:
        self.run_button.setEnabled(True)
        self.run_button.setText("Run in the debugger")
        self.sig_imported.emit(str(target))

    def _import_failed(self, message: str) -> None:
        self.run_button.setEnabled(True)
        self.run_button.setText("Run in the debugger")
        self.sig_import_failed.emit(message)

    def shutdown(self) -> None:
        for runner in (self.opener, self.checks, self.importer):
            runner.cancel()
        if self._values_page.built is not None:
            self._values_page.built.cancel()


__all__ = ["QtForeignFileView", "TAB_NAMES"]
