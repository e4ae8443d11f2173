"""The epsilon sweep recomputes each variant's pass only from the first decision an epsilon
changes (RoutingStream, on col_session_set_routing). Its report must be the one separate passes
from scratch give, byte for byte, on a model full of near-ties (the demo) and on a rule with
groups and a correction bias, and a pass that changes nothing must process nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from colibri.jitter.analysis import (Downstream, EpsilonReport, EpsilonRow, Runner, RoutingStream,
                                     report_json, run_fields)
from colibri.jitter.passes import analyze_epsilon
from colibri.jitter.variants import Variant, parse_variants

from tiny_models import V3_RULE

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
EPS = [0.0, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2]
VARIANTS = "seq,blocked8+fma,act-bf16,noise2"


def sweep_from_scratch(runner: Runner, tokens: Sequence[int], eps: Sequence[float],
                       variants: Sequence[Variant]) -> EpsilonReport:
    """The sweep as its definition says it (analysis.py's docstring): every pass a session of
    its own from position 0."""
    plain = runner.run(tokens)
    rows = []
    for e in eps:
        base = runner.run(tokens, routing="stable", epsilon=e)
        jitter = np.zeros(base.sets.shape[:2], dtype=bool)
        flips, max_abs, kl_max, first_token = {}, 0.0, 0.0, None
        for v in variants:
            run = runner.run(tokens, v, routing="stable", epsilon=e)
            diff = (run.sets != base.sets).any(axis=-1)
            jitter |= diff
            flips[v.name] = int(diff.sum())
            d = Downstream.between(base, run)
            max_abs, kl_max = max(max_abs, float(d.max_abs.max())), max(kl_max, float(d.kl.max()))
            if d.first_token_divergence is not None:
                first_token = min(d.first_token_divergence, first_token or len(tokens))
        rows.append(EpsilonRow(e, base.sets, jitter, flips, (base.sets != plain.sets).any(axis=-1),
                               Downstream.between(plain, base), max_abs, kl_max, first_token))
    return EpsilonReport(**run_fields(runner, tokens, None, [v.name for v in variants],
                                      plain.kernels), plain_sets=plain.sets, rows=rows)


@pytest.mark.parametrize("which", ["demo", "deepseek_v3"])
def test_the_sweep_reports_what_passes_from_scratch_report(which: str,
                                                           tiny_model_path: Callable[..., Path]
                                                           ) -> None:
    path = DEMO if which == "demo" else tiny_model_path("mixtral", n_experts=8, rule=V3_RULE)
    with Runner.open(path) as runner:
        tokens = [int(t) for t in
                  np.random.default_rng(2).integers(0, runner.model.hparams.vocab_size, 48)]
        variants = parse_variants(VARIANTS)
        want = sweep_from_scratch(runner, tokens, EPS, variants)
        got = analyze_epsilon(runner, tokens, EPS, variants)
        assert report_json(got) == report_json(want)
        assert any(row.n_bias for row in got.rows), "no epsilon changed a decision: shows nothing"


def test_a_pass_recomputes_from_its_first_changed_decision_only() -> None:
    """On the demo model's near-ties, epsilons in turn: a pass whose decisions equal the last
    one's is that pass itself (nothing processed), and one that changes decisions is recomputed
    from the first changed position, which is exactly where passes from scratch first differ, to
    those passes' bits."""
    with Runner.open(DEMO) as runner:
        n = 300
        tokens = [int(t) for t in
                  np.random.default_rng(0).integers(0, runner.model.hparams.vocab_size, n)]
        outcomes = set()
        with RoutingStream(runner, tokens) as stream:
            last, _ = stream.run("stable", 1e-10)
            for e in (1e-9, 1e-8, 1e-7, 1e-6, 1e-5):
                run, first = stream.run("stable", e)
                scratch = runner.run(tokens, routing="stable", epsilon=e)
                assert np.array_equal(run.logits.view(np.uint32), scratch.logits.view(np.uint32))
                assert np.array_equal(run.expert_ids, scratch.expert_ids)
                differ = np.flatnonzero((last.expert_ids != scratch.expert_ids).any(axis=(1, 2)))
                assert first == (differ[0] if differ.size else n), e
                if first == n:
                    assert run is last
                outcomes.add("same" if first == n else "from 0" if first == 0 else "partial")
                last = run
        assert {"same", "partial"} <= outcomes


def test_kept_passes_are_read_back_mapped_and_stay_in_memory_without_disk_space(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep keeps its baseline passes in files of the runner's directory, read back mapped
    with their bits; when the disk is full the pass stays in memory and the sweep goes on."""
    with Runner.open(DEMO) as runner:
        run = runner.run([3, 4, 5, 6])
        kept = runner.keep(run)
        assert isinstance(kept.logits, np.memmap)
        assert np.array_equal(kept.logits.view(np.uint32), run.logits.view(np.uint32))

        def full_disk(*args: object, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("colibri.jitter.analysis.np.save", full_disk)
        assert runner.keep(run) is run
