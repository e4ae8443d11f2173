"""Reading a finished profile back, and comparing two (Qt-free: the Corpus view's model).

`CorpusProfile.open(dir)` reads `summary.json` and the Parquet tables (`colibri.profile.tables`)
into arrays indexed [MoE layer index][expert] (`layers[i]` is the model layer of index i):

  load_share      the fraction of the layer's tokens routed to the expert (a row sums to k)
  mean_weight     the expert's mean combine weight when selected
  class_lift      specialisation: the share of the expert's selections that are tokens of class
                  c, divided by the share of class c among all tokens (1 = no preference)
  coselection     [i][a][b] the fraction of the layer's tokens that selected both a and b
                  (coselection_counts: the cells)
  ulp_hist, abs_hist   [i][bin] cells by selection margin (labels in ulp_labels, abs_labels)
  flip_rate(v)    [i][bin] flips / cells of variant v by ULP-margin bin (NaN: no cell)

`compare(a, b)` gives the same quantities as b minus a, for two profiles of models with the same
experts (two checkpoints, or two routing settings of one). `top_tokens` and `examples` list what
chose an expert most, for a click in the view.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.profile.classes import CLASS_NAMES
from colibri.profile.stats import N_ABS_BINS, N_ULP_BINS, abs_bin_bounds, ulp_bin_bounds

SUMMARY = "summary.json"


class ProfileReadError(ValueError):
    """A directory that is not a complete profile; the message names the file."""


def _table(directory: str, name: str) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(directory, f"{name}.parquet")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ProfileReadError(f"{path}: cannot be read ({exc})") from None
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}


@dataclass(frozen=True)
class TokenRow:
    text: str
    token_id: int
    token_class: str
    count: int               # selections of the expert by this token
    share_of_expert: float   # count / the expert's load
    share_of_token: float    # count / the token's occurrences (how often it chose this expert)


@dataclass(frozen=True)
class Example:
    weight: float
    record: int
    offset: int
    before: str
    token: str
    after: str


class CorpusProfile:
    """A profile directory, read (see the module docstring)."""

    def __init__(self, directory: str, summary: dict[str, Any],
                 tables: dict[str, dict[str, np.ndarray]]) -> None:
        self.directory = directory
        self.summary = summary
        model = summary["model"]
        self.layers: list[int] = list(model["moe_layers"])
        self.n_experts: int = int(model["n_experts"])
        self.k: int = int(model["k"])
        self.n_tokens: int = int(summary["totals"]["tokens"])
        self.variants: list[str] = list(summary["settings"]["jitter_variants"])
        M, E = len(self.layers), self.n_experts
        index = {layer: i for i, layer in enumerate(self.layers)}
        self._index = index

        ex = tables["experts"]
        rows = np.array([index[int(x)] for x in ex["layer"]], dtype=np.int64)
        self.load = np.zeros((M, E), np.int64)
        self.load[rows, ex["expert"]] = ex["load"]
        self.load_share = self.load / max(self.n_tokens, 1)
        self.mean_weight = np.full((M, E), np.nan)
        self.mean_weight[rows, ex["expert"]] = ex["mean_weight"].astype(np.float64)
        lt = tables["layers"]
        order = [index[int(x)] for x in lt["layer"]]
        self.load_cv = np.empty(M)
        self.load_cv[order] = lt["load_cv"]
        self.max_over_mean = np.empty(M)
        self.max_over_mean[order] = lt["max_over_mean"]

        C = len(CLASS_NAMES)
        cl = tables["classes"]
        cls_index = {c: i for i, c in enumerate(CLASS_NAMES)}
        self.class_counts = np.zeros((M, E, C), np.int64)
        self.class_counts[[index[int(x)] for x in cl["layer"]], cl["expert"],
                          [cls_index[str(c)] for c in cl["token_class"]]] = cl["count"]
        vocab = tables["vocab"]
        self._vocab = vocab
        self._vocab_row = {int(t): i for i, t in enumerate(vocab["token_id"])}
        self.class_occurrences = np.zeros(C, np.int64)
        np.add.at(self.class_occurrences, [cls_index[str(c)] for c in vocab["token_class"]],
                  vocab["occurrences"])
        with np.errstate(invalid="ignore", divide="ignore"):
            share = self.class_counts / self.load[..., None]
            base = self.class_occurrences / max(self.n_tokens, 1)
            self.class_lift = np.where(base > 0, share / np.where(base > 0, base, 1), np.nan)

        co = tables["coselection"]
        self.coselection_counts = np.zeros((M, E, E), np.int64)
        ci = [index[int(x)] for x in co["layer"]]
        self.coselection_counts[ci, co["expert_a"], co["expert_b"]] = co["count"]
        self.coselection_counts[ci, co["expert_b"], co["expert_a"]] = co["count"]
        self.coselection = self.coselection_counts / max(self.n_tokens, 1)

        mg = tables["margins"]
        self.ulp_hist = np.zeros((M, N_ULP_BINS), np.int64)
        self.abs_hist = np.zeros((M, N_ABS_BINS), np.int64)
        for unit, hist in (("ulp", self.ulp_hist), ("abs", self.abs_hist)):
            sel = mg["unit"] == unit
            hist[[index[int(x)] for x in mg["layer"][sel]], mg["bin"][sel]] = mg["cells"][sel]
        self.ulp_labels = [ulp_bin_bounds(i)[0] for i in range(N_ULP_BINS)]
        self.abs_labels = [abs_bin_bounds(i)[0] for i in range(N_ABS_BINS)]

        jt = tables["jitter"]
        V = len(self.variants)
        self.jitter_cells = np.zeros((V, M, N_ULP_BINS), np.int64)
        self.jitter_flips = np.zeros((V, M, N_ULP_BINS), np.int64)
        vi = {v: i for i, v in enumerate(self.variants)}
        if jt["variant"].size:
            at = ([vi[str(v)] for v in jt["variant"]], [index[int(x)] for x in jt["layer"]],
                  jt["bin"])
            self.jitter_cells[at] = jt["cells"]
            self.jitter_flips[at] = jt["flips"]

        self._tokens = tables["tokens"]
        self._examples = tables["examples"]

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> CorpusProfile:
        """Read the profile in `directory`; ProfileReadError when it is not a complete one."""
        from colibri.profile.tables import TABLES

        directory = os.fspath(directory)
        path = os.path.join(directory, SUMMARY)
        try:
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
        except FileNotFoundError:
            raise ProfileReadError(f"{directory}: not a finished profile ({SUMMARY} missing; "
                                   "an interrupted `colibri profile` resumes when run "
                                   "again)") from None
        except (OSError, ValueError) as exc:
            raise ProfileReadError(f"{path}: {exc}") from None
        if not isinstance(summary, dict) or summary.get("schema") != "colibri.profile/1":
            raise ProfileReadError(f"{path}: not a Colibri profile summary")
        return cls(directory, summary, {name: _table(directory, name) for name in TABLES})

    # -- what the view asks ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.directory))

    def layer_index(self, layer: int) -> int:
        return self._index[layer]

    def description(self) -> str:
        s = self.summary
        return (f"{s['model']['name']} on {os.path.basename(s['dataset']['path'])}: "
                f"{self.n_tokens:,} tokens, routing {s['settings']['routing']}"
                + (f" eps {s['settings']['epsilon']:g}" if s['settings'].get('epsilon')
                   is not None else ""))

    def median_margin_label(self, i: int) -> str:
        """The ULP bin holding the median cell of MoE layer index i."""
        hist = self.ulp_hist[i]
        if hist.sum() == 0:
            return "-"
        b = int(np.searchsorted(np.cumsum(hist), (hist.sum() + 1) / 2))
        return f"{self.ulp_labels[b]} ULP" if b > 0 else "none"

    def flip_rate(self, variant: str) -> np.ndarray:
        v = self.variants.index(variant)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.jitter_cells[v] > 0,
                            self.jitter_flips[v] / np.maximum(self.jitter_cells[v], 1), np.nan)

    def jitter_totals(self, variant: str) -> tuple[int, int]:
        v = self.variants.index(variant)
        return int(self.jitter_cells[v].sum()), int(self.jitter_flips[v].sum())

    def top_tokens(self, i: int, expert: int, n: int = 30) -> list[TokenRow]:
        """The tokens that chose `expert` at MoE layer index i most often."""
        t = self._tokens
        sel = np.flatnonzero((t["layer"] == self.layers[i]) & (t["expert"] == expert))
        sel = sel[np.lexsort((t["token_id"][sel], -t["count"][sel]))][:n]
        load = max(int(self.load[i, expert]), 1)
        rows = []
        for r in sel:
            tok, count = int(t["token_id"][r]), int(t["count"][r])
            v = self._vocab_row[tok]
            rows.append(TokenRow(str(self._vocab["text"][v]), tok,
                                 str(self._vocab["token_class"][v]), count, count / load,
                                 count / max(int(self._vocab["occurrences"][v]), 1)))
        return rows

    def examples(self, i: int, expert: int) -> list[Example]:
        """The selections of `expert` at MoE layer index i with the largest combine weight."""
        e = self._examples
        sel = np.flatnonzero((e["layer"] == self.layers[i]) & (e["expert"] == expert))
        sel = sel[np.argsort(e["rank"][sel], kind="stable")]
        return [Example(float(e["weight"][r]), int(e["record"][r]), int(e["offset"][r]),
                        str(e["before"][r]), str(e["token"][r]), str(e["after"][r]))
                for r in sel]


@dataclass(frozen=True)
class ProfileDiff:
    """b minus a for every per-layer quantity the view shows; flip rates for shared variants."""

    a: CorpusProfile
    b: CorpusProfile
    load_share: np.ndarray
    mean_weight: np.ndarray
    class_lift: np.ndarray
    coselection: np.ndarray
    ulp_fraction: np.ndarray     # [i][bin] difference of the fraction of cells per bin
    abs_fraction: np.ndarray
    variants: list[str]

    def flip_rate(self, variant: str) -> np.ndarray:
        return self.b.flip_rate(variant) - self.a.flip_rate(variant)


def _fractions(hist: np.ndarray) -> np.ndarray:
    return hist / np.maximum(hist.sum(axis=-1, keepdims=True), 1)


def compare(a: CorpusProfile, b: CorpusProfile) -> ProfileDiff:
    """b minus a; ValueError when the two models' MoE layers or expert counts differ."""
    if a.layers != b.layers or a.n_experts != b.n_experts:
        raise ValueError(f"cannot compare {a.name} ({len(a.layers)} MoE layers x {a.n_experts} "
                         f"experts) with {b.name} ({len(b.layers)} x {b.n_experts})")
    return ProfileDiff(a, b, b.load_share - a.load_share, b.mean_weight - a.mean_weight,
                       b.class_lift - a.class_lift, b.coselection - a.coselection,
                       _fractions(b.ulp_hist) - _fractions(a.ulp_hist),
                       _fractions(b.abs_hist) - _fractions(a.abs_hist),
                       [v for v in a.variants if v in b.variants])
