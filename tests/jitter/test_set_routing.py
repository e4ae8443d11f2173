"""Changing a live session's routing (col_session_set_routing): the engine routes the recorded
positions again from the trace's router logits and names the first one the new routing decides
differently, so truncating there and processing the rest gives a new session's bits. An epsilon
sweep relies on this to recompute only from the first decision an epsilon changes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.errors import ColibriValueError
from colibri.interventions import Intervention

from jitter_models import TIE_LAYER, make_tie_model
from tiny_models import RULES

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
TRACE_FIELDS = ("expert_ids", "expert_weights", "router_logits", "selection_scores",
                "chosen_groups", "bias_changed", "intervened")
# (routing, epsilon, seed) in the order a run moves through them: epsilons up and down across
# the scale of router logits, Gumbel noise and back.
SETTINGS: list[tuple[str, float, int]] = (
    [("stable", e, 0) for e in (0.0, 1e-9, 1e-6, 1e-3, 1e-2, 1e-1, 1e-4, 0.3)]
    + [("gumbel", 0.0, 1), ("gumbel", 0.0, 2), ("topk", 0.0, 0)])


def bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8)


def fresh_run(model: Model, tokens: list[int], routing: str, epsilon: float, seed: int,
              ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    with Session(model, routing=routing, epsilon=epsilon, seed=seed,
                 max_context=len(tokens)) as s:
        logits = s.prefill(tokens)
        trace = s.trace
        assert trace is not None
        return logits, {f: np.array(getattr(trace, f)) for f in TRACE_FIELDS}


@pytest.fixture(params=sorted(RULES) + ["demo"])
def model(request: pytest.FixtureRequest, tiny_model_path: Callable[..., Path]) -> Iterator[Model]:
    if request.param == "demo":
        m = Model.open(DEMO)
    else:
        arch, options = RULES[request.param]
        m = Model.open(tiny_model_path(arch, **options))
    yield m
    m.close()


def test_rerun_from_the_first_changed_position_has_a_fresh_sessions_bits(model: Model) -> None:
    """Every rule kind (group limits, correction biases, selection on logits) and the demo
    model's near-ties: after each change of routing, truncating at the position the engine names
    and processing the rest gives the logits and trace of a session created with that routing."""
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, model.hparams.vocab_size, 60)]
    firsts = []
    with Session(model, max_context=len(tokens)) as live:
        logits = live.prefill(tokens)
        for routing, epsilon, seed in SETTINGS:
            first = live.set_routing(routing, epsilon, seed)
            live.truncate(first)
            logits = np.concatenate([logits[:first], live.prefill(tokens[first:])])
            firsts.append(first)
            want_logits, want_trace = fresh_run(model, tokens, routing, epsilon, seed)
            assert np.array_equal(bits(logits), bits(want_logits)), (routing, epsilon, seed)
            trace = live.trace
            assert trace is not None
            for f in TRACE_FIELDS:
                assert np.array_equal(bits(getattr(trace, f)), bits(want_trace[f])), \
                    (f, routing, epsilon)
    assert min(firsts) < len(tokens), "no setting changed a decision: the test shows nothing"


def test_expert_caching_counts_are_a_fresh_sessions_after_a_rerun() -> None:
    """An LRU of resident experts: truncating at the named position rebuilds its state as the
    kept positions left it, so the hits, misses and per-slot residency after the rerun are a
    fresh session's."""
    with Model.open(DEMO) as model:
        vocab = model.hparams.vocab_size
        tokens = [int(t) for t in np.random.default_rng(7).integers(0, vocab, 80)]
        with Session(model, max_context=len(tokens), expert_cache=4) as live:
            live.prefill(tokens)
            for routing, epsilon, seed in SETTINGS:
                first = live.set_routing(routing, epsilon, seed)
                live.truncate(first)
                live.prefill(tokens[first:])
                with Session(model, routing=routing, epsilon=epsilon, seed=seed,
                             max_context=len(tokens), expert_cache=4) as fresh:
                    fresh.prefill(tokens)
                    assert live.cache_stats() == fresh.cache_stats(), (routing, epsilon)
                    assert live.trace is not None and fresh.trace is not None
                    assert np.array_equal(live.trace.cache_hits, fresh.trace.cache_hits)
                    assert np.array_equal(live.trace.expert_ids, fresh.trace.expert_ids)


