"""Routing-jitter analysis: which top-k decisions are fragile under real numerics variants, and
what a stable-top-k epsilon costs. Qt-free; the CLI and the Inspector both read its reports.

Method. A fixed token sequence (the prompt, then the baseline's greedy continuation) is
processed teacher-forced by the baseline (default numerics, plain top-k) and by every variant
(colibri.numerics settings or weight-precision copies, colibri.jitter.variants), so position p
is the same token in every run. A *cell* is one (position, MoE layer) routing decision.

jitter report (`analyze_jitter`, colibri.jitter.passes):
  - baseline top-k set of every cell; margin = how far the baseline's decision was from going
    another way, on the selection scores the rule ranks (the router logits for a softmax without
    a correction bias; sigmoid + bias for DeepSeek-V3; the kept/dropped group gap when a group
    limit is closer: colibri.margins), absolute and in ULPs (distance on the ordered float32
    line, adjacent floats 1 apart, +0 == -0);
  - a variant *flips* a cell when its selected set (order ignored) differs from the baseline's;
    flip rate of a variant = flipped cells / cells; cell flip rate = fraction of variants that
    flip the cell; overall flip rate = flipped (cell, variant) pairs / (cells * variants);
  - flips against margin: cells binned by baseline ULP margin (0, 1, 2-3, 4-7, ...);
  - downstream per variant: the first position whose selected experts differ in any layer, the
    first position whose greedy next token (arg-max of the logits, lowest id on ties) differs,
    and per position the max |logit difference| and KL(baseline || variant) of the softmaxes.
  Later flips can be consequences of earlier ones (the hidden states diverge); the first
  divergence positions separate cause from consequence.

epsilon report (`analyze_epsilon`, colibri.jitter.passes), for each epsilon of the list:
  - the eps-baseline and every variant run with stable routing at that epsilon;
  - jitter left = cells where at least one variant's set differs from the eps-baseline's;
  - bias = cells where the eps-baseline's set differs from the plain top-k baseline's (the
    decisions the epsilon itself changes), with their downstream divergence;
  - recommended epsilon = the smallest of the list with zero jitter left, with the decisions it
    changes (its bias cells) stated; None when no epsilon of the list removes every flip.

Everything is a pure function of (file, tokens, settings): the engine is deterministic, the
reports hold no timestamps, and `to_dict` output is stable (JSON with sorted keys).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from colibri.engine import CacheStats, Model, Session
from colibri.jitter.variants import Variant
from colibri.margins import (Decisions, GroupLimit, ordered_keys,
                             selection_margins)
from colibri.jitter.weights import convert_weights

SCHEMA_JITTER = "colibri.jitter/1"
SCHEMA_EPSILON = "colibri.epsilon/1"
DEFAULT_EPS = (0.0, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5)
BASELINE = "baseline"

# ---------------------------------------------------------------------------------------------
# float32 helpers


ordered_int = ordered_keys  # float32 -> int64 positions on the ordered float line


def selection_order(selection_scores: np.ndarray, epsilon: float = 0.0) -> np.ndarray:
    """Expert indices of each cell in the engine's selection order without a group limit:
    descending (double)selection_score[j] + j*epsilon, exact ties to the lower index (router.c)."""
    scores = selection_scores.astype(np.float64)
    if epsilon:
        scores = scores + np.arange(scores.shape[-1], dtype=np.float64) * epsilon
    return np.argsort(-scores, axis=-1, kind="stable")


def margins(run: Decisions, limits: Sequence[GroupLimit], k: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """(absolute float64, ULP int64) margin of each cell's decision in `run` (a Run or a Trace),
    [P][M], on its selection scores (colibri.margins); k is the model's top-k. Undefined (k ==
    n_experts): inf and -1."""
    margin, ulps = selection_margins(run.selection_scores, run.expert_ids, run.chosen_groups,
                                     limits, k)
    undefined = ~np.isfinite(margin)
    return (np.where(undefined, np.inf, margin.astype(np.float64)),
            np.where(undefined, -1, ulps).astype(np.int64))


def ulp_bin(ulps: int) -> int:
    """Bin of a ULP margin: 0 -> 0, 1 -> 1, 2-3 -> 2, 4-7 -> 3, ... (negative: -1)."""
    return -1 if ulps < 0 else (0 if ulps == 0 else int(ulps).bit_length())


def ulp_bins(ulps: np.ndarray) -> np.ndarray:
    """`ulp_bin` of every element of an int64 array of ULP margins (the same bins: the bit length
    of the margin, -1 for a negative one)."""
    u = np.asarray(ulps, dtype=np.int64)
    return np.where(u < 0, -1, np.frexp(np.maximum(u, 0).astype(np.float64))[1]).astype(np.int64)


def ulp_bin_label(b: int) -> str:
    if b < 0:
        return "none"
    if b <= 1:
        return str(b)
    if b <= 10:
        return f"{1 << (b - 1)}-{(1 << b) - 1}"
    return f"2^{b - 1}-2^{b}"


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """float64 log-softmax over the last axis, in place on one float64 copy."""
    out = x.astype(np.float64)
    out -= out.max(axis=-1, keepdims=True)
    out -= np.log(np.exp(out).sum(axis=-1, keepdims=True))
    return out


def logit_divergence(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position: max |a - b| and KL(softmax(a) || softmax(b)), both float64 [P]. The
    operations work in place on few copies: over a jitter lab's or an epsilon sweep's every run,
    the allocations of [positions, vocabulary] float64 arrays were most of its time."""
    diff = a.astype(np.float64)
    diff -= b
    max_abs = np.abs(diff, out=diff).max(axis=-1)
    la = _log_softmax(a)
    terms = _log_softmax(b)
    np.subtract(la, terms, out=terms)
    terms *= np.exp(la)
    kl = terms.sum(axis=-1)
    return max_abs, np.maximum(kl, 0.0)


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


