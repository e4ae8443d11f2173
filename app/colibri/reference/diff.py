"""The reference diff: a prompt through Colibri and through transformers, compared layer by layer.

`reference_diff(model, hf_dir, tokens)` runs the .colibri file in the engine (each layer's hidden
state captured, col_session_capture) and the Hugging Face checkpoint it came from in transformers
(colibri.reference.transformers_run), and returns a `ReferenceDiff`: per (layer, position) the
largest difference of the hidden state (the residual stream after the layer), absolute and
relative to the reference's largest value at that cell; per (MoE layer, position) the largest
router-logit and selection-score differences and whether the two engines chose different expert
sets; per position the logits' difference and both engines' next token. `colibri diff` prints
it, the Inspector's reference diff shows it as a layer x position heatmap.

What it answers is where a conversion or the engine first goes wrong:
  * the first layer over tolerance: the first layer whose hidden state differs by more than the
    tolerance (relative) at some position: a wrong weight, norm or rule in that layer shows
    there first, because every later layer inherits its error;
  * the first routing divergence, layer first, then position: the first decision whose expert
    sets differ (as sets: the order of the chosen experts and their weights are not compared).
    Each divergence gets a cause from the reference's margin m (how far its decision was from
    going another way, colibri.margins) and the largest selection-score difference d between
    the engines at that cell (the tolerance scaled by the cell's largest value says what is
    small): m > 2d, the scores agree and the choice still differs: 'rule differs' (a group
    limit, a top-k); else the scores moved enough to flip it: a 'near tie' when d is small,
    'router logits differ' when the logits do (the router's weights, or an earlier error that
    reached its input), 'selection scores differ' when only the scores do (the scoring or the
    correction bias).

Engine-free at import and Qt-free; torch and transformers are imported only by `reference_diff`
(the `reference` extra), so a saved diff opens without them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.fileformat import rows_dtype_name
from colibri.margins import GroupLimit, group_limits, selection_margins
from colibri.values import CancelFlag, Progress, check_cancelled, never_cancelled, no_progress

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model
    from colibri.reference.transformers_run import ReferenceRun

SCHEMA = "colibri.reference-diff/1"
# Relative hidden-state tolerances. A file holding the checkpoint's own values (f32, or the
# 16-bit dtype the checkpoint stores) against an f32 reference differs by summation order only;
# a file that rounded the weights (16-bit or quantised from wider ones), or a reference computing
# in bf16, by that rounding, which every layer carries on (measured on the conformance models:
# up to 7e-3 with f16 files, 6e-2 with bf16 files, from f32 checkpoints).
EXACT = 1e-4
ROUNDED = {"f16": 2e-2, "bf16": 1e-1, "q8_0": 1e-1, "q4_0": 3e-1}
_TINY = np.float32(1e-30)
# Why two engines chose differently (Divergence.cause; the module docstring says how it is told)
NEAR_TIE = "near tie"
LOGITS_DIFFER = "router logits differ"
SCORES_DIFFER = "selection scores differ"
RULE_DIFFERS = "rule differs"
CAUSES = (NEAR_TIE, LOGITS_DIFFER, SCORES_DIFFER, RULE_DIFFERS)
_SAFETENSORS_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64"}


def default_tolerance(file_dtype: str, checkpoint_dtype: str, reference_dtype: str) -> float:
    """The tolerance of a file storing its experts in `file_dtype`, converted from a checkpoint
    storing its weights in `checkpoint_dtype`, against a reference computing in
    `reference_dtype`."""
    tol = ROUNDED["bf16"] if reference_dtype == "bf16" else EXACT
    file_dtype = rows_dtype_name(file_dtype)  # panels hold the values of their rows
    if file_dtype not in ("f32", checkpoint_dtype):   # the conversion rounded the weights
        tol = max(tol, ROUNDED.get(file_dtype, ROUNDED["q4_0"]))
    return tol


def checkpoint_dtype(hf_dir: str | os.PathLike[str]) -> str:
    """The dtype holding most of the checkpoint's values ('f32', 'bf16', 'f16'), from its
    safetensors headers; 'unknown' when they cannot be read."""
    from colibri.errors import ColibriError
    from colibri.formats.safetensors_file import Checkpoint

    try:
        tensors = Checkpoint.open(os.fspath(hf_dir)).tensors
    except (ColibriError, OSError):
        return "unknown"
    counts: dict[str, int] = {}
    for t in tensors:
        counts[t.dtype] = counts.get(t.dtype, 0) + t.n_elements
    if not counts:
        return "unknown"
    most = max(counts, key=lambda k: counts[k])
    return _SAFETENSORS_DTYPES.get(most, most.lower())


class ReferenceMismatch(ValueError):
    """The reference cannot be compared with the file: the checkpoint is not the model the file
    holds (layers, width, vocabulary, experts), or transformers is not installed."""


@dataclass
class Routing:
    """One engine's routing of the prompt (T positions, M MoE layers, E experts, k chosen)."""

    expert_ids: np.ndarray        # [T, M, k] int32
    expert_weights: np.ndarray    # [T, M, k] float32 (NaN: not given)
    router_logits: np.ndarray     # [T, M, E] float32
    selection_scores: np.ndarray  # [T, M, E] float32: what the rule ranked
    chosen_groups: np.ndarray     # [T, M, g] int32, -1 pad; g 0 without groups

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name).tolist() for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], T: int, M: int) -> Routing:
        def arr(name: str, dtype: Any) -> np.ndarray:
            a = np.asarray(data[name], dtype=dtype)
            return a.reshape(T, M, -1) if a.size else np.zeros((T, M, 0), dtype)
        return cls(arr("expert_ids", np.int32), arr("expert_weights", np.float32),
                   arr("router_logits", np.float32), arr("selection_scores", np.float32),
                   arr("chosen_groups", np.int32))


