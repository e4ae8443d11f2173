"""`QtCorpusView`: a `colibri profile` directory in the Inspector, and two compared.

Open a profile (and optionally a second one to compare with); both are read on `TaskRunner`
workers (`CorpusProfile.open` reads the Parquet tables), so the window never waits on a large
profile. The view shows, for the layer chosen:
  expert load per layer        layers x experts, the share of each layer's tokens per expert
  token-class specialisation   experts x classes, log2 of the lift (share of the expert's tokens
                               in the class over the class's share of all tokens; 0 = none)
  co-selection                 experts x experts, the share of tokens routed to both
  selection margins            the fraction of cells per margin bin (ULPs or absolute)
  flip rate by margin          the sampled jitter, one line a variant
and, for a clicked expert, its tokens and highest-weight contexts. With two profiles "B - A"
shows every quantity as B minus A (a diverging colour map centred on 0).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QComboBox, QFileDialog, QGridLayout, QHBoxLayout, QLabel,
                               QPushButton, QVBoxLayout, QWidget)

from colibri.inspector.corpus.views import (QtExpertDetail, QtFlipRate, QtMarginHistogram,
                                            QtMatrixHeatmap)
from colibri.inspector.tasks import Task, TaskRunner
from colibri.profile.classes import CLASS_NAMES
from colibri.profile.results import CorpusProfile, ProfileDiff, compare
from colibri.profile.stats import abs_bin_bounds, ulp_bin_bounds

MODES = ("A", "B", "B - A")
CLASS_TICKS = ("letters", "digits", "punct", "space", "keyword", "other", "special")
_LIFT_CLIP = 4.0   # log2 lift drawn within +-4 (16x over or under the corpus's share)


def _log2_lift(lift: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.clip(np.log2(lift), -_LIFT_CLIP, _LIFT_CLIP)


def _fractions(hist: np.ndarray) -> np.ndarray:
    return hist / max(int(hist.sum()), 1)


def _ulp_ticks(n_bins: int) -> list[str]:
    """Each ULP bin's lowest margin, short: none, 0, 1, 2, 4, ... 512, 2^10, 2^11, ..."""
    out = []
    for i in range(n_bins):
        lo = ulp_bin_bounds(i)[1]
        out.append("none" if lo != lo else (str(int(lo)) if lo < 1024 else
                                           f"2^{int(lo).bit_length() - 1}"))
    return out


def _abs_ticks(n_bins: int) -> list[str]:
    out = []
    for i in range(n_bins):
        label, lo, _hi = abs_bin_bounds(i)
        out.append(label if lo != lo or lo == 0 else f"{lo:.0e}")
    return out