# ---------------------------------------------------------------------------------------------
# runs


@dataclass(frozen=True)
class Run:
    """One teacher-forced pass: logits [P][V], selected experts [P][M][k] in selection order,
    router logits as routing used them [P][M][E], the selection scores the choice ranked
    [P][M][E] and the kept groups [P][M][g]."""

    name: str
    logits: np.ndarray
    expert_ids: np.ndarray
    router_logits: np.ndarray
    selection_scores: np.ndarray
    chosen_groups: np.ndarray
    kernels: str = ""                        # the kernel path the run's session ran
    cache: CacheStats | None = None          # the session's expert-caching counts

    @property
    def sets(self) -> np.ndarray:
        """Selected expert sets, sorted ascending per cell [P][M][k]."""
        return np.sort(self.expert_ids, axis=-1)


class Runner:
    """Runs variants of one open model on token sequences. Weight-precision copies are written
    once to a private temporary directory and removed by `close`, which closes them but not the
    model it was given (`Runner.open(path)` opens one of its own and closes that too)."""

    def __init__(self, model: Model, threads: int = 1) -> None:
        self.model = model
        self.path = model.path
        self.threads = threads
        self._models: dict[str | None, Model] = {None: model}
        self._owned: list[Model] = []
        self._tmp: str | None = None
        self._kept = 0                      # logits files written by `keep`

    @classmethod
    def open(cls, path: str | os.PathLike[str], threads: int = 1) -> Runner:
        """A runner on its own model of `path` (for scripts; the CLI and the Inspector hand
        over the model they opened)."""
        runner = cls(Model.open(path), threads)
        runner._owned.append(runner.model)
        return runner

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for m in self._owned:
            m.close()
        self._models, self._owned = {}, []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def model_for(self, variant: Variant) -> Model:
        if variant.weights not in self._models:
            if self._tmp is None:
                self._tmp = tempfile.mkdtemp(prefix="colibri-jitter-")
            out = os.path.join(self._tmp, f"weights-{variant.weights}.colibri")
            convert_weights(self.model, variant.weights or "f32", out)
            copy = Model.open(out)
            self._models[variant.weights] = copy
            self._owned.append(copy)
        return self._models[variant.weights]

    def check(self, variants: Sequence[Variant] = (), eps: Sequence[float] = (),
              routings: Sequence[dict[str, Any]] = ()) -> None:
        """Ask the engine, before anything runs, whether it takes every variant's numerics,
        every stable-routing epsilon and every routing setting (Runner.run's keywords)
        (col_session_config_check, nothing allocated); raises its ColibriValueError otherwise."""
        for v in variants:
            Session.memory_estimate(self.model, numerics=v.numerics, kernels=v.kernels,
                                    threads=self.threads)
        for e in eps:
            Session.memory_estimate(self.model, routing="stable", epsilon=e, threads=self.threads)
        for r in routings:
            Session.memory_estimate(self.model, threads=self.threads, **r)

    def session(self, n_positions: int, variant: Variant | None = None, routing: str = "topk",
                epsilon: float = 0.0, seed: int = 0, cache_threshold: float = 0.0,
                expert_cache: int = 0) -> Session:
        """A traced session of `variant` for a teacher-forced pass of `n_positions` (the
        caller closes it); raises ValueError when the machine lacks the variant's kernels."""
        variant = variant or Variant()
        s = Session(self.model_for(variant), routing=routing, epsilon=epsilon, seed=seed,
                    threads=self.threads, max_context=n_positions, trace=True,
                    numerics=variant.numerics, kernels=variant.kernels,
                    cache_threshold=cache_threshold, expert_cache=expert_cache)
        if variant.kernels is not None and s.kernels != variant.kernels:
            ran = s.kernels
            s.close()
            raise ValueError(f"variant {variant.name}: this machine runs no {variant.kernels} "
                             f"kernels (it ran {ran})")
        return s

    def keep(self, run: Run) -> Run:
        """`run` with its logits in a file of the runner's temporary directory, read back
        mapped: a sweep holds many runs' logits without their memory (close removes them).
        The file is written, not mapped for writing, so a full disk raises here rather than
        killing the process at a page it cannot hold; `run` then stays as it is, in memory."""
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="colibri-jitter-")
        self._kept += 1
        path = os.path.join(self._tmp, f"logits-{self._kept}.npy")
        try:
            np.save(path, run.logits)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(path)
            return run
        return replace(run, logits=np.load(path, mmap_mode="r"))

    @staticmethod
    def run_of(variant: Variant, session: Session, logits: np.ndarray) -> Run:
        """The Run of a session's pass that gave `logits` (the trace's arrays copied)."""
        trace = session.trace
        assert trace is not None
        return Run(BASELINE if variant.is_baseline else variant.name, logits,
                   np.array(trace.expert_ids), np.array(trace.router_logits),
                   np.array(trace.selection_scores), np.array(trace.chosen_groups),
                   session.kernels, session.cache_stats())

    def run(self, tokens: Sequence[int], variant: Variant | None = None, routing: str = "topk",
            epsilon: float = 0.0, seed: int = 0, cache_threshold: float = 0.0,
            expert_cache: int = 0) -> Run:
        """One teacher-forced pass: `tokens` in one prefill (every position's logits)."""
        variant = variant or Variant()
        with self.session(len(tokens), variant, routing, epsilon, seed, cache_threshold,
                          expert_cache) as s:
            return self.run_of(variant, s, s.prefill(list(tokens)))

    def greedy_sequence(self, prompt: Sequence[int], n_generate: int) -> list[int]:
        """prompt + the baseline's greedy continuation of n_generate tokens (stops after EOS)."""
        with Session(self.model, threads=self.threads,
                     max_context=len(prompt) + max(n_generate, 0), trace=False) as s:
            return s.generate(prompt, n_generate).tokens