@dataclass(frozen=True)
class Divergence:
    """One (MoE layer, position) whose expert sets differ."""

    layer: int            # layer index
    moe_index: int        # index among the MoE layers
    position: int
    colibri: tuple[int, ...]
    reference: tuple[int, ...]
    reference_margin: float
    colibri_margin: float
    score_difference: float   # largest |selection score difference| at the cell
    logit_difference: float   # largest |router logit difference| at the cell
    cause: str                # one of CAUSES

    def describe(self) -> str:
        def ids(xs: tuple[int, ...]) -> str:
            return "[" + ",".join(map(str, xs)) + "]"
        return (f"layer {self.layer} position {self.position}: colibri {ids(self.colibri)}, "
                f"transformers {ids(self.reference)}; {self.cause} (transformers' margin "
                f"{self.reference_margin:.3g}, colibri's {self.colibri_margin:.3g}; router "
                f"logits differ by up to {self.logit_difference:.3g}, selection scores by "
                f"{self.score_difference:.3g})")


@dataclass(frozen=True)
class LayerRow:
    """One layer's summary line."""

    layer: int
    kind: str                     # 'dense' or 'moe'
    hidden_abs: float             # largest |difference| of the hidden state, over positions
    hidden_rel: float             # largest relative difference
    worst_position: int           # where hidden_rel is largest
    router_abs: float | None      # largest |router-logit difference| (MoE layers)
    diverged: int | None          # decisions whose expert sets differ (MoE layers)


