"""Putting the views of an open file in a state worth looking at, with real runs on its model.

The screenshot mode (`colibri-inspector --screenshot --view NAME`), the README's pictures and the
visual check of every view (tests/inspector/test_visual.py) all show the same thing: what a user
sees after a first run. `prepare(view, name)` does it for one view, blocking while the event
loop runs: the data checks finished (validation), a routed expert matrix selected (tensors,
values), the router rows of a layer with near-ties in the hexdump (hex), a greedy run of the
model's example prompt with an event selected (debugger), the jitter analysis and the epsilon
sweep with the first fragile cell opened (jitter), the busiest expert of an open profile
selected (corpus). A GGUF file or checkpoint's tab (`QtForeignFileView`) gets the same: its
data checks done, an expert matrix selected with its values and its layer's experts compared,
the router's bytes in the hexdump, the vocabulary opened in the metadata tree ("header"; the
debugger's views do not apply to it). Nothing here computes: it drives the views.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer

from colibri.inspector.foreign_view import QtForeignFileView
from colibri.inspector.main_window import FileView
from colibri.inspector.prompt import example_prompt

DEBUG_NEW_TOKENS = 24


def settle(ms: int = 150) -> None:
    """Let layouts, first paints and queued signals run for `ms` milliseconds."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()
    QCoreApplication.processEvents()


def wait_while(busy: Callable[[], bool], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while busy() and time.monotonic() < deadline:
        settle(20)


def _expert_matrix(view: FileView) -> str | None:
    model = view.doc.model
    if model is None or not model.tensors:
        return None
    return next((t.name for t in model.tensors if t.name.endswith("moe_w1")), model.tensors[0].name)


def prepare(view: FileView | QtForeignFileView, name: str,
            jitter_variants: str | None = None) -> None:
    """Show view `name` of `view` after real work on its model (see the module docstring).
    `jitter_variants` narrows the jitter lab's variant list (default: the lab's own)."""
    if isinstance(view, QtForeignFileView):
        _prepare_foreign(view, name)
        return
    model = view.doc.model
    view.set_view(name)
    if model is None:
        settle()
        return
    if name == "validation":
        wait_while(view.is_checking)
    elif name in ("tensors", "values"):
        matrix = _expert_matrix(view)
        if matrix is not None:
            view.show_tensor(matrix)
            view.set_view(name)
            if name == "values":
                settle(50)
                wait_while(view.values.is_busy)
    elif name == "hex":
        # a router's weight rows (layer 1 has near-ties in the demo), selected in the table
        # beside the hexdump: its bytes highlighted, the cursor on its first value
        gates = [t.name for t in model.tensors if t.name.endswith("moe_gate")]
        if gates:
            view.set_view("tensors")
            view.show_tensor(gates[min(1, len(gates) - 1)])
        view.set_view("hex")
    elif name == "debugger":
        _debug_run(view)
    elif name == "jitter":
        _jitter_runs(view, jitter_variants)
    elif name == "corpus":
        _corpus_selection(view)
    settle()


def _debug_run(view: FileView) -> None:
    panel = view.debugger
    model = view.doc.model
    if not panel.run_panel.prompt.text():
        panel.run_panel.prompt.setText(example_prompt(model) or "1, 2, 3")
    panel.run_panel.max_new.setValue(DEBUG_NEW_TOKENS)
    panel.run_panel.buttons["run"].click()
    settle(100)
    wait_while(lambda: panel.controller.running)
    events = panel.events
    if events is not None and len(events):
        changes = [i for i in range(len(events)) if events[i].routing_changed]
        panel.select_event(changes[len(changes) // 2] if changes else len(events) // 2)


def _corpus_selection(view: FileView) -> None:
    """The loaded profile with its last layer's busiest expert clicked: its tokens and contexts."""
    wait_while(view.corpus.is_loading)
    shown = view.corpus.shown()
    if shown is not None:
        last = len(shown.layers) - 1
        view.corpus.select(last, int(shown.load_share[last].argmax()))


def _jitter_runs(view: FileView, variants: str | None) -> None:
    lab = view.jitter
    if not lab.prompt.text():
        lab.prompt.setText(example_prompt(view.doc.model) or "1, 2, 3")
    if variants is not None:
        lab.variants.setText(variants)
    for kind in ("epsilon", "jitter"):   # the jitter tab last: it is the one shown
        lab.start(kind)
        settle(100)
        wait_while(lab.runner.is_running, 300)
        settle(50)
    report = lab.jitter_report
    if report is None:
        return
    flips = report.flip_counts()
    if flips.any():
        p, mi = divmod(int(flips.argmax()), flips.shape[1])
        lab.select_cell(p, mi)
        rates = report.flip_rate()
        flipped = [name for name in report.variants if rates[name] > 0]
        if flipped:
            lab.ab.set_pair(lab.ab.settings()[0], flipped[0])
    lab.tabs.setCurrentIndex(0)


def _prepare_foreign(view: QtForeignFileView, name: str) -> None:
    wait_while(lambda: not view.is_open())
    doc = view.doc
    if doc is None or not doc.opened:
        view.set_view("validation")
        settle()
        return
    layers = doc.layers
    matrix = layers[-1].parts["moe_w1"][0].name if layers and "moe_w1" in layers[-1].parts \
        else doc.file.tensors[0].name
    if name == "validation":
        view.set_view("validation")
        wait_while(view.is_checking)
    elif name in ("header", "metadata"):
        view.set_view("metadata")
        vocabulary = "tokenizer.ggml.tokens" if doc.format == "gguf" else None
        if vocabulary is not None and vocabulary in doc.file.keys:
            view.metadata.select(["key/values", vocabulary, "[1]"])
    elif name == "hex":
        view.set_view("tensors")
        view.show_tensor(layers[-1].router if layers else matrix)
        view.set_view("hex")
    elif name == "values":
        view.set_view("values")
        view.show_tensor(matrix)
        settle(50)
        wait_while(view.values.is_busy)
    else:   # the tensor table, and the views a foreign file has none of
        view.set_view("tensors")
        view.show_tensor(matrix)
    settle()
