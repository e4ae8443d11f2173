"""The lab's passes: what the jitter report, the epsilon sweep and the remedies comparison run,
and the one function that runs them (Qt-free). The reports' definitions are in
colibri.jitter.analysis and colibri.jitter.remedies.

Each variant (and the baseline) runs on one RoutingStream: plain top-k first, then stable top-k
at every epsilon the reports ask for (the sweep's and the remedies' own), ascending, each pass
recomputed only from the first decision its epsilon changes. So the three reports asked for
together (`analyze_lab`) cost the sweep's passes plus the remedies' soft and cached ones: the
jitter report's passes are the sweep's at plain top-k, and the remedies' plain and stable rows
are passes the sweep makes or one more epsilon on the same streams. Each report is the one it
would be alone, byte for byte (`analyze_jitter`, `analyze_epsilon` and `analyze_remedies` are
`analyze_lab` asked for one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.jitter.analysis import (BASELINE, DEFAULT_EPS, Downstream, EpsilonReport, EpsilonRow,
                                     JitterReport, RoutingStream, Run, Runner, margins, run_fields)
from colibri.jitter.remedies import Remedy, RemedyReport, default_threshold, remedy_row
from colibri.jitter.variants import Variant, parse_variants
from colibri.margins import group_limits
from colibri.values import CancelFlag, Progress, check_cancelled, never_cancelled, no_progress

STATE_SCHEMA = "colibri.jitter-lab/1"
KINDS = ("jitter", "epsilon", "remedies")


@dataclass
class LabReports:
    """The reports of one lab run (None: not asked for); as JSON, the lab's saved state."""

    jitter: JitterReport | None = None
    epsilon: EpsilonReport | None = None
    remedies: RemedyReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": STATE_SCHEMA,
                **{kind: None if getattr(self, kind) is None else getattr(self, kind).to_dict()
                   for kind in KINDS}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LabReports:
        if d.get("schema") != STATE_SCHEMA:
            raise ValueError(f"not a jitter-lab state (schema {d.get('schema')!r})")
        read = {"jitter": JitterReport.from_dict, "epsilon": EpsilonReport.from_dict,
                "remedies": RemedyReport.from_dict}
        # remedies are absent in states saved before the comparison existed
        return cls(**{kind: None if d.get(kind) is None else read[kind](d[kind])
                      for kind in KINDS})


class _Sweep:
    """The epsilon report's accumulators, fed each stable pass as it comes. Comparisons of a
    pass that equals the previous epsilon's (the stream handed back the same Run) against a
    baseline that did too are not made again."""

    def __init__(self, runner: Runner, eps: list[float]) -> None:
        self.runner, self.eps = runner, eps
        self.bases: list[Run] = []
        self.bias: list[Downstream] = []
        self._base_source: Run | None = None
        self.jitter: list[np.ndarray] = []
        self.flips: list[dict[str, int]] = [{} for _ in eps]
        self.max_abs = [0.0] * len(eps)
        self.kl_max = [0.0] * len(eps)
        self.first_token: list[int | None] = [None] * len(eps)
        self._variant_source: Run | None = None
        self._last: tuple[np.ndarray, Downstream] | None = None

    def add_base(self, plain: Run, run: Run) -> None:
        if self.bases and run is self._base_source:
            base, between = self.bases[-1], self.bias[-1]
        else:
            base = self.runner.keep(run)
            between = Downstream.between(plain, base)
        self._base_source = run
        self.bases.append(base)
        self.bias.append(between)
        self.jitter.append(np.zeros(run.sets.shape[:2], dtype=bool))

    def start_variant(self) -> None:
        self._variant_source, self._last = None, None

    def add_variant(self, name: str, i: int, run: Run) -> None:
        if (self._last is None or run is not self._variant_source
                or self.bases[i] is not self.bases[i - 1]):
            self._last = ((run.sets != self.bases[i].sets).any(axis=-1),
                          Downstream.between(self.bases[i], run))
        self._variant_source = run
        diff, d = self._last
        self.jitter[i] |= diff
        self.flips[i][name] = int(diff.sum())
        self.max_abs[i] = max(self.max_abs[i], float(d.max_abs.max()))
        self.kl_max[i] = max(self.kl_max[i], float(d.kl.max()))
        if d.first_token_divergence is not None:
            self.first_token[i] = d.first_token_divergence if self.first_token[i] is None \
                else min(self.first_token[i], d.first_token_divergence)

    def rows(self, plain: Run) -> list[EpsilonRow]:
        return [EpsilonRow(e, self.bases[i].sets, self.jitter[i], self.flips[i],
                           (self.bases[i].sets != plain.sets).any(axis=-1), self.bias[i],
                           self.max_abs[i], self.kl_max[i], self.first_token[i])
                for i, e in enumerate(self.eps)]