@dataclass
class ReferenceDiff:
    """Colibri against transformers on one prompt (the module docstring says what is compared).
    T positions, L layers, M MoE layers."""

    model: str                    # the .colibri file
    arch: str
    file_dtype: str               # how the file stores its expert weights
    reference: str                # the checkpoint directory
    checkpoint_dtype: str         # how the checkpoint stores most of its weights
    reference_class: str          # transformers' model class
    reference_dtype: str          # the precision transformers computed in
    kernels: str                  # Colibri's kernel path
    tolerance: float              # relative hidden-state tolerance
    tokens: list[int]
    token_texts: list[str]
    layer_kinds: list[str]        # [L] 'dense' or 'moe'
    moe_layers: np.ndarray        # [M] int32 layer index of each MoE layer
    hidden_abs: np.ndarray        # [L, T] max |h_colibri - h_reference|
    hidden_rel: np.ndarray        # [L, T] hidden_abs / max |h_reference|
    logits_abs: np.ndarray        # [T] max |logit difference|
    logits_rel: np.ndarray        # [T] logits_abs / max |reference logit|
    next_colibri: np.ndarray      # [T] int32 arg-max of Colibri's logits
    next_reference: np.ndarray    # [T] int32 arg-max of transformers'
    colibri: Routing
    ref: Routing
    group_limits: list[GroupLimit] = field(default_factory=list)   # [M] the reference's rules

    # -- derived --------------------------------------------------------------------------------

    @property
    def n_positions(self) -> int:
        return len(self.tokens)

    @property
    def n_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def router_abs(self) -> np.ndarray:
        """[M, T] max |router-logit difference| per decision."""
        return np.abs(self.colibri.router_logits - self.ref.router_logits).max(
            axis=2, initial=0.0).T

    @property
    def selection_abs(self) -> np.ndarray:
        """[M, T] max |selection-score difference| per decision."""
        return np.abs(self.colibri.selection_scores - self.ref.selection_scores).max(
            axis=2, initial=0.0).T

    @property
    def diverged(self) -> np.ndarray:
        """[M, T] bool: the two engines chose different expert sets."""
        a = np.sort(self.colibri.expert_ids, axis=2)
        b = np.sort(self.ref.expert_ids, axis=2)
        if a.shape != b.shape:
            return np.ones((len(self.moe_layers), self.n_positions), dtype=bool)
        return (a != b).any(axis=2).T

    def margins(self) -> tuple[np.ndarray, np.ndarray]:
        """([M, T] transformers' margins, [M, T] Colibri's), on the reference's rules."""
        k = self.ref.expert_ids.shape[2]
        limits = self.group_limits or [GroupLimit()] * len(self.moe_layers)
        ref, _ = selection_margins(self.ref.selection_scores, self.ref.expert_ids,
                                   self.ref.chosen_groups, limits, k)
        col, _ = selection_margins(self.colibri.selection_scores, self.colibri.expert_ids,
                                   self.colibri.chosen_groups, limits, k)
        return ref.T, col.T

    def divergences(self) -> list[Divergence]:
        """Every decision whose expert sets differ, layer first, then position, with its cause
        (CAUSES; the module docstring says how it is told)."""
        ref_margin, col_margin = self.margins()
        sel, logit = self.selection_abs, self.router_abs
        out = []
        for m, p in zip(*np.nonzero(self.diverged)):
            d, dl, mr = float(sel[m, p]), float(logit[m, p]), float(ref_margin[m, p])

            def small(diff: float, values: np.ndarray) -> bool:
                return diff <= self.tolerance * max(1.0, float(np.abs(values).max(initial=0.0)))

            if mr > 2 * d:   # a NaN margin (nothing to rank) counts as moved
                cause = RULE_DIFFERS
            elif small(d, self.ref.selection_scores[p, m]):
                cause = NEAR_TIE
            elif not small(dl, self.ref.router_logits[p, m]):
                cause = LOGITS_DIFFER
            else:
                cause = SCORES_DIFFER
            out.append(Divergence(int(self.moe_layers[m]), int(m), int(p),
                                  tuple(int(e) for e in self.colibri.expert_ids[p, m]),
                                  tuple(int(e) for e in self.ref.expert_ids[p, m]),
                                  mr, float(col_margin[m, p]), d, dl, cause))
        return out

    def first_divergence(self) -> Divergence | None:
        found = self.divergences()
        return found[0] if found else None

    def first_layer_over(self) -> int | None:
        """The first layer whose hidden state differs by more than the tolerance somewhere."""
        over = np.nonzero((self.hidden_rel > self.tolerance).any(axis=1)
                          | ~np.isfinite(self.hidden_rel).all(axis=1))[0]
        return int(over[0]) if over.size else None

    def layers(self) -> list[LayerRow]:
        router = self.router_abs
        diverged = self.diverged
        rows = []
        moe_index = {int(layer): m for m, layer in enumerate(self.moe_layers)}
        for layer, kind in enumerate(self.layer_kinds):
            rel = self.hidden_rel[layer]
            worst = int(np.nanargmax(rel)) if np.isfinite(rel).any() else 0
            m = moe_index.get(layer)
            rows.append(LayerRow(layer, kind, float(np.nanmax(self.hidden_abs[layer])),
                                 float(np.nanmax(rel)), worst,
                                 None if m is None else float(router[m].max(initial=0.0)),
                                 None if m is None else int(diverged[m].sum())))
        return rows

    def summary(self) -> dict[str, Any]:
        first = self.first_divergence()
        over = self.first_layer_over()
        return {"positions": self.n_positions, "layers": self.n_layers,
                "moe_layers": len(self.moe_layers), "tolerance": self.tolerance,
                "first_layer_over_tolerance": over,
                "first_divergence": None if first is None else {
                    "layer": first.layer, "position": first.position,
                    "colibri": list(first.colibri), "transformers": list(first.reference),
                    "cause": first.cause, "transformers_margin": first.reference_margin,
                    "colibri_margin": first.colibri_margin,
                    "score_difference": first.score_difference,
                    "logit_difference": first.logit_difference},
                "diverged_decisions": int(self.diverged.sum()),
                "decisions": int(self.diverged.size),
                "max_logit_difference": float(self.logits_abs.max(initial=0.0)),
                "next_token_differs": int((self.next_colibri != self.next_reference).sum())}

    # -- JSON -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (`colibri diff --json`, the Inspector's Save)."""
        out: dict[str, Any] = {"schema": SCHEMA}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Routing):
                out[f.name] = value.to_dict()
            elif isinstance(value, np.ndarray):
                out[f.name] = value.tolist()
            elif f.name == "group_limits":
                out[f.name] = [[g.n_groups, g.n_groups_kept, g.group_score] for g in value]
            else:
                out[f.name] = value
        out["summary"] = self.summary()
        out["layer_rows"] = [vars(r) for r in self.layers()]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReferenceDiff:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a reference diff (schema {data.get('schema')!r}, expected "
                             f"{SCHEMA!r})")
        T, M = len(data["tokens"]), len(data["moe_layers"])
        L = len(data["layer_kinds"])

        def arr(name: str, dtype: Any, *shape: int) -> np.ndarray:
            return np.asarray(data[name], dtype=dtype).reshape(shape)

        return cls(
            model=data["model"], arch=data["arch"], file_dtype=data["file_dtype"],
            reference=data["reference"], checkpoint_dtype=data["checkpoint_dtype"],
            reference_class=data["reference_class"],
            reference_dtype=data["reference_dtype"], kernels=data["kernels"],
            tolerance=float(data["tolerance"]), tokens=[int(t) for t in data["tokens"]],
            token_texts=[str(t) for t in data["token_texts"]],
            layer_kinds=[str(k) for k in data["layer_kinds"]],
            moe_layers=arr("moe_layers", np.int32, M),
            hidden_abs=arr("hidden_abs", np.float32, L, T),
            hidden_rel=arr("hidden_rel", np.float32, L, T),
            logits_abs=arr("logits_abs", np.float32, T),
            logits_rel=arr("logits_rel", np.float32, T),
            next_colibri=arr("next_colibri", np.int32, T),
            next_reference=arr("next_reference", np.int32, T),
            colibri=Routing.from_dict(data["colibri"], T, M),
            ref=Routing.from_dict(data["ref"], T, M),
            group_limits=[GroupLimit(*map(int, g)) for g in data.get("group_limits", [])])

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=True)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ReferenceDiff:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


