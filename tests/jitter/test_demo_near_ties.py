"""The shipped demo model shows the jitter lab's subject on first use: its file records the
near-ties tools/demo_near_ties.py gave it, and with its own example prompt some routing decisions
sit within a few ULPs, reduction-order variants flip some of them, and the epsilon sweep finds an
epsilon that removes every flip while changing decisions of plain top-k (a curve, not zeros)."""

from __future__ import annotations

from pathlib import Path

import pytest

from colibri.engine import Model
from colibri.jitter.analysis import Runner
from colibri.jitter.passes import analyze_epsilon, analyze_jitter

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
# reduction orders and router noise only: what a second machine or thread split would do
VARIANTS = "seq,seq+fma,blocked16,blocked4+fma,seq+split2,noise1,noise2"


@pytest.fixture(scope="module")
def demo_run() -> tuple[Runner, list[int], int, dict]:
    with Model.open(DEMO) as model:
        demo = model.metadata["user"]["demo"]
        prompt = list(model.tokenizer.encode(demo["prompts"][0]).ids)
        with Runner(model) as runner:
            yield runner, runner.greedy_sequence(prompt, 16), len(prompt), demo


def test_the_demo_records_its_near_ties_and_prompts(demo_run) -> None:
    _runner, _tokens, _n, demo = demo_run
    assert [t["layer"] for t in demo["near_ties"]] == [1, 2]
    assert all(t["expert"] != t["near_copy_of"] for t in demo["near_ties"])
    assert demo["prompts"][0] == "def read_header(self, data):"


def test_the_example_prompt_has_near_ties_that_reduction_orders_flip(demo_run) -> None:
    runner, tokens, n_prompt, _demo = demo_run
    report = analyze_jitter(runner, tokens, VARIANTS, n_prompt)
    assert int(report.margin_ulps.min()) <= 4
    assert report.summary()["flipped_cells"] >= 2


def test_the_epsilon_sweep_recommends_an_epsilon_that_changes_decisions(demo_run) -> None:
    runner, tokens, n_prompt, _demo = demo_run
    report = analyze_epsilon(runner, tokens, [0.0, 1e-9, 1e-6, 1e-5], VARIANTS, n_prompt)
    assert report.rows[0].jitter_left > 0
    best = report.recommended()
    assert best is not None and best.eps > 0 and best.n_bias > 0
