"""Interventions with expert caching and embedding input, on the demo model (Mixtral's rule:
top-2 of 8 on the router logits).

Truncating a session puts expert caching's state (each layer's previous set, the LRU and the
counts) back to what the kept positions left, so a rerun from there equals a run from scratch
bit for bit, trace and counts included. Under cached routing an intervention acts on the routing
actually used: every decision of a run under force, forbid and ablate is checked here against
the rule written out in numpy (a force is the choice and is never overridden by the cache; a
previous set holding a forbidden expert cannot be kept; the next position's previous set is the
set the intervened decision used), and the LRU's hits against a plain LRU over the decisions
made. Embedding-input sessions take interventions as token sessions do, stepped one layer at a
time too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from colibri.debugging.counterfactual import rerun
from colibri.engine import Model, Session, Trace
from colibri.errors import ColibriValueError
from colibri.generation import Generation
from colibri.interventions import KINDS, Intervention
from test_expert_cache import replay_lru

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
PROMPT = "def read_header(self, data):"
CACHING = {"routing": "cached", "cache_threshold": 0.5, "expert_cache": 4}
# The plain cached run (teacher-forced below) keeps [6, 1] over the fresh [6, 2] at position 5,
# layer 1, and [2, 5] over [2, 0] at position 5, layer 2 (its previous set there is [2, 5]).
FORCE = "force:pos=5,layer=1,experts=6+2"      # overrides a kept set
FORBID = "forbid:pos=5,layer=2,experts=5"      # removes an expert of the previous set
ABLATE = "ablate:layer=3,expert=0"             # never in a previous set of layer 3
ASIDE = "forbid:pos=6-9,layer=0,experts=7"     # a forbid that leaves the previous sets alone
SPECS = (FORCE, FORBID, ABLATE, ASIDE)
TRACE_FIELDS = ("expert_ids", "expert_weights", "router_logits", "selection_scores", "intervened",
                "cache_kept", "cache_margin", "fresh_ids", "cache_hits")


@pytest.fixture(scope="module")
def demo() -> Iterator[Model]:
    with Model.open(DEMO) as model:
        yield model


@pytest.fixture(scope="module")
def tokens(demo: Model) -> list[int]:
    """The prompt and what the plain cached run generates from it (24 positions)."""
    with Session(demo, **CACHING) as s:  # type: ignore[arg-type]
        g = s.generate(list(demo.tokenizer.encode(PROMPT).ids), 16)
        return g.tokens[:g.positions]


def fresh_run(model: Model, tokens: list[int], *specs: str, threads: int = 1,
              **settings: object) -> tuple[np.ndarray, Trace, list[object]]:
    """(logits, trace, per-layer and total cache counts) of one prefill from scratch."""
    with Session(model, threads=threads, **{**CACHING, **settings}) as s:  # type: ignore[arg-type]
        s.set_interventions([Intervention.parse(x) for x in specs])
        logits = s.prefill(tokens) if tokens else np.zeros((0, model.hparams.vocab_size))
        trace = s.trace
        assert trace is not None
        return logits, trace.copy(), counts(s)


def counts(s: Session) -> list[object]:
    return [s.cache_stats()] + [s.cache_stats(m) for m in range(s.model.hparams.n_moe_layers)]


def same_trace(a: Trace, b: Trace) -> None:
    for name in TRACE_FIELDS:
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name


# ---------------------------------------------------------------------------------------------
# truncation restores the caching state


@pytest.mark.parametrize("threads", [1, 3])
def test_truncation_puts_the_caching_state_back(demo: Model, tokens: list[int],
                                                threads: int) -> None:
    """At every cut the counts are those of a session that only ever ran the positions before
    it; the positions after it then run again to the same bits."""
    _, whole, whole_counts = fresh_run(demo, tokens, threads=threads)
    with Session(demo, threads=threads, **CACHING) as s:  # type: ignore[arg-type]
        s.prefill(tokens)
        for cut in (len(tokens), 17, 9, 5, 1, 0):
            s.truncate(cut)
            assert counts(s) == fresh_run(demo, tokens[:cut], threads=threads)[2], cut
            s.prefill(tokens[cut:])
            assert counts(s) == whole_counts, cut
            same_trace(s.trace, whole)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_rerun_under_interventions_equals_a_run_from_scratch(demo: Model, tokens: list[int],
                                                               threads: int) -> None:
    """Cached routing and an LRU: the counterfactual's tail from the truncation has the bits of a
    fresh run under the same interventions, logits, every trace array and the counts."""
    with Session(demo, threads=threads, **CACHING) as s:  # type: ignore[arg-type]
        s.prefill(tokens)
        s.set_interventions([Intervention.parse(x) for x in SPECS])
        s.truncate(0)   # ablate acts from position 0: the rerun starts there
        logits = s.prefill(tokens)
        trace, got = s.trace.copy(), counts(s)
    want_logits, want, want_counts = fresh_run(demo, tokens, *SPECS, threads=threads)
    assert logits.tobytes() == want_logits.tobytes()
    same_trace(trace, want)
    assert got == want_counts
    # and from a later position, with the interventions that start there
    late = (FORCE, FORBID)
    with Session(demo, threads=threads, **CACHING) as s:  # type: ignore[arg-type]
        s.prefill(tokens)
        s.truncate(5)
        s.set_interventions([Intervention.parse(x) for x in late])
        tail = s.prefill(tokens[5:])
        trace, got = s.trace.copy(), counts(s)
    want_logits, want, want_counts = fresh_run(demo, tokens, *late, threads=threads)
    assert tail.tobytes() == want_logits[5:].tobytes()
    same_trace(trace, want)
    assert got == want_counts


# ---------------------------------------------------------------------------------------------
# interventions act on the routing actually used


def expected(trace: Trace, p: int, m: int, forced: list[int] | None, forbidden: set[int],
             threshold: float) -> tuple[list[int], bool, float, list[int]]:
    """(ids, kept, margin, fresh ids) of decision (p, m) by the cached rule under a force or a
    forbidden set (docs/interventions.md, "With expert caching"), from the selection scores the
    trace recorded; margin NaN where no previous set can be kept."""
    k = trace.expert_ids.shape[2]
    if forced is not None:
        return forced, False, np.nan, forced
    sel = trace.selection_scores[p, m].astype(np.float64)
    order = [int(e) for e in np.argsort(-sel, kind="stable")]   # ties: the lower index
    fresh = [e for e in order if e not in forbidden][:k]
    previous = [int(e) for e in trace.expert_ids[p - 1, m] if e >= 0] if p else []
    if len(previous) < k or len(fresh) < k or forbidden & set(previous):
        return fresh, False, np.nan, fresh
    gained = sum(sel[e] for e in fresh if e not in previous)
    dropped = sum(sel[e] for e in previous if e not in fresh)
    margin = max(0.0, gained - dropped)
    if set(fresh) != set(previous) and margin < threshold:
        return sorted(previous, key=lambda e: (-sel[e], e)), True, margin, fresh
    return fresh, False, margin, fresh


def test_every_cached_decision_under_interventions_follows_the_rule(demo: Model,
                                                                    tokens: list[int]) -> None:
    _, plain, _ = fresh_run(demo, tokens)
    assert list(plain.expert_ids[5, 1]) == [6, 1] and plain.cache_kept[5, 1]
    assert list(plain.expert_ids[4, 2]) == [2, 5] and plain.cache_kept[5, 2]
    _, trace, stats = fresh_run(demo, tokens, *SPECS)
    edits = [Intervention.parse(x) for x in SPECS]
    P, M, _ = trace.expert_ids.shape
    for p in range(P):
        for m, layer in enumerate(trace.moe_layers):
            acting = [e for e in edits if e.first <= p <= (e.last if e.last is not None else P)
                      and e.layer in (None, int(layer))]
            forced = next((list(e.experts) for e in reversed(acting) if e.kind == "force"), None)
            forbidden = {x for e in acting if e.kind in ("forbid", "ablate") for x in e.experts}
            ids, kept, margin, fresh = expected(trace, p, m, forced, forbidden, 0.5)
            assert list(trace.expert_ids[p, m]) == ids, (p, m)
            assert bool(trace.cache_kept[p, m]) == kept, (p, m)
            assert list(trace.fresh_ids[p, m]) == fresh, (p, m)
            if np.isnan(margin):
                assert np.isnan(trace.cache_margin[p, m]), (p, m)
            else:
                assert trace.cache_margin[p, m] == np.float32(margin), (p, m)
            bits = sum(1 << KINDS.index(e.kind) for e in acting)
            assert trace.intervened[p, m] == bits, (p, m)
    # what the three named decisions became
    assert list(trace.expert_ids[5, 1]) == [6, 2] and not trace.cache_kept[5, 1]
    assert list(trace.expert_ids[5, 2]) == [2, 0] and not trace.cache_kept[5, 2]
    assert not (trace.expert_ids[:, 3] == 0).any()
    assert trace.cache_kept.sum() != plain.cache_kept.sum()
    # the LRU sees the decisions made, and the counts add up
    assert np.array_equal(trace.cache_hits, replay_lru(trace.expert_ids, 4))
    total = stats[0]
    assert total.kept == int(trace.cache_kept.sum())  # type: ignore[attr-defined]
    assert total.hits == int(trace.cache_hits.sum())  # type: ignore[attr-defined]


def test_a_swap_leaves_the_routing_and_the_lru_as_they_were(demo: Model, tokens: list[int]) -> None:
    """A swap exchanges the weights a slot runs, not the decision: cached routing's choices and
    the LRU (which models the file's expert slots, as a file with the tensors exchanged would be
    loaded) are the plain run's up to the first position the changed outputs reach."""
    _, plain, _ = fresh_run(demo, tokens)
    _, swapped, _ = fresh_run(demo, tokens, "swap:pos=6-,layer=3,experts=0+4")
    for name in ("expert_ids", "cache_kept", "fresh_ids", "cache_hits"):
        assert np.array_equal(getattr(swapped, name)[:6], getattr(plain, name)[:6]), name
        assert np.array_equal(getattr(swapped, name)[6, :4], getattr(plain, name)[6, :4]), name
    assert np.array_equal(swapped.cache_hits, replay_lru(swapped.expert_ids, 4))
    assert (swapped.intervened[6:, 3] == 1 << KINDS.index("swap")).any()