class RoutingStream:
    """One variant's teacher-forced pass of `tokens` kept across routing settings (top-k, stable
    and Gumbel routing): after the first, each run routes the recorded positions again
    (Session.set_routing) and recomputes only from the first one the new setting decides
    differently, with the bits of a pass of its own (expert caching's counts included). Close
    it, or use it in a `with`."""

    def __init__(self, runner: Runner, tokens: Sequence[int], variant: Variant | None = None,
                 expert_cache: int = 0) -> None:
        self.variant = variant or Variant()
        self.tokens = list(tokens)
        self._session = runner.session(len(self.tokens), self.variant, expert_cache=expert_cache)
        self._last: Run | None = None

    def __enter__(self) -> RoutingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._session.close()

    def run(self, routing: str = "topk", epsilon: float = 0.0, seed: int = 0) -> tuple[Run, int]:
        """The pass under this routing, and the first position it recomputed: len(tokens) when
        the pass equals the last one, which is then returned itself."""
        s = self._session
        first = s.set_routing(routing, epsilon, seed)  # type: ignore[arg-type]
        if self._last is not None and first == len(self.tokens):
            return self._last, first
        s.truncate(first)
        rows = s.prefill(self.tokens[first:])
        logits = rows if self._last is None or first == 0 else \
            np.concatenate([self._last.logits[:first], rows])
        self._last = Runner.run_of(self.variant, s, logits)
        return self._last, first


