"""The remedies report (colibri.jitter.remedies): stable top-k, soft routing and cached routing
against plain top-k on the demo model, whose near-ties flip under real numerics variants.

The rows are checked against what they mean: plain top-k's jitter cells are the jitter report's
flipped cells, cached routing at threshold 0 is plain top-k, soft routing chooses every expert
(so no choice flips), a row's sets are its routing's own run, the hit rates are the sessions'
LRU counts, and the derived threshold follows its stated rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from colibri.cli import main
from colibri.engine import Model, Session
from colibri.jitter import (JitterReport, RemedyReport, Runner, analyze_jitter,
                            analyze_remedies, parse_thresholds, report_json)

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
PROMPT = "def read_header(self, data):"
VARIANTS = "seq,noise4,blocked8+fma"


@pytest.fixture(scope="module")
def setup() -> tuple[Model, Runner, list[int]]:
    model = Model.open(DEMO)
    runner = Runner(model)
    tokens = runner.greedy_sequence(list(model.tokenizer.encode(PROMPT).ids), 8)
    yield model, runner, tokens
    runner.close()
    model.close()


@pytest.fixture(scope="module")
def report(setup: tuple[Model, Runner, list[int]]) -> RemedyReport:
    model, runner, tokens = setup
    return analyze_remedies(runner, tokens, VARIANTS, epsilon=1e-6,
                            cache_thresholds=[0.0, 0.5], expert_cache=4,
                            n_prompt=len(model.tokenizer.encode(PROMPT).ids))


def test_the_rows(report: RemedyReport) -> None:
    assert [r.remedy.label for r in report.rows] == [
        "plain top-k", "stable top-k (eps 1e-06)", "soft routing", "cached (threshold 0)",
        "cached (threshold 0.5)"]
    assert report.threshold_rule == "given" and report.expert_cache == 4


def test_plain_top_k_is_the_jitter_reports_flips(setup: tuple[Model, Runner, list[int]],
                                                 report: RemedyReport) -> None:
    _, runner, tokens = setup
    jitter: JitterReport = analyze_jitter(runner, tokens, VARIANTS)
    assert np.array_equal(report.plain_jitter, jitter.flip_counts() > 0)
    assert report.plain.jitter_left == int((jitter.flip_counts() > 0).sum()) > 0
    assert np.array_equal(report.margin_abs, jitter.margin_abs)
    plain = report.plain
    assert plain.changed == 0 and not plain.removed(report.plain_jitter).any()
    assert plain.downstream.first_expert_divergence is None


def test_cached_at_threshold_zero_is_plain_top_k(report: RemedyReport) -> None:
    zero, plain = report.rows[3], report.plain
    assert np.array_equal(zero.sets, plain.sets)
    assert np.array_equal(zero.jitter_cells, plain.jitter_cells)
    assert zero.changed == 0 and zero.kept == 0
    assert float(zero.downstream.max_abs.max()) == 0.0
    assert (zero.hits, zero.lookups) == (plain.hits, plain.lookups)


def test_soft_routing_chooses_every_expert(report: RemedyReport) -> None:
    soft = report.row("soft")
    P, M = report.plain_jitter.shape
    assert soft.sets.shape == (P, M, 8) and soft.experts_per_decision == 8
    assert soft.changed == P * M and soft.jitter_left == 0
    assert int(soft.removed(report.plain_jitter).sum()) == report.plain.jitter_left
    assert soft.hit_rate is None and soft.downstream.first_expert_divergence == 0


def test_a_rows_sets_are_its_routings_run(setup: tuple[Model, Runner, list[int]],
                                          report: RemedyReport) -> None:
    model, runner, tokens = setup
    stable = runner.run(tokens, routing="stable", epsilon=1e-6)
    assert np.array_equal(report.row("stable").sets, stable.sets)
    cached = report.rows[4]
    with Session(model, routing="cached", cache_threshold=0.5, expert_cache=4,
                 max_context=len(tokens)) as s:
        s.prefill(tokens)
        stats = s.cache_stats()
        assert np.array_equal(cached.sets, np.sort(s.trace.expert_ids, axis=-1))
    assert (cached.hits, cached.lookups) == (stats.hits, stats.hits + stats.misses)
    assert (cached.kept, cached.decisions) == (stats.kept, stats.decisions)
    assert cached.kept > 0 and cached.changed > 0
    assert cached.changed == int((cached.sets != report.plain.sets).any(axis=-1).sum())
    removed, added = cached.removed(report.plain_jitter), cached.added(report.plain_jitter)
    assert not (removed & cached.jitter_cells).any() and not (added & report.plain_jitter).any()


def test_the_json_round_trips(report: RemedyReport) -> None:
    data = report_json(report)
    again = RemedyReport.from_dict(json.loads(data))
    assert report_json(again) == data
    d = json.loads(data)
    assert d["schema"] == "colibri.remedies/1"
    assert d["rows"][2]["hit_rate"] is None and d["rows"][4]["kept"] == report.rows[4].kept
    with pytest.raises(ValueError, match="not a remedies report"):
        RemedyReport.from_dict({"schema": "colibri.jitter/1"})


def test_the_derived_threshold(setup: tuple[Model, Runner, list[int]],
                               report: RemedyReport) -> None:
    model, runner, tokens = setup
    derived = analyze_remedies(runner, tokens, VARIANTS, epsilon=1e-6)
    largest = float(report.margin_abs[report.plain_jitter].max())
    want = max(2 * largest, model.hparams.default_epsilon)
    assert derived.rows[-1].remedy.cache_threshold == want
    assert derived.threshold_rule.startswith("2 x the largest margin of a flipped decision")
    assert derived.expert_cache == 0 and derived.rows[-1].hit_rate is None


def test_thresholds_parse_and_bad_ones_are_refused_before_running(
        setup: tuple[Model, Runner, list[int]]) -> None:
    assert parse_thresholds("0.5, 0.01,0.5") == [0.01, 0.5]
    assert parse_thresholds("") is None and parse_thresholds(None) is None
    with pytest.raises(ValueError, match="comma-separated cache thresholds"):
        parse_thresholds("0.1,x")
    _, runner, tokens = setup
    with pytest.raises(ValueError, match="cache_threshold must be finite and >= 0"):
        analyze_remedies(runner, tokens, VARIANTS, cache_thresholds=[-1.0])
    with pytest.raises(ValueError, match="expert_cache 1 outside 2..8"):
        analyze_remedies(runner, tokens, VARIANTS, expert_cache=1)


def test_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                          report: RemedyReport) -> None:
    out_path = tmp_path / "remedies.json"
    code = main(["remedies", str(DEMO), "--prompt", PROMPT, "-n", "8", "--variants", VARIANTS,
                 "--eps", "1e-6", "--cache-threshold", "0,0.5", "--expert-cache", "4",
                 "--json", str(out_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert out_path.read_bytes() == report_json(report)
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "plain top-k" in lines and "soft routing" in lines
    soft = lines["soft routing"].split()
    assert soft[2:6] == [str(report.row("soft").changed), "0",
                         str(report.plain.jitter_left), "0"]
    code = main(["remedies", str(DEMO), "--tokens", "1,2", "--cache-threshold", "a"])
    assert code == 1 and "comma-separated cache thresholds" in capsys.readouterr().err