# ---------------------------------------------------------------------------------------------
# stepping one layer at a time


def test_a_layer_run_again_under_a_force_restores_its_caching_state(demo: Model,
                                                                   tokens: list[int]) -> None:
    """Layers 0 and 1 of position 5 run (layer 1 keeps [6, 1]); a force at layer 1 and the layer
    again: the kept decision's count and LRU lookups are undone, and the run ends with the bits
    and counts of a run made under the force from the start."""
    with Session(demo, **CACHING) as s:  # type: ignore[arg-type]
        s.prefill(tokens[:5])
        before = counts(s)
        s.begin_token(tokens[5])
        s.step_layer()
        s.step_layer()
        assert s.cache_stats(1).kept == before[2].kept + 1  # type: ignore[attr-defined]
        s.set_interventions([Intervention.parse(FORCE)])
        s.rewind_layer()
        assert s.cache_stats(1) == before[2] and s.cache_stats(0) != before[1]
        s.step_layer()
        assert list(s.pending_trace().expert_ids[5, 1]) == [6, 2]
        while s.layers_done is not None:
            s.step_layer()
        tail = s.prefill(tokens[6:])
        trace, got = s.trace.copy(), counts(s)
    want_logits, want, want_counts = fresh_run(demo, tokens, FORCE)
    assert tail.tobytes() == want_logits[6:].tobytes()
    same_trace(trace, want)
    assert got == want_counts


