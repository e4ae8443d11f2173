"""`QtRunPanel`: what to run (prompt, its tokenisation, decoding, routing, expert caching,
threads, kernel path) and the run/step buttons. It only builds `RunSettings` and emits commands;
it never runs the engine. The prompt is text, token ids, or embedding rows read from a .npy file
(Rows...: float32 [positions, hidden], fed instead of the token lookup, as `colibri run
--embedding`)."""

from __future__ import annotations

from collections.abc import Callable

import os

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGridLayout,
                               QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QToolButton,
                               QVBoxLayout, QWidget)

from colibri.engine import load_embeddings
from colibri.errors import ColibriValueError
from colibri.inspector.prompt import (NO_TOKENIZER, QtPromptEdit, QtTokenPieces, placeholder,
                                      token_ids)
from colibri.tokens import EMBEDDING_TEXT
from colibri.values import DECODINGS, KERNEL_PATHS, ROUTING_MODES, RunSettings

Tokenize = Callable[[str], list[tuple[int, str]]]
KERNEL_CHOICES = ("best", *KERNEL_PATHS)


class QtRunPanel(QWidget):
    sig_run = Signal(object)        # RunSettings: start a new run and run it
    sig_restart = Signal(object)    # RunSettings: start a new session, do not run
    sig_continue = Signal()
    sig_pause = Signal()
    sig_stop = Signal()
    sig_step_token = Signal()
    sig_step_layer = Signal()
    sig_apply_routing = Signal(str, object)  # routing, epsilon (None = model default): this run

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._tokenize: Tokenize | None = None
        self.prompt = QtPromptEdit(self)
        self.prompt.setPlaceholderText(placeholder(False))
        self.pieces = QtTokenPieces(self)
        self.pieces.setObjectName("debuggerPromptPieces")
        self.rows_button = QPushButton("Rows...", self)
        self.rows_button.setToolTip("feed the prompt as embedding rows: a .npy of float32 "
                                    "[positions, hidden] fed instead of the token embedding "
                                    "lookup (as colibri run --embedding)")
        self.embeddings: np.ndarray | None = None   # the rows in use, or None (a text prompt)
        self._d_model = 0
        self._text_before = ""
        self.max_new = QSpinBox(self)
        self.max_new.setRange(0, 100000)
        self.max_new.setValue(16)
        self.decoding = QComboBox(self)
        self.decoding.addItems(list(DECODINGS))
        self.seed = QSpinBox(self)
        self.seed.setRange(0, 2**31 - 1)
        self.temperature = QDoubleSpinBox(self)
        self.temperature.setRange(0.0, 10.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(1.0)
        self.routing = QComboBox(self)
        self.routing.addItems(list(ROUTING_MODES))
        self.epsilon = QLineEdit(self)
        self.epsilon.setPlaceholderText("model default")
        self.cache_threshold = QLineEdit(self)
        self.cache_threshold.setPlaceholderText("cached routing")
        self.cache_threshold.setToolTip(
            "cached routing keeps a layer's previous experts while the new top-k's margin over "
            "them (selection scores gained minus dropped) is below this")
        self.expert_cache = QSpinBox(self)
        self.expert_cache.setRange(0, 4096)
        self.expert_cache.setSpecialValueText("none")
        self.expert_cache.setToolTip("an LRU of this many resident experts per MoE layer: its "
                                     "hits and misses per decision, the hit rate in the routing "
                                     "map")
        self.threads = QSpinBox(self)
        self.threads.setRange(1, 256)
        self.kernels = QComboBox(self)
        self.kernels.addItems(list(KERNEL_CHOICES))
        self.kernels.setToolTip("kernel path: 'best' is the best this machine has; a lower one "
                                "runs as a machine without the better ones would (last bits "
                                "differ, so near-tie routing can)")

        form = QFormLayout()
        prompt_row = QHBoxLayout()   # the rows button beside the prompt keeps the form's height
        prompt_row.addWidget(self.prompt, 1)
        # its size hint is a pixel below what its text needs in some styles
        self.rows_button.setMinimumHeight(self.rows_button.minimumSizeHint().height())
        prompt_row.addWidget(self.rows_button, 0, Qt.AlignmentFlag.AlignTop)
        form.addRow("Prompt", prompt_row)
        form.addRow("Tokens", self.pieces)
        form.addRow("Max new tokens", self.max_new)
        form.addRow("Decoding", self.decoding)
        form.addRow("Seed", self.seed)
        form.addRow("Temperature", self.temperature)
        # the caching settings share rows, so the form keeps its height at 1280x800
        routing_row = QHBoxLayout()
        routing_row.addWidget(self.routing)
        routing_row.addWidget(QLabel("threshold", self))
        routing_row.addWidget(self.cache_threshold, 1)
        form.addRow("Routing", routing_row)
        # applies the routing and epsilon above to the run on view: computed again from the first
        # decision they change, compared with the run as it was
        self.apply_routing = QToolButton(self)   # a line edit's height: the form has no more room
        self.apply_routing.setText("Apply to run")
        self.apply_routing.setToolTip("route the current run so from now on: recomputed from the "
                                      "first decision that changes, compared in the "
                                      "Interventions tab (top-k, stable, gumbel)")
        epsilon_row = QHBoxLayout()
        epsilon_row.addWidget(self.epsilon, 1)
        epsilon_row.addWidget(self.apply_routing)
        form.addRow("Epsilon", epsilon_row)
        threads_row = QHBoxLayout()
        threads_row.addWidget(self.threads)
        threads_row.addWidget(QLabel("expert cache", self))
        threads_row.addWidget(self.expert_cache, 1)
        form.addRow("Threads", threads_row)
        form.addRow("Kernels", self.kernels)

        self.buttons: dict[str, QPushButton] = {}
        grid = QGridLayout()   # two rows of three: run control, then stepping
        for i, (name, text, tip) in enumerate((
                ("run", "Run", "start a new run (Ctrl+R)"),
                ("pause", "Pause", "pause between positions (F6)"),
                ("stop", "Stop", "stop; keeps everything produced (Shift+F5)"),
                ("step_token", "Step token", "one position (F10)"),
                ("step_layer", "Step layer", "next MoE layer (F11)"),
                ("continue", "Continue", "run to the next breakpoint (F5)"))):
            b = QPushButton(text, self)
            b.setToolTip(tip)
            grid.addWidget(b, *divmod(i, 3))
            self.buttons[name] = b
        self.status = QLabel("no run", self)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(grid)
        layout.addWidget(self.status)

        self.prompt.textChanged.connect(self._update_pieces)
        self.rows_button.clicked.connect(self._rows_clicked)
        self.routing.currentTextChanged.connect(self._routing_changed)
        self._routing_changed(self.routing.currentText())
        self.buttons["run"].clicked.connect(self._run)
        self.buttons["pause"].clicked.connect(self.sig_pause)
        self.buttons["stop"].clicked.connect(self.sig_stop)
        self.buttons["step_token"].clicked.connect(self.sig_step_token)
        self.buttons["step_layer"].clicked.connect(self.sig_step_layer)
        self.buttons["continue"].clicked.connect(self.sig_continue)
        self.apply_routing.clicked.connect(self._apply_routing)
        self.set_running(False)

    def set_tokenizer(self, tokenize: Tokenize | None) -> None:
        """`tokenize(text) -> [(id, piece), ...]`; None when the model has no tokenizer (then
        the prompt is comma-separated token ids)."""
        self._tokenize = tokenize
        self.prompt.setPlaceholderText(placeholder(tokenize is not None))
        self._update_pieces()

    def prompt_tokens(self) -> list[tuple[int, str]]:
        """(id, piece) of each prompt token (see colibri.inspector.prompt; -1 per embedding row);
        raises ValueError for prompt text on a model without a tokenizer."""
        if self.embeddings is not None:
            return [(-1, EMBEDDING_TEXT)] * int(self.embeddings.shape[0])
        text = self.prompt.text()
        ids = token_ids(text)
        if ids is not None:
            return [(i, str(i)) for i in ids]
        if not text:
            return []
        if self._tokenize is None:
            raise ValueError(NO_TOKENIZER)
        return self._tokenize(text)

    def _update_pieces(self) -> None:
        if self.embeddings is not None:
            self.pieces.setText(f"{EMBEDDING_TEXT} x {self.embeddings.shape[0]}")
            return
        try:
            pieces = self.prompt_tokens()
        except ValueError as exc:
            self.pieces.setText(f"({exc})")
            return
        self.pieces.setText("  ".join(f"{piece!r}:{tid}" for tid, piece in pieces)
                            or "(no tokens)")

    def _routing_changed(self, routing: str) -> None:
        self.cache_threshold.setEnabled(routing == "cached")

    def set_n_experts(self, n: int) -> None:
        """The open model's experts per layer: the most an expert cache can hold."""
        self.expert_cache.setMaximum(max(n, 0))

    def set_d_model(self, d_model: int) -> None:
        """The open model's hidden size: the width embedding rows must have (rows of another
        width are dropped, back to the text prompt)."""
        self._d_model = int(d_model)
        if self.embeddings is not None and self.embeddings.shape[1] != self._d_model:
            self.set_embeddings(None)
            self.status.setText(f"the embedding rows do not fit this model's hidden size "
                                f"{self._d_model}: back to the text prompt")

    def load_rows(self, path: str) -> bool:
        """Use the rows of the .npy file at `path` as the prompt; a file that cannot be used is
        told in the status line (naming the file and why). True when the rows are in use."""
        try:
            rows = load_embeddings(path, self._d_model)
        except ColibriValueError as exc:
            self.status.setText(f"cannot use the rows: {exc.message}")
            return False
        self.set_embeddings(rows, os.path.basename(path))
        return True

    def set_embeddings(self, rows: np.ndarray | None, name: str = "") -> None:
        """Embedding rows as the prompt (the text field shows what they are and is read-only),
        or None: the text prompt as it was before."""
        if rows is not None and self.embeddings is None:
            self._text_before = self.prompt.text()
        was_rows = self.embeddings is not None
        self.embeddings = rows
        self.prompt.setReadOnly(rows is not None)
        self.rows_button.setText("Text" if rows is not None else "Rows...")
        if rows is not None:
            source = f" from {name}" if name else ""
            self.prompt.setText(f"[{rows.shape[0]} embedding rows{source}]")
        elif was_rows:
            self.prompt.setText(self._text_before)
        self._update_pieces()

    def _rows_clicked(self) -> None:
        if self.embeddings is not None:
            self.set_embeddings(None)
            return
        path, _ = QFileDialog.getOpenFileName(self, "Embedding rows", "",
                                              "NumPy arrays (*.npy);;All (*)")
        if path:
            self.load_rows(path)

    def settings(self) -> RunSettings:
        """The RunSettings the form describes; raises ValueError naming what is wrong."""
        eps_text = self.epsilon.text().strip()
        epsilon = float(eps_text) if eps_text else None
        routing = self.routing.currentText()
        threshold = 0.0
        if routing == "cached":
            text = self.cache_threshold.text().strip()
            if not text:
                raise ValueError("cached routing needs a cache threshold")
            try:
                threshold = float(text)
            except ValueError:
                raise ValueError(f"cache threshold {text!r} is not a number") from None
        return RunSettings(tuple(t for t, _ in self.prompt_tokens()), self.max_new.value(),
                           self.decoding.currentText(), self.seed.value(),  # type: ignore[arg-type]
                           self.temperature.value(), routing, epsilon,
                           self.threads.value(),
                           None if self.kernels.currentIndex() == 0 else self.kernels.currentText(),
                           threshold, self.expert_cache.value(),
                           prompt_embeddings=self.embeddings)

    def set_settings(self, s: RunSettings, prompt_text: str) -> None:
        self.set_embeddings(s.prompt_embeddings)
        if s.prompt_embeddings is None:
            self.prompt.setText(prompt_text)
        self.max_new.setValue(s.max_new_tokens)
        self.decoding.setCurrentText(s.decoding)
        self.seed.setValue(int(s.seed))
        self.temperature.setValue(s.temperature)
        self.routing.setCurrentText(s.routing)
        self.epsilon.setText("" if s.epsilon is None else repr(s.epsilon))
        self.cache_threshold.setText(repr(s.cache_threshold) if s.routing == "cached" else "")
        self.expert_cache.setValue(s.expert_cache)
        self.threads.setValue(s.threads)
        self.kernels.setCurrentText(s.kernels or KERNEL_CHOICES[0])

    def _run(self) -> None:
        try:
            settings = self.settings()
        except ValueError as exc:
            self.status.setText(f"cannot run: {exc}")
            return
        self.sig_run.emit(settings)

    def _apply_routing(self) -> None:
        text = self.epsilon.text().strip()
        try:
            epsilon = float(text) if text else None
        except ValueError:
            self.status.setText(f"cannot apply: epsilon {text!r} is not a number")
            return
        self.sig_apply_routing.emit(self.routing.currentText(), epsilon)

    def set_running(self, running: bool) -> None:
        for name in ("run", "step_token", "step_layer", "continue"):
            self.buttons[name].setEnabled(not running)
        self.apply_routing.setEnabled(not running)
        self.buttons["pause"].setEnabled(running)
        self.buttons["stop"].setEnabled(True)  # stopping a paused run finishes it

    def set_status(self, text: str) -> None:
        self.status.setText(text)