# ---------------------------------------------------------------------------------------------
# Running both engines


@dataclass
class ColibriRun:
    """What the engine computed for the prompt."""

    logits: np.ndarray            # [T, vocab]
    hidden: np.ndarray            # [T, L, d_model] captured after each layer
    routing: Routing
    kernels: str


def run_colibri(model: Model, tokens: list[int], threads: int = 1) -> ColibriRun:
    """The prompt through the engine in one prefill, each layer's hidden state captured into a
    buffer of ours."""
    from colibri.engine import Session

    hp = model.hparams
    hidden = np.zeros((len(tokens), hp.n_layers, hp.d_model), dtype=np.float32)
    with Session(model, threads=threads, max_context=len(tokens)) as session:
        session.capture_into(hidden)
        generation = session.generate(tokens, 0, keep_logits=True, eos=None)
        trace = session.trace
        assert trace is not None and generation.logits is not None
        routing = Routing(np.array(trace.expert_ids), np.array(trace.expert_weights),
                          np.array(trace.router_logits), np.array(trace.selection_scores),
                          np.array(trace.chosen_groups))
        kernels = session.kernels
    return ColibriRun(np.concatenate(generation.logits), hidden, routing, kernels)


def _relative(diff: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """max |diff| over the last axis divided by max |ref| there."""
    scale = np.maximum(np.abs(ref).max(axis=-1), _TINY)
    return (np.abs(diff).max(axis=-1) / scale).astype(np.float32)


def compare(model: Model, hf_dir: str, colibri: ColibriRun, ref: ReferenceRun, tokens: list[int],
            tolerance: float | None = None, token_texts: list[str] | None = None,
            source_dtype: str = "unknown") -> ReferenceDiff:
    """The two runs of `tokens`, compared (module docstring)."""
    hp = model.hparams
    if ref.hidden.shape != colibri.hidden.shape:
        raise ReferenceMismatch(
            f"{hf_dir}: the checkpoint computes {ref.hidden.shape[1]} layers of width "
            f"{ref.hidden.shape[2]}, {os.path.basename(model.path)} has {hp.n_layers} of "
            f"{hp.d_model}")
    if ref.logits.shape != colibri.logits.shape:
        raise ReferenceMismatch(f"{hf_dir}: vocabulary of {ref.logits.shape[1]} tokens, "
                                  f"{os.path.basename(model.path)} has {hp.vocab_size}")
    kinds = [model.routing(layer).kind for layer in range(hp.n_layers)]
    moe_layers = np.array([i for i, k in enumerate(kinds) if k == "moe"], dtype=np.int32)
    if not np.array_equal(moe_layers, ref.moe_layers):
        raise ReferenceMismatch(
            f"{hf_dir}: MoE layers {ref.moe_layers.tolist()}, {os.path.basename(model.path)} "
            f"routes in layers {moe_layers.tolist()}")
    if ref.router_logits.shape[2:] != colibri.routing.router_logits.shape[2:]:
        raise ReferenceMismatch(f"{hf_dir}: {ref.router_logits.shape[2]} experts per layer, "
                                  f"{os.path.basename(model.path)} has {hp.n_experts}")
    diff = colibri.hidden - ref.hidden                             # [T, L, D]
    logit_diff = colibri.logits - ref.logits
    first_moe = f"layers.{int(moe_layers[0])}.moe_w1" if moe_layers.size else "token_embd"
    file_dtype = model.tensor_info(first_moe).dtype if first_moe in model else "f32"
    with np.errstate(invalid="ignore"):
        return ReferenceDiff(
            model=os.path.abspath(model.path), arch=model.arch, file_dtype=file_dtype,
            reference=os.path.abspath(hf_dir), checkpoint_dtype=source_dtype,
            reference_class=ref.model_class, reference_dtype=ref.dtype, kernels=colibri.kernels,
            tolerance=float(tolerance if tolerance is not None
                            else default_tolerance(file_dtype, source_dtype, ref.dtype)),
            tokens=[int(t) for t in tokens],
            token_texts=token_texts or [str(t) for t in tokens],
            layer_kinds=kinds, moe_layers=moe_layers,
            hidden_abs=np.abs(diff).max(axis=2).T.astype(np.float32),
            hidden_rel=_relative(diff, ref.hidden).T,
            logits_abs=np.abs(logit_diff).max(axis=1).astype(np.float32),
            logits_rel=_relative(logit_diff, ref.logits),
            next_colibri=colibri.logits.argmax(axis=1).astype(np.int32),
            next_reference=ref.logits.argmax(axis=1).astype(np.int32),
            colibri=colibri.routing,
            ref=Routing(ref.expert_ids, ref.expert_weights, ref.router_logits,
                        ref.selection_scores, ref.chosen_groups),
            group_limits=list(ref.group_limits) or group_limits(model))


def _check_shape(model: Model, hf_dir: str, shape: tuple[int, int, int]) -> None:
    """The checkpoint's (layers, hidden size, vocabulary) against the file's, before running."""
    hp = model.hparams
    mine = (hp.n_layers, hp.d_model, hp.vocab_size)
    if shape != mine:
        names = ("layers", "hidden size", "vocabulary")
        what = ", ".join(f"{n} {a} (the file: {b})" for n, a, b in zip(names, shape, mine)
                         if a != b)
        raise ReferenceMismatch(f"{hf_dir}: not the model of {os.path.basename(model.path)}: "
                                f"{what}")


def reference_diff(model: Model, hf_dir: str | os.PathLike[str], tokens: list[int], *,
                   dtype: str = "f32", threads: int = 1, tolerance: float | None = None,
                   token_texts: list[str] | None = None, progress: Progress = no_progress,
                   cancelled: CancelFlag = never_cancelled) -> ReferenceDiff:
    """Run `tokens` through `model` (an open colibri.Model) and through the checkpoint in
    `hf_dir` in transformers computing in `dtype` ('f32' or 'bf16'), and compare them. Progress
    per transformers layer; raises colibri.values.Cancelled between steps once `cancelled()`.
    Needs the `reference` extra."""
    try:
        from colibri.reference import transformers_run
    except ImportError as exc:
        raise ReferenceMismatch(
            f"the reference diff runs transformers, which is not installed ({exc}); install the "
            f"reference extra: pip install 'colibri-moe[reference]'") from exc

    tokens = [int(t) for t in tokens]
    if not tokens:
        raise ValueError("the prompt is empty")
    n_layers = model.hparams.n_layers
    total = n_layers + 3

    def step(done: int, text: str) -> None:
        check_cancelled(cancelled)
        progress(done, total, text)

    step(0, "running colibri")
    ours = run_colibri(model, tokens, threads)
    step(1, "loading the checkpoint in transformers")
    reference_model = transformers_run.load(hf_dir, dtype)
    _check_shape(model, os.fspath(hf_dir), transformers_run.shape_of(reference_model))
    step(2, "running transformers")
    ref = transformers_run.run(
        reference_model, tokens, lambda i, n, text="": progress(2 + i, total, text), cancelled)
    del reference_model
    step(2 + n_layers, "comparing")
    result = compare(model, os.fspath(hf_dir), ours, ref, tokens, tolerance, token_texts,
                     checkpoint_dtype(hf_dir))
    progress(total, total, "done")
    return result


__all__ = ["CAUSES", "EXACT", "LOGITS_DIFFER", "NEAR_TIE", "ROUNDED", "RULE_DIFFERS", "SCHEMA",
           "SCORES_DIFFER", "ColibriRun", "Divergence", "LayerRow", "ReferenceDiff",
           "ReferenceMismatch", "Routing", "checkpoint_dtype", "compare", "default_tolerance",
           "reference_diff", "run_colibri"]