def test_the_first_changed_position_is_where_the_decisions_first_differ(model: Model) -> None:
    """Not merely safe: the named position is the first whose decisions a fresh session makes
    differently (so nothing before it is recomputed for nothing)."""
    tokens = [int(t) for t in np.random.default_rng(6).integers(0, model.hparams.vocab_size, 60)]
    _, before = fresh_run(model, tokens, "topk", 0.0, 0)
    with Session(model, max_context=len(tokens)) as live:
        live.prefill(tokens)
        for routing, epsilon, seed in SETTINGS:
            first = live.set_routing(routing, epsilon, seed)
            _, after = fresh_run(model, tokens, routing, epsilon, seed)
            differs = [p for p in range(len(tokens))
                       if any(not np.array_equal(bits(before[f][p]), bits(after[f][p]))
                              for f in ("expert_ids", "expert_weights", "chosen_groups",
                                        "bias_changed"))]
            assert first == (differs[0] if differs else len(tokens)), (routing, epsilon, seed)
            live.truncate(first)
            live.prefill(tokens[first:])
            before = after


def test_an_exact_tie_changes_at_the_first_position(tmp_path: Path) -> None:
    """Experts 1 and 2 of the tie model's layer 0 tie exactly at every position: plain top-k
    takes 1, any epsilon above 0 takes 2, so the first position changes, and going back to top-k
    changes it again; the same routing again changes nothing."""
    with Model.open(make_tie_model(tmp_path)) as model:
        tokens = list(range(3, 23))
        with Session(model, max_context=len(tokens)) as s:
            s.prefill(tokens)
            assert s.set_routing("topk") == len(tokens)
            assert s.set_routing("stable", 0.0) == len(tokens)   # epsilon 0 ranks as top-k does
            assert s.set_routing("stable", 1e-6) == 0
            assert s.routing == "stable"
            s.truncate(0)
            s.prefill(tokens)
            trace = s.trace
            assert trace is not None
            assert all(2 in ids and 1 not in ids for ids in trace.expert_ids[:, TIE_LAYER])
            assert s.set_routing("stable", 1e-3) == len(tokens)
            assert s.set_routing("topk") == 0


def test_a_decision_an_intervention_acted_on_counts_as_changed() -> None:
    """The trace holds the logits after an intervention edited them, so such a decision cannot be
    judged again: it counts as changed even under the same routing."""
    with Model.open(DEMO) as model:
        tokens = list(range(3, 33))
        with Session(model, max_context=len(tokens)) as s:
            s.set_interventions([Intervention("forbid", experts=(0,), first=9, last=9, layer=None)])
            s.prefill(tokens)
            assert s.set_routing("topk") == 9


def test_without_a_trace_every_position_counts_as_changed() -> None:
    with Model.open(DEMO) as model, Session(model, trace=False, max_context=8) as s:
        s.prefill([3, 4, 5])
        assert s.set_routing("stable", 1e-3) == 0


@pytest.mark.parametrize("start, target", [("topk", "soft"), ("topk", "cached"),
                                           ("soft", "topk"), ("cached", "stable")])
def test_soft_and_cached_routing_cannot_change(start: str, target: str) -> None:
    """Soft routing takes every expert (other slots per decision) and cached routing depends on
    the previous position's set, so neither is a change of a live session."""
    with Model.open(DEMO) as model, Session(model, routing=start, max_context=8) as s:
        s.prefill([3, 4, 5])
        with pytest.raises(ColibriValueError, match="routing changes only among"):
            s.set_routing(target)  # type: ignore[arg-type]
        assert s.routing == start


@pytest.mark.parametrize("epsilon", [-1e-3, float("nan"), float("inf")])
def test_a_bad_epsilon_is_refused_and_changes_nothing(epsilon: float) -> None:
    tokens = [3, 4, 5, 6]
    with Model.open(DEMO) as model:
        want, _ = fresh_run(model, tokens + [7], "topk", 0.0, 0)
        with Session(model, max_context=8) as s:
            s.prefill(tokens)
            with pytest.raises(ColibriValueError, match="epsilon must be finite and >= 0"):
                s.set_routing("stable", epsilon)
            assert s.routing == "topk"
            assert np.array_equal(bits(s.prefill([7])), bits(want[-1:]))


def test_a_position_in_progress_is_refused() -> None:
    with Model.open(DEMO) as model, Session(model, max_context=8) as s:
        s.prefill([3, 4])
        s.begin_token(5)
        s.step_layer()
        with pytest.raises(ColibriValueError, match="in progress"):
            s.set_routing("stable", 1e-3)