class QtCorpusView(QWidget):
    """See the module docstring."""

    sig_profile_loaded = Signal(str, str)      # which ('A' or 'B'), directory
    sig_failed = Signal(str)
    sig_expert_selected = Signal(int, int)     # model layer, expert

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.profiles: dict[str, CorpusProfile | None] = {"A": None, "B": None}
        self.diff: ProfileDiff | None = None
        self._pending_b: CorpusProfile | None = None
        self.layer_index = 0
        self.expert: int | None = None
        self.loaders = {"A": TaskRunner(self), "B": TaskRunner(self)}
        for which, runner in self.loaders.items():
            runner.sig_finished.connect(lambda p, w=which: self.set_profile(p, w))
            runner.sig_failed.connect(self._failed)

        self.open_button = QPushButton("Open profile…")
        self.compare_button = QPushButton("Compare with…")
        self.clear_button = QPushButton("Clear comparison")
        self.mode = QComboBox()
        self.mode.addItems(MODES)
        self.layer = QComboBox()
        self.unit = QComboBox()
        self.unit.addItems(["ULP", "absolute"])
        self.status = QLabel("Open a profile directory made by `colibri profile`.")
        self.status.setObjectName("corpusStatus")
        self.status.setWordWrap(True)
        bar = QHBoxLayout()
        for w in (self.open_button, self.compare_button, self.clear_button):
            bar.addWidget(w)
        bar.addSpacing(12)
        for text, w in (("Show", self.mode), ("Layer", self.layer), ("Margins in", self.unit)):
            bar.addWidget(QLabel(text))
            bar.addWidget(w)
        bar.addStretch(1)

        self.load = QtMatrixHeatmap("Expert load per layer", "layer", "expert")
        self.classes = QtMatrixHeatmap("Expert x token class (log2 lift)", "expert", "class")
        self.coselection = QtMatrixHeatmap("Co-selection", "expert", "expert")
        self.margins = QtMarginHistogram()
        self.flips = QtFlipRate()
        self.detail = QtExpertDetail()
        for name, w in (("corpusLoad", self.load), ("corpusClasses", self.classes),
                        ("corpusCoselection", self.coselection), ("corpusMargins", self.margins),
                        ("corpusFlips", self.flips), ("corpusDetail", self.detail)):
            w.setObjectName(name)
        grid = QGridLayout()
        grid.addWidget(self.load, 0, 0)
        grid.addWidget(self.classes, 0, 1)
        grid.addWidget(self.coselection, 0, 2)
        grid.addWidget(self.margins, 1, 0)
        grid.addWidget(self.flips, 1, 1)
        grid.addWidget(self.detail, 1, 2)
        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(self.status)
        layout.addLayout(grid, 1)

        self.open_button.clicked.connect(lambda: self._choose("A"))
        self.compare_button.clicked.connect(lambda: self._choose("B"))
        self.clear_button.clicked.connect(self.clear_comparison)
        self.mode.currentIndexChanged.connect(lambda _i: self.refresh())
        self.layer.currentIndexChanged.connect(self._layer_changed)
        self.unit.currentIndexChanged.connect(lambda _i: self.refresh())
        self.load.sig_cell_selected.connect(lambda row, col: self.select(row, col))
        self.classes.sig_cell_selected.connect(lambda row, _c: self.select(self.layer_index, row))
        self.coselection.sig_cell_selected.connect(
            lambda row, _c: self.select(self.layer_index, row))
        self._update_controls()

    # -- loading --------------------------------------------------------------------------------

    def _choose(self, which: str) -> None:
        start = self.profiles["A"].directory if self.profiles["A"] is not None else os.getcwd()
        path = QFileDialog.getExistingDirectory(self, "Open a profile directory", start)
        if path:
            self.open_profile(path, which)

    def open_profile(self, directory: str, which: str = "A") -> None:
        """Read the profile in `directory` on a worker; it shows as `which` ('A' or 'B')."""
        path = os.path.abspath(directory)
        self.status.setText(f"reading {path}…")
        self.loaders[which].start(Task(f"open profile {which}",
                                       lambda _progress, _cancelled: CorpusProfile.open(path)))

    def is_loading(self) -> bool:
        return self._pending_b is not None or any(r.is_running() for r in self.loaders.values())

    def _failed(self, message: str) -> None:
        first = message.splitlines()[0] if message else "failed"
        self.status.setText(f"Could not open the profile: {first.split(': ', 1)[-1]}")
        self.sig_failed.emit(first)

    def set_profile(self, profile: CorpusProfile, which: str = "A") -> None:
        if which == "B" and self.profiles["A"] is None and self.loaders["A"].is_running():
            self._pending_b = profile   # compared once A is there
            return
        if which == "B" and self.profiles["A"] is not None:
            try:
                diff = compare(self.profiles["A"], profile)
            except ValueError as exc:
                self.status.setText(str(exc))
                self.sig_failed.emit(str(exc))
                return
            self.profiles["B"], self.diff = profile, diff
            self.mode.setCurrentIndex(MODES.index("B - A"))
        else:
            self.profiles["A"], self.profiles["B"], self.diff = profile, None, None
            self.mode.setCurrentIndex(0)
            self.layer.blockSignals(True)
            self.layer.clear()
            self.layer.addItems([f"layer {layer}" for layer in profile.layers])
            self.layer.blockSignals(False)
            self.layer_index, self.expert = 0, None
        self._update_controls()
        self.refresh()
        self.sig_profile_loaded.emit(which, profile.directory)
        pending, self._pending_b = self._pending_b, None
        if which == "A" and pending is not None:
            self.set_profile(pending, "B")

    def clear_comparison(self) -> None:
        self.profiles["B"], self.diff = None, None
        self.mode.setCurrentIndex(0)
        self._update_controls()
        self.refresh()

    def shutdown(self) -> None:
        for runner in self.loaders.values():
            runner.cancel()
            runner.wait()

    # -- selection ------------------------------------------------------------------------------

    def current_mode(self) -> str:
        return MODES[self.mode.currentIndex()]

    def shown(self) -> CorpusProfile | None:
        """The profile whose own numbers are shown (B when comparing, as in 'B - A')."""
        return self.profiles["A"] if self.current_mode() == "A" else self.profiles["B"]

    def select(self, layer_index: int, expert: int) -> None:
        """Show MoE layer index `layer_index` and list what chose `expert` there."""
        profile = self.shown()
        if profile is None or not 0 <= layer_index < len(profile.layers):
            return
        self.expert = expert
        if layer_index != self.layer_index:
            self.layer.setCurrentIndex(layer_index)   # refreshes
        else:
            self.refresh()
        self.sig_expert_selected.emit(profile.layers[layer_index], expert)

    def _layer_changed(self, index: int) -> None:
        if index >= 0:
            self.layer_index = index
            self.refresh()

    def _update_controls(self) -> None:
        a, b = self.profiles["A"], self.profiles["B"]
        self.compare_button.setEnabled(a is not None)
        self.clear_button.setEnabled(b is not None)
        self.mode.setEnabled(b is not None)
        if a is None:
            self.status.setText("Open a profile directory made by `colibri profile`.")
        elif b is None:
            self.status.setText(f"A: {a.directory} — {a.description()}")
        else:
            self.status.setText(f"A: {a.directory} — {a.description()}\nB: {b.directory} — "
                                f"{b.description()}")

    # -- drawing --------------------------------------------------------------------------------

    def refresh(self) -> None:
        a = self.profiles["A"]
        if a is None:
            for heatmap in (self.load, self.classes, self.coselection):
                heatmap.set_matrix(None, [], [])
            self.margins.set_bars({}, [], "ULP")
            self.flips.set_lines({}, [])
            self.detail.clear()
            return
        mode = self.current_mode()
        if mode != "A" and (self.profiles["B"] is None or self.diff is None):
            mode = "A"
        i = min(self.layer_index, len(a.layers) - 1)
        experts = [str(e) for e in range(a.n_experts)]
        layers = [str(layer) for layer in a.layers]
        ulp = self.unit.currentIndex() == 0
        ulp_ticks = _ulp_ticks(len(a.ulp_labels))
        labels = ulp_ticks if ulp else _abs_ticks(len(a.abs_labels))
        unit = "ULP" if ulp else "absolute"
        if mode == "B - A":
            d = self.diff
            assert d is not None
            self.load.set_matrix(d.load_share, layers, experts, diverging=True, fmt="{:+.2%}")
            lift = _log2_lift(d.b.class_lift[i]) - _log2_lift(d.a.class_lift[i])
            self.classes.set_matrix(lift, experts, CLASS_NAMES, diverging=True,
                                    unit=" (log2 lift)", fmt="{:+.2f}", col_ticks=CLASS_TICKS)
            self.coselection.set_matrix(d.coselection[i], experts, experts, diverging=True,
                                        fmt="{:+.2%}")
            frac = d.ulp_fraction[i] if ulp else d.abs_fraction[i]
            self.margins.set_bars({"B - A": frac}, labels, unit)
            self.flips.set_lines({v: d.flip_rate(v)[i] for v in d.variants}, ulp_ticks,
                                 "the two profiles share no jitter variant")
        else:
            p = self.shown()
            assert p is not None
            self.load.set_matrix(p.load_share, layers, experts, fmt="{:.2%}")
            self.classes.set_matrix(_log2_lift(p.class_lift[i]), experts, CLASS_NAMES,
                                    diverging=True, unit=" (log2 lift)", fmt="{:+.2f}",
                                    col_ticks=CLASS_TICKS)
            self.coselection.set_matrix(p.coselection[i], experts, experts, fmt="{:.2%}")
            hist = p.ulp_hist[i] if ulp else p.abs_hist[i]
            self.margins.set_bars({mode: _fractions(hist)}, labels, unit)
            self.flips.set_lines({v: p.flip_rate(v)[i] for v in p.variants}, ulp_ticks)
        self.margins.plot.setTitle(f"Selection margins, layer {a.layers[i]}")
        self.flips.plot.setTitle(f"Flip rate by margin, layer {a.layers[i]}")
        self.classes.plot.setTitle(f"Expert x token class, layer {a.layers[i]} (log2 lift)")
        self.coselection.plot.setTitle(f"Co-selection, layer {a.layers[i]}")
        self._show_expert(i)

    def _show_expert(self, i: int) -> None:
        p = self.shown()
        if p is None or self.expert is None or not 0 <= self.expert < p.n_experts:
            self.load.mark(i, None)
            self.detail.clear()
            return
        e = self.expert
        self.load.mark(i, e)
        self.classes.mark(e, None)
        self.coselection.mark(e, None)
        which = "A" if p is self.profiles["A"] else "B"
        self.detail.show_expert(
            f"Layer {p.layers[i]}, expert {e} ({which}: {p.name}): {p.load_share[i, e]:.2%} of "
            f"the tokens, mean weight {p.mean_weight[i, e]:.3f}",
            p.top_tokens(i, e), p.examples(i, e))

    def values(self) -> dict[str, Any]:
        """What is drawn now (for tests): each heatmap's matrix, the bars and the lines."""
        return {"load": self.load.values(), "classes": self.classes.values(),
                "coselection": self.coselection.values(), "margins": self.margins.bars(),
                "flips": self.flips.lines()}


__all__ = ["MODES", "QtCorpusView"]