"""One GGUF file or safetensors checkpoint in an Inspector tab (`QtForeignFileView`).

Shows a `ForeignDocument`: the plain explanation and the validation report, the metadata as a
table (GGUF key/values with their offsets; safetensors `__metadata__` and index), the tensor
table (GGUF block types as dtypes, stacked experts marked), and beside them the hexdump with the
header structures and every tensor as regions. Selecting a tensor moves the hexdump to its bytes
and computes its values' statistics and histogram on a worker (and, for a stacked expert tensor,
the per-expert comparison), so the UI never waits for a read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QPushButton, QSplitter, QTableView,
                               QTableWidget, QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget)

from colibri.inspection.foreign import ForeignDocument, can_run, import_for_debugger
from colibri.inspector.hexview import QtHexView
from colibri.inspector.tasks import Task, TaskRunner
from colibri.inspector.tensor_table import QtTensorTable
from colibri.inspector.validation_view import ProblemTableModel

TAB_NAMES = ("validation", "metadata", "tensors", "values")


def _table(headers: list[str], rows: list[list[str]], parent: QWidget) -> QTableWidget:
    table = QTableWidget(len(rows), len(headers), parent)
    table.setHorizontalHeaderLabels(headers)
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            item = QTableWidgetItem(text)
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
            table.setItem(r, c, item)
    table.horizontalHeader().setStretchLastSection(True)
    table.verticalHeader().setVisible(False)
    return table


class QtForeignFileView(QWidget):
    """A tab for a GGUF file or a safetensors checkpoint (see the module docstring)."""

    sig_values_ready = Signal(object)
    sig_imported = Signal(str)          # the .colibri import to open in the debugger
    sig_import_failed = Signal(str)

    def __init__(self, doc: ForeignDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.path = doc.path
        self.runner = TaskRunner(self)
        self.runner.sig_finished.connect(self._values_done)
        self.importer = TaskRunner(self)
        self.importer.sig_finished.connect(self._imported)
        self.importer.sig_failed.connect(self._import_failed)
        self.tabs = QTabWidget(self)
        self.explanation = QLabel(doc.explanation() or f"{doc.format}: valid", self)
        self.explanation.setWordWrap(True)
        self.problems = ProblemTableModel(self)
        self.problems.set_problems(doc.problems)
        self.problem_view = QTableView(self)
        self.problem_view.setModel(self.problems)
        report = QWidget(self)
        box = QVBoxLayout(report)
        box.addWidget(self.explanation)
        self.run_button = QPushButton("Run in the debugger", self)  # above the hexdump
        self.run_button.setToolTip("Import this GGUF file into Colibri's cache (once per file "
                                   "version) and open it in the debugger")
        self.run_button.setVisible(can_run(doc))
        self.run_button.clicked.connect(self.run_in_debugger)
        box.addWidget(self.problem_view, 1)
        self.tabs.addTab(report, "Validation")
        meta = doc.metadata_rows()
        self.metadata = _table(["key", "type", "value", "offset"],
                               [[m.key, m.type, m.value, f"0x{m.offset:X}" if m.size else ""]
                                for m in meta], self)
        self.tabs.addTab(self.metadata, "Metadata")
        self.tensor_table = QtTensorTable(self)
        # The table's filter proxy visits every row in Python when rows are set (about 0.3 ms
        # a row), so the rows go in after the tab's first paint.
        QTimer.singleShot(0, self._fill_tensor_table)
        self.tabs.addTab(self.tensor_table, "Tensors")
        self.values_label = QLabel("Select a tensor to see its values.", self)
        self.values_label.setWordWrap(True)
        self.experts = _table(["expert", "norm", "mean", "std"], [], self)
        values = QWidget(self)
        vbox = QVBoxLayout(values)
        vbox.addWidget(self.values_label)
        vbox.addWidget(self.experts, 1)
        self.tabs.addTab(values, "Values")
        self.hex = QtHexView(self)
        self.shard = QComboBox(self)
        for path in doc.shard_paths():
            self.shard.addItem(path.rsplit("/", 1)[-1])
        self.shard.setVisible(self.shard.count() > 1)
        self.shard.currentIndexChanged.connect(self._show_shard)
        right = QWidget(self)
        rbox = QVBoxLayout(right)
        rbox.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.shard, 1)
        if self.shard.count() <= 1:
            top.addStretch(1)  # keep the button its own size beside no shard choice
        top.addWidget(self.run_button)
        rbox.addLayout(top)
        rbox.addWidget(self.hex, 1)
        self.splitter = QSplitter(self)
        self.splitter.addWidget(self.tabs)
        self.splitter.addWidget(right)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.splitter)
        self._show_shard(0)
        self.tensor_table.sig_tensor_selected.connect(self.show_tensor)
        self.tabs.setCurrentIndex(0 if doc.problems or doc.file is None else 2)
        self._filled = False
        self.summary: Any = None

    def _fill_tensor_table(self) -> None:
        if not self._filled:
            self._filled = True
            self.tensor_table.set_rows(self.doc.tensor_rows())

    def _show_shard(self, index: int) -> None:
        self.hex.set_source(self.doc.source(max(index, 0)))
        self.hex.set_regions(self.doc.regions(max(index, 0)))

    def show_tab(self, name: str) -> None:
        self.tabs.setCurrentIndex(TAB_NAMES.index(name))

    def show_tensor(self, name: str) -> None:
        """Move the hexdump to the tensor's bytes and compute its values on a worker."""
        self._fill_tensor_table()
        f = self.doc.file
        if f is None or name not in f:
            return
        t = f.tensor_info(name)
        paths = self.doc.shard_paths()
        if t.path and t.path in paths and paths.index(t.path) != self.shard.currentIndex():
            self.shard.setCurrentIndex(paths.index(t.path))
        self.hex.goto(t.offset, max(1, min(t.nbytes, 1 << 20)))
        self.values_label.setText(f"{name}: reading values…")
        doc, stacked = self.doc, t.name.endswith("_exps.weight") and len(t.shape) == 3

        def compute(progress: Any, cancelled: Any) -> tuple[str, Any, Any]:
            summary = doc.summary(name)
            experts = doc.expert_comparison(name) if stacked else []
            return name, summary, experts
        self.runner.start(Task(f"values of {name}", compute))

    def _values_done(self, result: Any) -> None:
        name, s, experts = result
        self.summary = s
        self.values_label.setText(
            f"{name}: {s.count} values, min {s.min:.6g}, max {s.max:.6g}, mean {s.mean:.6g}, "
            f"std {s.std:.6g}, NaN {s.nan_count}, Inf {s.inf_count}; histogram peak "
            f"{int(np.max(s.histogram)) if s.histogram.size else 0} in 100 bins")
        self.experts.setRowCount(len(experts))
        for r, (e, norm, mean, std) in enumerate(experts):
            for c, text in enumerate((str(e), f"{norm:.6g}", f"{mean:.6g}", f"{std:.6g}")):
                self.experts.setItem(r, c, QTableWidgetItem(text))
        self.sig_values_ready.emit(result)

    def run_in_debugger(self) -> None:
        """Import the file on a worker; `sig_imported(path)` when the import is ready."""
        if not can_run(self.doc) or self.importer.is_running():
            return
        self.run_button.setEnabled(False)
        path = self.doc.path
        self.importer.start(Task(f"import {self.doc.name}",
                                 lambda progress, cancelled: import_for_debugger(path)))

    def _imported(self, target: Any) -> None:
        self.run_button.setEnabled(True)
        self.sig_imported.emit(str(target))

    def _import_failed(self, message: str) -> None:
        self.run_button.setEnabled(True)
        self.sig_import_failed.emit(message)

    def validation_state(self) -> str:
        return self.doc.status

    def shutdown(self) -> None:
        self.runner.cancel()
        self.importer.cancel()


__all__ = ["QtForeignFileView", "TAB_NAMES"]