def test_abandoning_a_position_in_progress_restores_the_counts(demo: Model,
                                                              tokens: list[int]) -> None:
    with Session(demo, **CACHING) as s:  # type: ignore[arg-type]
        s.prefill(tokens[:5])
        before = counts(s)
        s.begin_token(tokens[5])
        s.step_layer()
        s.step_layer()
        s.truncate(5)
        assert counts(s) == before
        s.prefill(tokens[5:])
        assert counts(s) == fresh_run(demo, tokens)[2]


# ---------------------------------------------------------------------------------------------
# embedding input


def rows(model: Model, ids: list[int]) -> np.ndarray:
    return np.ascontiguousarray(model.tensor_f32("token_embd")[ids])


@pytest.mark.parametrize("caching", [{}, CACHING], ids=["topk", "cached"])
def test_embedding_rows_take_interventions_as_token_ids_do(demo: Model, tokens: list[int],
                                                           caching: dict[str, object]) -> None:
    """The demo's own table rows under the interventions give the token ids' bits, from scratch
    and when rerun from a truncation."""
    settings = {"routing": "topk", "cache_threshold": 0.0, "expert_cache": 0, **caching}
    want_logits, want, want_counts = fresh_run(demo, tokens, FORCE, FORBID, **settings)
    x = rows(demo, tokens)
    with Session(demo, **settings) as s:  # type: ignore[arg-type]
        s.prefill_embeddings(x)
        s.truncate(5)
        s.set_interventions([Intervention.parse(FORCE), Intervention.parse(FORBID)])
        tail = s.prefill_embeddings(x[5:])
        trace, got = s.trace.copy(), counts(s)
    assert tail.tobytes() == want_logits[5:].tobytes()
    for name in TRACE_FIELDS:
        assert getattr(trace, name).tobytes() == getattr(want, name).tobytes(), name
    assert (trace.tokens == -1).all()
    assert got == want_counts