# ---------------------------------------------------------------------------------------------
# jitter report


def cells_mask(cells: list[list[int]], shape: tuple[int, int]) -> np.ndarray:
    """The [P][M] bool mask of a report's (position, layer) cell list (json_ints of argwhere)."""
    m = np.zeros(shape, dtype=bool)
    for p, layer in cells:
        m[p, layer] = True
    return m


def json_ints(a: np.ndarray) -> list[Any]:
    """int arrays -> nested lists (the reports' JSON)."""
    return np.asarray(a).tolist()


def json_floats(a: np.ndarray) -> list[Any]:
    """float arrays -> nested lists of Python floats (inf/nan as strings, JSON-safe)."""
    def conv(x: Any) -> Any:
        if isinstance(x, list):
            return [conv(v) for v in x]
        x = float(x)
        return x if math.isfinite(x) else repr(x)
    return conv(np.asarray(a, dtype=np.float64).tolist())


def from_json_floats(a: Any, dtype: Any = np.float64) -> np.ndarray:
    """json_floats' lists back to an array ('inf'/'nan' strings included)."""
    def conv(x: Any) -> Any:
        if isinstance(x, list):
            return [conv(v) for v in x]
        return float(x)
    return np.asarray(conv(a), dtype=dtype)


@dataclass
class Downstream:
    first_expert_divergence: int | None
    first_token_divergence: int | None
    max_abs: np.ndarray            # [P] float64
    kl: np.ndarray                 # [P] float64

    @classmethod
    def between(cls, base: Run, other: Run) -> Downstream:
        if base.sets.shape == other.sets.shape:
            differ = (base.sets != other.sets).any(axis=(1, 2))
        else:  # another number of experts per decision (soft routing): every position differs
            differ = np.ones(base.sets.shape[0], dtype=bool)
        tokens = np.argmax(base.logits, axis=-1) != np.argmax(other.logits, axis=-1)
        max_abs, kl = logit_divergence(base.logits, other.logits)
        return cls(_first(differ), _first(tokens), max_abs, kl)

    def to_dict(self) -> dict[str, Any]:
        return {"first_expert_divergence": self.first_expert_divergence,
                "first_token_divergence": self.first_token_divergence,
                "max_abs": json_floats(self.max_abs), "kl": json_floats(self.kl),
                "max_abs_max": float(self.max_abs.max()) if self.max_abs.size else 0.0,
                "kl_max": float(self.kl.max()) if self.kl.size else 0.0}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Downstream:
        return cls(d["first_expert_divergence"], d["first_token_divergence"],
                   from_json_floats(d["max_abs"]), from_json_floats(d["kl"]))


