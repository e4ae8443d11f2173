"""The lab's three reports made together (analyze_lab) share their passes: each variant's stream
runs plain top-k, then the sweep's and the remedies' epsilons in one ascending walk. Each report
must be the one it is alone, byte for byte, and the passes they share must run once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.cli import main
from colibri.engine import Session
from colibri.jitter.analysis import Runner, report_json
from colibri.jitter.passes import (LabReports, analyze_epsilon, analyze_jitter, analyze_lab,
                                   analyze_remedies)
from colibri.jitter.remedies import Remedy, remedy_row
from colibri.jitter.variants import parse_variants
from colibri.values import Cancelled

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
VARIANTS = "seq,blocked8+fma,act-bf16,noise2"
EPS = [0.0, 1e-10, 1e-8, 1e-6, 1e-4]


def demo_tokens(runner: Runner, n: int = 48) -> list[int]:
    rng = np.random.default_rng(5)
    return [int(t) for t in rng.integers(0, runner.model.hparams.vocab_size, n)]


@pytest.mark.parametrize("remedy_eps", [1e-7, 1e-6])
def test_the_three_reports_together_are_the_ones_each_gives_alone(remedy_eps: float) -> None:
    """The remedies' epsilon between two of the sweep's (its pass interleaves them) or one of
    them (one pass serves both)."""
    with Runner.open(DEMO) as runner:
        tokens = demo_tokens(runner)
        variants = parse_variants(VARIANTS)
        together = analyze_lab(runner, tokens, variants, eps=EPS, remedy_eps=remedy_eps,
                               expert_cache=3)
        alone = [analyze_jitter(runner, tokens, variants),
                 analyze_epsilon(runner, tokens, EPS, variants),
                 analyze_remedies(runner, tokens, variants, remedy_eps, expert_cache=3)]
        for got, want in zip((together.jitter, together.epsilon, together.remedies), alone):
            assert got is not None
            assert report_json(got) == report_json(want)
        assert together.remedies is not None
        assert together.remedies.row("stable").changed, "the epsilon changed nothing: shows little"


def test_the_remedies_stable_row_is_what_passes_from_scratch_give() -> None:
    """The stable row of a lab run, whose stream came there through the sweep's epsilons, against
    sessions of their own from position 0 (LRU counts included)."""
    with Runner.open(DEMO) as runner:
        tokens = demo_tokens(runner)
        variants = parse_variants(VARIANTS)
        e, cache = 1e-7, 3
        report = analyze_lab(runner, tokens, variants, eps=EPS, remedy_eps=e, expert_cache=cache)
        assert report.remedies is not None
        plain = runner.run(tokens, expert_cache=cache)
        base = runner.run(tokens, routing="stable", epsilon=e, expert_cache=cache)
        sets = {v.name: runner.run(tokens, v, routing="stable", epsilon=e,
                                   expert_cache=cache).sets for v in variants}
        want = remedy_row(Remedy("stable", epsilon=e), base, sets, plain,
                          runner.model.hparams.n_experts)
        plain_jitter = report.remedies.plain_jitter
        assert report.remedies.row("stable").to_dict(plain_jitter) == want.to_dict(plain_jitter)


def count_positions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every prefill's positions from now on, in a list that grows."""
    counted: list[int] = []
    prefill = Session.prefill

    def counting(self: Session, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        counted.append(len(tokens))
        return prefill(self, tokens, *args, **kwargs)

    monkeypatch.setattr(Session, "prefill", counting)
    return counted


def test_passes_the_reports_share_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Together the three cost the sweep's positions and the soft and cached passes: the jitter
    report's passes are the sweep's at epsilon 0, the remedies' plain and stable passes too
    when the remedies' epsilon is one of the sweep's."""
    with Runner.open(DEMO) as runner:
        tokens = demo_tokens(runner)
        variants = parse_variants(VARIANTS)
        counted = count_positions(monkeypatch)
        analyze_epsilon(runner, tokens, EPS, variants)
        sweep = sum(counted)
        counted.clear()
        analyze_jitter(runner, tokens, variants)
        assert sum(counted) == (1 + len(variants)) * len(tokens)
        counted.clear()
        analyze_lab(runner, tokens, variants, eps=EPS, remedy_eps=1e-6,
                    cache_thresholds=[0.01, 0.1])
        own_passes = (1 + len(variants)) * (1 + 2) * len(tokens)  # soft, two cached
        assert sum(counted) == sweep + own_passes


def test_a_cancel_stops_the_lab_between_passes_and_closes_its_sessions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled in the middle of a variant's walk: no further pass runs, and every session the
    walk opened is closed."""
    opened: list[Session] = []
    init = Session.__init__

    def recording(self: Session, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(Session, "__init__", recording)
    reported: list[str] = []
    with Runner.open(DEMO) as runner:
        with pytest.raises(Cancelled):
            analyze_lab(runner, demo_tokens(runner), VARIANTS, eps=EPS,
                        progress=lambda done, total, text: reported.append(text),
                        cancelled=lambda: any(text.startswith("seq:") for text in reported))
        assert reported[-1] == "seq: plain top-k"
        assert opened and all(s.closed for s in opened)


def test_a_report_kind_the_lab_does_not_make_is_refused() -> None:
    with Runner.open(DEMO) as runner, pytest.raises(ValueError, match="lab reports are"):
        analyze_lab(runner, [3, 4], kinds=("jitter", "margins"))


def test_cli_lab_writes_the_state_the_three_commands_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`colibri lab --json OUT` prints the three summaries and writes, as the Inspector's lab
    state, the reports `jitter`, `epsilon` and `remedies` write alone."""
    common = ["--tokens", "5,9,11,3", "--generate", "12", "--variants", VARIANTS]
    eps = ",".join(str(e) for e in EPS)
    out = {kind: tmp_path / f"{kind}.json" for kind in ("jitter", "epsilon", "remedies", "lab")}
    assert main(["jitter", str(DEMO), *common, "--json", str(out["jitter"])]) == 0
    assert main(["epsilon", str(DEMO), *common, "--eps", eps, "--json", str(out["epsilon"])]) == 0
    assert main(["remedies", str(DEMO), *common, "--eps", "1e-7", "--expert-cache", "2",
                 "--json", str(out["remedies"])]) == 0
    capsys.readouterr()
    assert main(["lab", str(DEMO), *common, "--eps", eps, "--remedy-eps", "1e-7",
                 "--expert-cache", "2", "--json", str(out["lab"])]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("jitter: ")
    assert "\nepsilon sweep: " in printed and "\nremedies: " in printed
    state = json.loads(out["lab"].read_text())
    for kind in ("jitter", "epsilon", "remedies"):
        assert state[kind] == json.loads(out[kind].read_text())
    assert LabReports.from_dict(state).to_dict() == state