def analyze_lab(runner: Runner, tokens: Sequence[int],
                variants: Sequence[Variant] | str | None = None, *,
                kinds: Sequence[str] = KINDS, eps: Sequence[float] | None = None,
                remedy_eps: float | None = None, cache_thresholds: Sequence[float] | None = None,
                expert_cache: int = 0, n_prompt: int | None = None,
                progress: Progress = no_progress,
                cancelled: CancelFlag = never_cancelled) -> LabReports:
    """The reports of `kinds` on `tokens` (teacher-forced) under the same variants, their passes
    shared (module docstring). eps: the sweep's epsilons (None: DEFAULT_EPS); remedy_eps: stable
    top-k's in the remedies comparison (None: the model's default_epsilon); cache_thresholds,
    expert_cache: the comparison's (colibri.jitter.remedies). The engine is asked first whether
    it takes every setting (Runner.check), so nothing runs when one is refused."""
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"lab reports are {', '.join(KINDS)}; got {sorted(kinds)}")
    if variants is None or isinstance(variants, str):
        variants = parse_variants(variants)
    want_jitter, want_sweep, want_remedies = (kind in kinds for kind in KINDS)
    hp = runner.model.hparams
    sweep_eps = sorted({float(e) for e in (DEFAULT_EPS if eps is None else eps)}) \
        if want_sweep else []
    stable = Remedy("stable", epsilon=float(hp.default_epsilon if remedy_eps is None
                                            else remedy_eps))
    runner.check(variants, sweep_eps)
    if want_remedies:
        runner.check(routings=[{"routing": "stable", "epsilon": stable.epsilon,
                                "expert_cache": expert_cache}]
                     + [{"routing": "cached", "cache_threshold": t}
                        for t in cache_thresholds or ()])
    else:
        expert_cache = 0
    stable_eps = sorted(set(sweep_eps) | ({stable.epsilon} if want_remedies else set()))
    sweep_index = {e: i for i, e in enumerate(sweep_eps)}
    # a sweep alone compares variants at its epsilons only, so their streams start there
    variants_plain = want_jitter or want_remedies
    remedy_passes = (1 + max(len(cache_thresholds or ()), 1)) if want_remedies else 0
    total = (1 + len(stable_eps) + remedy_passes
             + len(variants) * (variants_plain + len(stable_eps) + remedy_passes))
    done = 0

    def passes(v: Variant | None) -> Iterator[tuple[float | None, Run]]:
        """The variant's passes: (None, plain top-k), then (epsilon, stable top-k) ascending."""
        nonlocal done
        name = BASELINE if v is None else v.name
        settings: Sequence[float | None] = (None, *stable_eps)
        if v is not None and not variants_plain:
            settings = stable_eps
        with RoutingStream(runner, tokens, v, expert_cache) as stream:
            for e in settings:
                check_cancelled(cancelled)
                progress(done, total, f"{name}: " + ("plain top-k" if e is None
                                                     else f"stable top-k, eps {e:g}"))
                run = (stream.run() if e is None else stream.run("stable", e))[0]
                done += 1
                yield e, run

    sweep = _Sweep(runner, sweep_eps)
    stable_base: Run | None = None
    with contextlib.closing(passes(None)) as baseline:
        plain = runner.keep(next(baseline)[1])
        for e, run in baseline:
            if e in sweep_index:
                sweep.add_base(plain, run)
            if want_remedies and e == stable.epsilon:
                stable_base = run
    margin_abs, margin_ulps = margins(plain, group_limits(runner.model), hp.n_experts_active)

    sets = {BASELINE: plain.sets}
    router = {BASELINE: plain.router_logits}
    selection = {BASELINE: plain.selection_scores}
    downstream: dict[str, Downstream] = {}
    plain_sets: dict[str, np.ndarray] = {}
    stable_sets: dict[str, np.ndarray] = {}
    for v in variants:
        sweep.start_variant()
        for e, run in passes(v):
            if e is None:
                plain_sets[v.name] = run.sets
                if want_jitter:
                    sets[v.name] = run.sets
                    router[v.name] = run.router_logits
                    selection[v.name] = run.selection_scores
                    downstream[v.name] = Downstream.between(plain, run)
                continue
            if e in sweep_index:
                sweep.add_variant(v.name, sweep_index[e], run)
            if want_remedies and e == stable.epsilon:
                stable_sets[v.name] = run.sets

    names = [v.name for v in variants]
    fields = run_fields(runner, tokens, n_prompt, names, plain.kernels)
    reports = LabReports()
    if want_jitter:
        reports.jitter = JitterReport(**fields, sets=sets, router_logits=router,
                                      margin_abs=margin_abs, margin_ulps=margin_ulps,
                                      downstream=downstream, selection_scores=selection)
    if want_sweep:
        reports.epsilon = EpsilonReport(**fields, plain_sets=plain.sets, rows=sweep.rows(plain))
    if want_remedies:
        assert stable_base is not None
        plain_jitter = np.zeros(plain.sets.shape[:2], dtype=bool)
        for variant_sets in plain_sets.values():
            plain_jitter |= (variant_sets != plain.sets).any(axis=-1)
        if cache_thresholds is None:
            threshold, rule = default_threshold(margin_abs, plain_jitter, hp.default_epsilon)
            thresholds = [threshold]
        else:
            thresholds, rule = [float(t) for t in cache_thresholds], "given"
        rows = [remedy_row(Remedy("topk"), plain, plain_sets, plain, hp.n_experts),
                remedy_row(stable, stable_base, stable_sets, plain, hp.n_experts)]
        for remedy in (Remedy("soft"), *(Remedy("cached", cache_threshold=t)
                                         for t in thresholds)):
            # soft routing has other slots per decision and cached routing carries a set
            # between positions: neither reroutes a stream, so each is a pass of its own
            settings = remedy.session(expert_cache)
            runs = []
            for v in (None, *variants):
                check_cancelled(cancelled)
                progress(done, total, f"{remedy.label}: {BASELINE if v is None else v.name}")
                runs.append(runner.run(tokens, v, **settings))
                done += 1
            rows.append(remedy_row(remedy, runs[0], {v.name: r.sets
                                                     for v, r in zip(variants, runs[1:])},
                                   plain, hp.n_experts))
        reports.remedies = RemedyReport(**fields, expert_cache=expert_cache,
                                        threshold_rule=rule, plain_jitter=plain_jitter,
                                        rows=rows, margin_abs=margin_abs)
    progress(total, total, "done")
    return reports