@dataclass
class LabReport:
    """What every lab report (JitterReport, EpsilonReport, RemedyReport) states about its run."""

    model: str                               # file name
    tokens: list[int]
    n_prompt: int                            # the first n_prompt tokens are the prompt
    moe_layers: list[int]
    n_experts: int
    k: int
    threads: int
    variants: list[str]                      # in run order, baseline excluded
    # the baseline's kernel path ("" in older reports); keyword-only, so that it can have a
    # default while each report's own fields follow without one
    kernels: str = field(default="", kw_only=True)

    def run_dict(self) -> dict[str, Any]:
        """These fields as the report's JSON states them."""
        return {"model": self.model, "tokens": list(self.tokens), "n_prompt": self.n_prompt,
                "moe_layers": list(self.moe_layers), "n_experts": self.n_experts, "k": self.k,
                "threads": self.threads, "kernels": self.kernels, "variants": list(self.variants)}

    @staticmethod
    def run_fields_of(d: dict[str, Any]) -> dict[str, Any]:
        """These fields' keyword arguments from a report's JSON (run_dict's inverse)."""
        return dict(model=d["model"], tokens=list(d["tokens"]), n_prompt=d["n_prompt"],
                    moe_layers=list(d["moe_layers"]), n_experts=d["n_experts"], k=d["k"],
                    threads=d["threads"], variants=list(d["variants"]),
                    kernels=d.get("kernels", ""))


def run_fields(runner: Runner, tokens: Sequence[int], n_prompt: int | None,
               variants: Sequence[str], kernels: str) -> dict[str, Any]:
    """LabReport's fields for a run of `runner` on `tokens` (all of them the prompt unless
    n_prompt says), as keyword arguments."""
    hp = runner.model.hparams
    moe = [layer for layer in range(hp.n_layers) if runner.model.routing(layer).kind == "moe"]
    return dict(model=os.path.basename(runner.path), tokens=[int(t) for t in tokens],
                n_prompt=len(tokens) if n_prompt is None else n_prompt, moe_layers=moe,
                n_experts=hp.n_experts, k=hp.n_experts_active, threads=runner.threads,
                variants=list(variants), kernels=kernels)