def test_a_counterfactual_of_an_embedding_prompt(demo: Model, tokens: list[int]) -> None:
    """`rerun` (the command line's counterfactual) on a generation from embedding rows: the run
    under the force is the token-id run under it."""
    prompt = list(demo.tokenizer.encode(PROMPT).ids)
    with Session(demo, **CACHING) as s:  # type: ignore[arg-type]
        g = s.generate(rows(demo, prompt), 8, keep_logits=True)
        cf = rerun(g, [Intervention.parse(FORCE)])
        assert cf is not None and cf.from_position == 5
        generated = list(g.generated)
    with Session(demo, **CACHING) as s:  # type: ignore[arg-type]
        s.set_interventions([Intervention.parse(FORCE)])
        assert s.generate(prompt, 8).generated == generated
    assert cf.intervened[5, 1] == 1 << KINDS.index("force")


def test_embedding_rows_step_layer_by_layer_to_the_bits_of_a_prefill(demo: Model,
                                                                     tokens: list[int]) -> None:
    """col_session_begin_embedding: a Generation stepping an embedding prompt one layer at a
    time, a layer of position 5 run again under the force, gives the bits and counts of the
    token-id run made under the force from the start."""
    prompt = list(demo.tokenizer.encode(PROMPT).ids)
    with Session(demo, **CACHING) as s:  # type: ignore[arg-type]
        g = Generation(s, rows(demo, prompt), 4, step_prompt=True, keep_logits=True)
        while g.positions < 5:
            g.advance_layer()
        g.advance_layer()
        g.advance_layer()                 # layers 0 and 1 of position 5
        assert s.layers_done == 2
        s.set_interventions([Intervention.parse(FORCE)])
        s.rewind_layer()
        while not g.finished:
            g.advance_layer()
        logits, trace, got = np.concatenate(g.logits), s.trace.copy(), counts(s)
    with Session(demo, **CACHING) as s:  # type: ignore[arg-type]
        s.set_interventions([Intervention.parse(FORCE)])
        ref = s.generate(prompt, 4, keep_logits=True)
        assert logits.tobytes() == np.concatenate(ref.logits).tobytes()
        same_trace(trace, s.trace)
        assert got == counts(s)
    assert list(trace.tokens[:len(prompt)]) == [-1] * len(prompt)


def test_a_bad_embedding_row_is_named_and_begins_nothing(demo: Model) -> None:
    row = rows(demo, [5])[0].copy()
    row[17] = np.inf
    with Session(demo) as s:
        with pytest.raises(ColibriValueError, match="embedding row 0, element 17 is infinite"):
            s.begin_embedding(row)
        with pytest.raises(ColibriValueError, match=r"shape \[1, 3\]"):
            s.begin_embedding(np.zeros(3, np.float32))
        assert s.layers_done is None and s.position == 0