def analyze_jitter(runner: Runner, tokens: Sequence[int], variants: Sequence[Variant] | str | None
                   = None, n_prompt: int | None = None, progress: Progress = no_progress,
                   cancelled: CancelFlag = never_cancelled) -> JitterReport:
    """The baseline and every variant on `tokens` (teacher-forced), their routing compared."""
    report = analyze_lab(runner, tokens, variants, kinds=("jitter",), n_prompt=n_prompt,
                         progress=progress, cancelled=cancelled).jitter
    assert report is not None
    return report


def analyze_epsilon(runner: Runner, tokens: Sequence[int], eps: Sequence[float] | None = None,
                    variants: Sequence[Variant] | str | None = None, n_prompt: int | None = None,
                    progress: Progress = no_progress,
                    cancelled: CancelFlag = never_cancelled) -> EpsilonReport:
    """The epsilon sweep: for each epsilon, baseline and variants under stable routing."""
    report = analyze_lab(runner, tokens, variants, kinds=("epsilon",), eps=eps,
                         n_prompt=n_prompt, progress=progress, cancelled=cancelled).epsilon
    assert report is not None
    return report


def analyze_remedies(runner: Runner, tokens: Sequence[int],
                     variants: Sequence[Variant] | str | None = None,
                     epsilon: float | None = None,
                     cache_thresholds: Sequence[float] | None = None,
                     expert_cache: int = 0, n_prompt: int | None = None,
                     progress: Progress = no_progress,
                     cancelled: CancelFlag = never_cancelled) -> RemedyReport:
    """Plain top-k, stable top-k, soft routing and cached routing (one row per threshold) on
    `tokens` (teacher-forced), each under every variant (colibri.jitter.remedies)."""
    report = analyze_lab(runner, tokens, variants, kinds=("remedies",), remedy_eps=epsilon,
                         cache_thresholds=cache_thresholds, expert_cache=expert_cache,
                         n_prompt=n_prompt, progress=progress, cancelled=cancelled).remedies
    assert report is not None
    return report


__all__ = ["KINDS", "STATE_SCHEMA", "LabReports", "analyze_epsilon", "analyze_jitter",
           "analyze_lab", "analyze_remedies"]
