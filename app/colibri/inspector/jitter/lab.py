"""`QtJitterLab`: the routing-jitter lab as one dockable widget.

Controls (prompt text or token ids, greedy continuation length, variants, epsilon list,
the remedies' epsilon, cache thresholds and expert cache, threads) start the analysis on a
`TaskRunner` worker (colibri.jitter.passes: one report, or all three with their passes shared;
progress bar, Cancel between runs); results arrive as report objects and feed the views of
colibri.inspector.jitter.views. Clicking a cell of either heatmap opens the token tab on that
cell. `state()` / `restore(state)` give the reports as JSON-ready dicts for the Inspector's
session file, and Save/Load write and read them as one JSON file.

The lead docks it with `lab = QtJitterLab(); lab.set_model(model)`: the open colibri.Model of
the tab. The worker runs sessions on that model (a Model is immutable and any thread may create
sessions on it); weight-precision copies are the worker's own, removed when it ends.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QGridLayout, QHBoxLayout, QLabel, QLineEdit, QProgressBar,
                               QPushButton, QSpinBox, QTabWidget, QVBoxLayout,
                               QWidget)

from colibri.files import atomic_write_bytes
from colibri.inspector.export import load_with_dialog, save_with_dialog
from colibri.inspector.jitter.views import (QtCellLogits, QtEpsilonCurve, QtFlipsVsMargin,
                                            QtJitterHeatmap, QtMarginHeatmap, QtRemedies,
                                            QtRoutingAB)
from colibri.inspector.prompt import (NO_TOKENIZER, QtPromptEdit, example_prompt, placeholder,
                                      token_ids)
from colibri.inspector.readout import wrapping
from colibri.inspector.tasks import Task, TaskRunner
from colibri.jitter.analysis import (SCHEMA_EPSILON, SCHEMA_JITTER, EpsilonReport, JitterReport,
                                     Runner, parse_eps)
from colibri.jitter.passes import KINDS, LabReports, analyze_lab
from colibri.jitter.remedies import SCHEMA_REMEDIES, RemedyReport, parse_thresholds
from colibri.jitter.variants import parse_variants

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

def _parse_prompt(text: str, model: Model) -> list[int]:
    """The prompt's token ids (colibri.inspector.prompt.token_ids, else the tokenizer's)."""
    ids = token_ids(text)
    if ids is not None:
        return ids
    if model.tokenizer is None:
        raise ValueError(NO_TOKENIZER)
    return list(model.tokenizer.encode(text).ids)


def make_task(model: Model, kind: str, prompt: str, generate: int, variants: str, eps: str,
              threads: int, remedy_eps: str = "", thresholds: str = "",
              expert_cache: int = 0) -> Task:
    """A TaskRunner task computing one report ('jitter', 'epsilon' or 'remedies') or all three
    ('all', their passes shared) on the open `model`; its result is (kind, LabReports).
    Qt-free body."""
    variant_list = parse_variants(variants or None)
    eps_list = parse_eps(eps or None)
    threshold_list = parse_thresholds(thresholds)
    try:
        stable_eps = float(remedy_eps) if remedy_eps.strip() else None
    except ValueError:
        raise ValueError(f"remedy epsilon {remedy_eps!r} is not a number") from None
    kinds = KINDS if kind == "all" else (kind,)

    def fn(progress: Any, cancelled: Any) -> tuple[str, LabReports]:
        with Runner(model, threads=threads) as runner:
            prompt_ids = _parse_prompt(prompt, model)
            tokens = runner.greedy_sequence(prompt_ids, generate)
            return kind, analyze_lab(runner, tokens, variant_list, kinds=kinds, eps=eps_list,
                                     remedy_eps=stable_eps, cache_thresholds=threshold_list,
                                     expert_cache=expert_cache, n_prompt=len(prompt_ids),
                                     progress=progress, cancelled=cancelled)

    return Task(f"jitter lab: {kind}", fn)


class QtJitterLab(QWidget):
    """The routing-jitter lab: controls, progress, and the jitter/token/epsilon/A-B views."""

    sig_report_ready = Signal(str)   # "jitter", "epsilon", "remedies" or "all"
    sig_failed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model: Model | None = None
        self.path: str | None = None
        self.jitter_report: JitterReport | None = None
        self.epsilon_report: EpsilonReport | None = None
        self.remedy_report: RemedyReport | None = None
        self.runner = TaskRunner(self)

        self.prompt = QtPromptEdit(self)
        self.prompt.setPlaceholderText(placeholder(True))
        self.generate = QSpinBox(self)
        self.generate.setRange(0, 4096)
        self.generate.setValue(16)
        self.variants = QLineEdit(self)
        self.variants.setPlaceholderText("default list (seq, pairwise, blocked4..32 +-fma, split, dot-bf16, "
                                         "act-bf16/f16, kv-f16, w-f32/f16/bf16, noise1/2/4)")
        self.variants.setToolTip("comma-separated variants; each joins components with '+' "
                                 "(docs/jitter.md); empty: the default list")
        self.eps = QLineEdit(self)
        self.eps.setPlaceholderText("0,1e-10,1e-9,1e-8,1e-7,1e-6,1e-5")
        self.threads = QSpinBox(self)
        self.threads.setRange(1, 256)
        self.remedy_eps = QLineEdit(self)
        self.remedy_eps.setPlaceholderText("model default")
        self.remedy_eps.setToolTip("stable top-k's epsilon in the remedies comparison")
        self.thresholds = QLineEdit(self)
        self.thresholds.setPlaceholderText("2 x the largest flipped margin")
        self.thresholds.setToolTip("cached routing's thresholds, comma-separated: a row each")
        self.expert_cache = QSpinBox(self)
        self.expert_cache.setRange(0, 4096)
        self.expert_cache.setSpecialValueText("none")
        self.expert_cache.setToolTip("the hit rate of an LRU of this many experts per MoE layer")
        self.run_jitter_button = QPushButton("Run jitter", self)
        self.run_epsilon_button = QPushButton("Run epsilon sweep", self)
        self.run_all_button = QPushButton("Run all three", self)
        self.run_all_button.setToolTip("the jitter report, the epsilon sweep and the remedies "
                                       "comparison on one sequence, their passes shared")
        self.run_remedies_button = QPushButton("Compare remedies", self)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setEnabled(False)
        self.save_button = QPushButton("Save…", self)
        self.load_button = QPushButton("Load…", self)
        self.progress = QProgressBar(self)
        self.status = wrapping(QLabel("open a model", self))

        # three rows, so the plots keep most of a 800-pixel-high window
        form = QGridLayout()
        form.addWidget(QLabel("prompt", self), 0, 0)
        form.addWidget(self.prompt, 0, 1, 1, 3)
        form.addWidget(QLabel("variants", self), 1, 0)
        form.addWidget(self.variants, 1, 1)
        form.addWidget(QLabel("epsilons", self), 1, 2)
        form.addWidget(self.eps, 1, 3)
        form.setColumnStretch(1, 3)
        form.setColumnStretch(3, 2)
        buttons = QHBoxLayout()
        for label, spin in (("generate", self.generate), ("threads", self.threads)):
            buttons.addWidget(QLabel(label, self))
            buttons.addWidget(spin)
        for b in (self.run_jitter_button, self.run_epsilon_button, self.run_all_button,
                  self.cancel_button, self.save_button, self.load_button):
            buttons.addWidget(b)
        buttons.addWidget(self.progress, 1)

        self.heatmap = QtJitterHeatmap(self)
        self.margins = QtMarginHeatmap(self)
        self.scatter = QtFlipsVsMargin(self)
        self.token = QtCellLogits(self)
        self.curve = QtEpsilonCurve(self)
        self.ab = QtRoutingAB(self)
        self.remedies = QtRemedies(self)
        jitter_tab = QWidget(self)
        jl = QHBoxLayout(jitter_tab)
        jl.addWidget(self.heatmap, 1)
        jl.addWidget(self.margins, 1)
        jl.addWidget(self.scatter, 1)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(jitter_tab, "Jitter")
        self.tabs.addTab(self.token, "Token")
        self.tabs.addTab(self.curve, "Epsilon")
        self.tabs.addTab(self.ab, "A/B")
        # the remedies' own settings sit on their tab, so the form keeps three rows
        remedies_tab = QWidget(self)
        controls = QHBoxLayout()
        for label, widget in (("stable eps", self.remedy_eps),
                              ("cache thresholds", self.thresholds),
                              ("expert cache", self.expert_cache)):
            controls.addWidget(QLabel(label, self))
            controls.addWidget(widget, 0 if widget is self.expert_cache else 1)
        controls.addWidget(self.run_remedies_button)
        rl = QVBoxLayout(remedies_tab)
        rl.addLayout(controls)
        rl.addWidget(self.remedies, 1)
        self.tabs.addTab(remedies_tab, "Remedies")

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.tabs, 1)

        self.run_jitter_button.clicked.connect(lambda: self.start("jitter"))
        self.run_epsilon_button.clicked.connect(lambda: self.start("epsilon"))
        self.run_remedies_button.clicked.connect(lambda: self.start("remedies"))
        self.run_all_button.clicked.connect(lambda: self.start("all"))
        self.cancel_button.clicked.connect(self.cancel)
        self.save_button.clicked.connect(self._save_dialog)
        self.load_button.clicked.connect(self._load_dialog)
        self.heatmap.sig_cell_selected.connect(self.select_cell)
        self.margins.sig_cell_selected.connect(self.select_cell)
        self.runner.sig_progress.connect(self._progress)
        self.runner.sig_finished.connect(self._finished)
        self.runner.sig_failed.connect(self._failed)
        self.runner.sig_cancelled.connect(self._cancelled)
        self._set_running(False)

    # -- model and runs -------------------------------------------------------------------------

    def set_model(self, model: Model | None) -> None:
        """The open model to analyse (None clears). Keeps computed reports only when the file
        is the same."""
        path = None if model is None else model.path
        if path != self.path:
            self.set_reports(None, None)
            self.set_remedies(None)
        self.model, self.path = model, path
        if model is not None:
            self.expert_cache.setMaximum(model.hparams.n_experts)
            self.prompt.setPlaceholderText(placeholder(model.tokenizer is not None))
            if not self.prompt.text():
                self.prompt.setText(example_prompt(model))
        self.status.setText("open a model" if path is None else f"model: {os.path.basename(path)}")
        self._set_running(False)

    def start(self, kind: str) -> None:
        if self.model is None:
            return
        if not self.prompt.text():
            self.status.setText("enter a prompt: text, or token ids separated by commas")
            return
        try:
            task = make_task(self.model, kind, self.prompt.text(),
                             self.generate.value(), self.variants.text(), self.eps.text(),
                             self.threads.value(), self.remedy_eps.text(),
                             self.thresholds.text(), self.expert_cache.value())
        except ValueError as exc:
            self.status.setText(f"error: {exc}")
            self.sig_failed.emit(str(exc))
            return
        self._set_running(True)
        self.status.setText(f"running {kind}…")
        self.runner.start(task)

    def cancel(self) -> None:
        self.runner.cancel()

    def _set_running(self, running: bool) -> None:
        self.cancel_button.setEnabled(running)
        idle = not running and self.path is not None
        self.run_jitter_button.setEnabled(idle)
        self.run_epsilon_button.setEnabled(idle)
        self.run_remedies_button.setEnabled(idle)
        self.run_all_button.setEnabled(idle)

    def _progress(self, done: int, total: int, text: str) -> None:
        self.progress.setRange(0, int(total))
        self.progress.setValue(int(done))
        self.status.setText(f"{done}/{total} {text}")

    def _finished(self, result: tuple[str, LabReports]) -> None:
        kind, reports = result
        self._set_running(False)
        jitter, epsilon, remedies = reports.jitter, reports.epsilon, reports.remedies
        if jitter is not None or epsilon is not None:
            self.set_reports(self.jitter_report if jitter is None else jitter,
                             self.epsilon_report if epsilon is None else epsilon)
        if remedies is not None:
            self.set_remedies(remedies)
        said = []
        if jitter is not None:
            s = jitter.summary()
            said.append(f"jitter: {s['flipped_cells']} of {s['cells']} cells flipped, overall "
                        f"flip rate {s['overall_flip_rate']:.4f}"
                        + (f" (baseline on the {jitter.kernels} kernels)"
                           if jitter.kernels else ""))
        if epsilon is not None:
            rec = epsilon.recommended()
            said.append("epsilon sweep: " + ("no epsilon removes every flip" if rec is None
                                             else f"recommended {rec.eps:g}"))
        if remedies is not None:
            said.append(f"remedies: plain top-k has {remedies.plain.jitter_left} cells of "
                        f"jitter; " + "; ".join(f"{r.remedy.label} leaves {r.jitter_left}, "
                                                f"changes {r.changed}"
                                                for r in remedies.rows[1:]))
        self.status.setText(" | ".join(said))
        self.sig_report_ready.emit(kind)

    def _failed(self, message: str) -> None:
        self._set_running(False)
        first = message.splitlines()[0] if message else ""
        self.status.setText(f"failed: {first.removeprefix('ValueError: ')}")
        self.sig_failed.emit(message)

    def _cancelled(self) -> None:
        self._set_running(False)
        self.status.setText("cancelled")

    # -- reports and views ----------------------------------------------------------------------

    def set_reports(self, jitter: JitterReport | None, epsilon: EpsilonReport | None) -> None:
        self.jitter_report, self.epsilon_report = jitter, epsilon
        self.heatmap.set_report(jitter)
        self.margins.set_report(jitter)
        self.scatter.set_report(jitter)
        self.token.set_cell(None)
        self.curve.set_report(epsilon)
        self.ab.set_reports(jitter, epsilon)

    def set_remedies(self, report: RemedyReport | None) -> None:
        self.remedy_report = report
        self.remedies.set_report(report)

    def select_cell(self, p: int, mi: int) -> None:
        """Open the token view on cell (position p, MoE layer index mi)."""
        if self.jitter_report is None:
            return
        self.heatmap.mark(p, mi)
        self.margins.mark(p, mi)
        self.token.set_cell(self.jitter_report, p, mi)
        self.tabs.setCurrentWidget(self.token)

    def state(self) -> dict[str, Any]:
        """The reports as JSON-ready dicts (for the session file; `colibri lab --json` writes
        the same)."""
        return LabReports(self.jitter_report, self.epsilon_report, self.remedy_report).to_dict()

    def restore(self, state: dict[str, Any]) -> None:
        reports = LabReports.from_dict(state)
        self.set_reports(reports.jitter, reports.epsilon)
        self.set_remedies(reports.remedies)

    def load_json(self, path: str) -> None:
        """A saved lab state, or a `colibri jitter/epsilon/remedies --json` report."""
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        schema = data.get("schema")
        if schema == SCHEMA_JITTER:
            self.set_reports(JitterReport.from_dict(data), self.epsilon_report)
        elif schema == SCHEMA_EPSILON:
            self.set_reports(self.jitter_report, EpsilonReport.from_dict(data))
        elif schema == SCHEMA_REMEDIES:
            self.set_remedies(RemedyReport.from_dict(data))
        else:
            self.restore(data)

    def save_json(self, path: str) -> None:
        data = json.dumps(self.state(), sort_keys=True, separators=(",", ":")).encode("utf-8")
        atomic_write_bytes(path, data)

    def _save_dialog(self) -> None:
        save_with_dialog(self, "Save jitter results", self.save_json)

    def _load_dialog(self) -> None:
        load_with_dialog(self, "Load jitter results", self.load_json, self.status.setText)

    def shutdown(self) -> None:
        """Cancel and join the worker (call before closing the window)."""
        self.runner.cancel()
        self.runner.wait()