@dataclass
class JitterReport(LabReport):
    """Everything the jitter views show; `to_dict`/`from_dict` round-trip it through JSON."""

    sets: dict[str, np.ndarray]              # name (and "baseline") -> [P][M][k] sorted ids
    router_logits: dict[str, np.ndarray]     # name (and "baseline") -> [P][M][E] float32
    margin_abs: np.ndarray                   # [P][M] float64
    margin_ulps: np.ndarray                  # [P][M] int64
    downstream: dict[str, Downstream] = field(default_factory=dict)
    # name (and "baseline") -> [P][M][E] float32, what each run's choice ranked (reports without
    # them come from version-1 models, which rank the router logits)
    selection_scores: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.selection_scores:
            self.selection_scores = dict(self.router_logits)

    @property
    def n_positions(self) -> int:
        return len(self.tokens)

    def flips(self, name: str) -> np.ndarray:
        """[P][M] bool: cells whose selected set under `name` differs from the baseline's."""
        return (self.sets[name] != self.sets[BASELINE]).any(axis=-1)

    def flip_counts(self) -> np.ndarray:
        """[P][M] number of variants flipping each cell."""
        total = np.zeros(self.margin_ulps.shape, dtype=np.int64)
        for name in self.variants:
            total += self.flips(name)
        return total

    def cell_flip_rate(self) -> np.ndarray:
        return self.flip_counts() / max(len(self.variants), 1)

    def flip_rate(self) -> dict[str, float]:
        return {name: float(self.flips(name).mean()) for name in self.variants}

    def overall_flip_rate(self) -> float:
        cells = self.margin_ulps.size * len(self.variants)
        return float(self.flip_counts().sum() / cells) if cells else 0.0

    def flips_vs_margin(self) -> list[dict[str, Any]]:
        """Per ULP-margin bin: cells, cells flipped by any variant, flipped (cell, variant) pairs."""
        counts = self.flip_counts()
        bins: dict[int, list[int]] = {}
        for (p, m), u in np.ndenumerate(self.margin_ulps):
            b = ulp_bin(int(u))
            row = bins.setdefault(b, [0, 0, 0])
            row[0] += 1
            row[1] += int(counts[p, m] > 0)
            row[2] += int(counts[p, m])
        return [{"bin": b, "label": ulp_bin_label(b), "cells": c, "flipped_cells": f,
                 "flips": n, "flip_rate": n / (c * max(len(self.variants), 1))}
                for b, (c, f, n) in sorted(bins.items())]

    def cell(self, position: int, layer_index: int) -> dict[str, Any]:
        """One cell for the token view: every run's router logits, selection scores and selected
        set."""
        names = [BASELINE, *self.variants]
        return {
            "position": position, "layer": self.moe_layers[layer_index],
            "token": self.tokens[position],
            "margin_abs": float(self.margin_abs[position, layer_index]),
            "margin_ulps": int(self.margin_ulps[position, layer_index]),
            "runs": {n: {"router_logits": self.router_logits[n][position, layer_index].tolist(),
                         "selection_scores":
                             self.selection_scores[n][position, layer_index].tolist(),
                         "selected": self.sets[n][position, layer_index].tolist(),
                         "flipped": bool(n != BASELINE and self.flips(n)[position, layer_index])}
                     for n in names},
        }

    def summary(self) -> dict[str, Any]:
        return {"cells": int(self.margin_ulps.size),
                "flipped_cells": int((self.flip_counts() > 0).sum()),
                "overall_flip_rate": self.overall_flip_rate()}

    def to_dict(self) -> dict[str, Any]:
        names = [BASELINE, *self.variants]
        return {
            "schema": SCHEMA_JITTER, **self.run_dict(),
            "sets": {n: json_ints(self.sets[n]) for n in names},
            "router_logits": {n: json_floats(self.router_logits[n]) for n in names},
            "selection_scores": {n: json_floats(self.selection_scores[n]) for n in names},
            "margin_abs": json_floats(self.margin_abs), "margin_ulps": json_ints(self.margin_ulps),
            "flips": {n: json_ints(self.flips(n).astype(np.int8)) for n in self.variants},
            "cell_flip_rate": json_floats(self.cell_flip_rate()),
            "flip_rate": self.flip_rate(),
            "flips_vs_margin": self.flips_vs_margin(),
            "downstream": {n: self.downstream[n].to_dict() for n in self.variants},
            "summary": self.summary(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JitterReport:
        if d.get("schema") != SCHEMA_JITTER:
            raise ValueError(f"not a jitter report (schema {d.get('schema')!r})")
        names = [BASELINE, *d["variants"]]
        return cls(**cls.run_fields_of(d),
                   sets={n: np.asarray(d["sets"][n], dtype=np.int32) for n in names},
                   router_logits={n: from_json_floats(d["router_logits"][n], np.float32)
                                  for n in names},
                   margin_abs=from_json_floats(d["margin_abs"]),
                   margin_ulps=np.asarray(d["margin_ulps"], dtype=np.int64),
                   downstream={n: Downstream.from_dict(d["downstream"][n])
                               for n in d["variants"]},
                   selection_scores={n: from_json_floats(d["selection_scores"][n], np.float32)
                                     for n in names} if "selection_scores" in d else {})


class Reportable(Protocol):
    """A lab report: JitterReport, EpsilonReport, colibri.jitter.remedies.RemedyReport."""

    def to_dict(self) -> dict[str, Any]: ...


def report_json(report: Reportable) -> bytes:
    """A report as JSON bytes: sorted keys, no whitespace, no timestamps, so the same inputs give
    the same bytes (what `colibri jitter --json` writes and the lab saves)."""
    return json.dumps(report.to_dict(), sort_keys=True, separators=(",", ":")).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# epsilon report


@dataclass
class EpsilonRow:
    eps: float
    sets: np.ndarray                         # [P][M][k] eps-baseline sets
    jitter_cells: np.ndarray                 # [P][M] bool: some variant differs from eps-baseline
    variant_flips: dict[str, int]            # cells each variant flips against the eps-baseline
    bias_cells: np.ndarray                   # [P][M] bool: eps-baseline differs from plain top-k
    bias: Downstream                         # eps-baseline against plain top-k
    jitter_max_abs: float                    # max over variants and positions, vs eps-baseline
    jitter_kl_max: float
    jitter_first_token_divergence: int | None

    @property
    def jitter_left(self) -> int:
        return int(self.jitter_cells.sum())

    @property
    def n_bias(self) -> int:
        return int(self.bias_cells.sum())

    def to_dict(self) -> dict[str, Any]:
        return {"eps": self.eps, "sets": json_ints(self.sets),
                "jitter_left": self.jitter_left, "jitter_cells": json_ints(np.argwhere(self.jitter_cells)),
                "variant_flips": dict(self.variant_flips),
                "bias": self.n_bias, "bias_cells": json_ints(np.argwhere(self.bias_cells)),
                "bias_downstream": self.bias.to_dict(),
                "jitter_max_abs": self.jitter_max_abs, "jitter_kl_max": self.jitter_kl_max,
                "jitter_first_token_divergence": self.jitter_first_token_divergence}

    @classmethod
    def from_dict(cls, d: dict[str, Any], shape: tuple[int, int]) -> EpsilonRow:
        return cls(d["eps"], np.asarray(d["sets"], dtype=np.int32),
                   cells_mask(d["jitter_cells"], shape),
                   dict(d["variant_flips"]), cells_mask(d["bias_cells"], shape),
                   Downstream.from_dict(d["bias_downstream"]), d["jitter_max_abs"],
                   d["jitter_kl_max"], d["jitter_first_token_divergence"])


@dataclass
class EpsilonReport(LabReport):
    plain_sets: np.ndarray                   # [P][M][k] plain top-k baseline
    rows: list[EpsilonRow]                   # ascending eps

    def recommended(self) -> EpsilonRow | None:
        """The smallest epsilon of the list with zero jitter left."""
        for row in self.rows:
            if row.jitter_left == 0:
                return row
        return None

    def changed_decisions(self, row: EpsilonRow) -> list[dict[str, Any]]:
        return [{"position": int(p), "layer": self.moe_layers[m], "layer_index": int(m),
                 "plain": json_ints(self.plain_sets[p, m]), "stable": json_ints(row.sets[p, m])}
                for p, m in np.argwhere(row.bias_cells)]

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended()
        return {
            "schema": SCHEMA_EPSILON, **self.run_dict(),
            "plain_sets": json_ints(self.plain_sets),
            "rows": [r.to_dict() for r in self.rows],
            "curve": [{"eps": r.eps, "jitter_left": r.jitter_left, "bias": r.n_bias}
                      for r in self.rows],
            "recommended": None if rec is None else {
                "eps": rec.eps, "bias": rec.n_bias,
                "changed_decisions": self.changed_decisions(rec)},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpsilonReport:
        if d.get("schema") != SCHEMA_EPSILON:
            raise ValueError(f"not an epsilon report (schema {d.get('schema')!r})")
        plain = np.asarray(d["plain_sets"], dtype=np.int32)
        shape = (plain.shape[0], plain.shape[1])
        return cls(**cls.run_fields_of(d), plain_sets=plain,
                   rows=[EpsilonRow.from_dict(r, shape) for r in d["rows"]])


def parse_eps(text: str | None) -> list[float]:
    """'0,1e-9,...' -> sorted unique floats (None or '' = DEFAULT_EPS). Whether the engine takes
    each one is its to say (Runner.check)."""
    if not text:
        return list(DEFAULT_EPS)
    out = set()
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            out.add(float(part))
        except ValueError:
            raise ValueError(f"expected comma-separated epsilons, got {text!r}") from None
    if not out:
        raise ValueError("empty epsilon list")
    return sorted(out)
