"""How a session's work split over its threads (Session.thread_stats, col_session_thread_stats),
on the demo model: the counts add up to the model's own multiply-adds, whatever the split."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from colibri import compute
from colibri.engine import Model, Session, ThreadStats

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
PROMPT = np.array([1, 4, 2, 7], dtype=np.int32)


@pytest.fixture(scope="module")
def demo() -> Iterator[Model]:
    with Model.open(DEMO) as model:
        yield model


def total(stats: list[ThreadStats]) -> int:
    return sum(t.multiply_adds for t in stats)


@pytest.mark.parametrize("options", [{}, {"kernels": "portable"}, {"numerics": "seq"}],
                         ids=["best path", "portable", "a numerics variant"])
def test_a_step_counts_the_weight_multiply_adds_of_one_token(demo: Model, options: dict[str, str]) -> None:
    """One decoded token's products, summed over the threads, are the multiply-adds colibri.compute
    reads off the file's shapes for a token (the k active experts of each MoE layer, the LM head):
    the engine counts what it ran, the tensor table says what a token costs."""
    session = Session(demo, threads=2, max_context=16, **options)
    session.prefill(PROMPT)
    before = total(session.thread_stats())
    session.step(5)
    per_token = compute.prefill_macs(demo, 1)
    expected = sum(macs for kind, macs in per_token.items() if kind != compute.HEADS)
    assert total(session.thread_stats()) - before == expected


def test_the_total_does_not_depend_on_the_threads(demo: Model) -> None:
    """The same generation on one thread and on two: the same multiply-adds in all, split over
    the threads that ran them; one thread hands no batch to others."""
    counts = {}
    for threads in (1, 2):
        session = Session(demo, threads=threads, max_context=16)
        session.generate(PROMPT, 4, eos=None)
        counts[threads] = session.thread_stats()
    assert len(counts[1]) == 1 and len(counts[2]) == 2
    assert total(counts[1]) == total(counts[2]) > 0
    assert counts[1][0].batches == 0
    caller, worker = counts[2]
    assert caller.batches > 0 and worker.batches <= caller.batches


def test_reset_starts_the_counts_again(demo: Model) -> None:
    session = Session(demo, threads=2, max_context=16)
    session.generate(PROMPT, 2, eos=None)
    assert total(session.thread_stats()) > 0
    session.reset()
    assert session.thread_stats() == [ThreadStats(0, 0), ThreadStats(0, 0)]
