"""Generation.rewind and Generation.advance_layer: going back to a position and running again,
and running one layer at a time, give what a run that never went back (or ran whole positions)
gives, sampler included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.generation import Generation

PROMPT = [1, 3, 4, 7]


def logits_of(g: Generation) -> np.ndarray:
    assert g.logits is not None
    return np.concatenate(g.logits)


@pytest.fixture
def model(tiny_model_path: Callable[..., Path]) -> Model:
    with Model.open(tiny_model_path("qwen2_moe")) as m:
        yield m


@pytest.mark.parametrize("position", [0, 2, 4, 5, 8, 10])
def test_rewind_and_run_again_gives_the_same_run(model: Model, position: int) -> None:
    kwargs = dict(decoding="sample", temperature=1.3, seed=11, keep_logits=True)
    with Session(model) as a, Session(model) as b:
        whole = Generation(a, PROMPT, 8, **kwargs)
        whole.run()
        again = Generation(b, PROMPT, 8, **kwargs)
        again.run()
        again.rewind(position)
        assert again.positions == position == b.position and not again.finished
        assert sum(r.shape[0] for r in again.logits or []) == position
        assert again.generated == whole.generated[:max(position - len(PROMPT) + 1, 0)]
        again.run()
        assert again.generated == whole.generated and again.reason == whole.reason
        assert logits_of(again).tobytes() == logits_of(whole).tobytes()
        assert b.trace.expert_ids.tobytes() == a.trace.expert_ids.tobytes()


def test_rewind_to_the_end_keeps_a_finished_run_finished(model: Model) -> None:
    with Session(model) as s:
        g = Generation(s, PROMPT, 3, keep_logits=True)
        g.run()
        tokens = list(g.generated)
        g.rewind(g.positions)
        assert g.finished and g.reason == "finished" and g.generated == tokens
        with pytest.raises(ValueError, match="cannot rewind"):
            g.rewind(g.positions + 1)


def test_advancing_layer_by_layer_equals_whole_positions(model: Model) -> None:
    with Session(model, threads=2) as a, Session(model) as b:
        whole = Generation(a, PROMPT, 5, keep_logits=True, step_prompt=True)
        whole.run()
        layered = Generation(b, PROMPT, 5, keep_logits=True)
        calls = 0
        while not layered.finished:
            done = layered.advance_layer()
            calls += 1
            assert len(done) in (0, 1)
        assert calls == whole.positions * model.hparams.n_layers
        assert layered.generated == whole.generated
        assert logits_of(layered).tobytes() == logits_of(whole).tobytes()
        assert b.trace.expert_ids.tobytes() == a.trace.expert_ids.tobytes()
