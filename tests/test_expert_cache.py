"""Expert caching in the engine: cached routing (keep the previous position's set while the fresh
top-k's margin over it is below a threshold) and the LRU of resident experts.

Every decision of a real run is checked against the rule written out here in numpy (the margin
on the selection scores, the keep condition, the kept set's order), the LRU's hit flags against
a plain Python LRU replayed over the trace, and the run's invariants: threshold 0 is plain top-k,
the cache state flows position by position (prefill == stepping), any thread count gives the
same bits, reset forgets the state. The C unit tests (engine_c/tests/test_router.c,
test_cache.c) hold the small cases computed by hand.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session, Trace
from colibri.errors import ColibriValueError
from tiny_models import RULES, V3_RULE

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
TOKENS = [int(t) for t in np.random.default_rng(1).integers(0, 50, 40)]

@pytest.fixture(params=sorted(RULES))
def rule_model(request: pytest.FixtureRequest, tiny_model_path: Callable[..., Path]) -> Model:
    arch, options = RULES[request.param]
    model = Model.open(tiny_model_path(arch, **options))
    yield model
    model.close()


def cached_run(model: Model, threshold: float, tokens: list[int] = TOKENS, expert_cache: int = 0,
               threads: int = 1, step: bool = False) -> tuple[np.ndarray, Trace]:
    with Session(model, routing="cached", cache_threshold=threshold, threads=threads,
                 expert_cache=expert_cache, max_context=len(tokens)) as s:
        logits = np.stack([s.step(t) for t in tokens]) if step else s.prefill(tokens)
        trace = s.trace
        assert trace is not None
        return logits, trace.copy()


def check_rule(trace: Trace, threshold: float) -> int:
    """Every decision against the rule (docs/interface-spec.md, "Routing modes"); returns how
    many kept the previous set."""
    kept_total = 0
    P, M, k = trace.expert_ids.shape
    for p in range(P):
        for m in range(M):
            ids, fresh = trace.expert_ids[p, m], trace.fresh_ids[p, m]
            sel = trace.selection_scores[p, m].astype(np.float64)
            if p == 0:
                assert np.isnan(trace.cache_margin[p, m]) and not trace.cache_kept[p, m]
                assert list(ids) == list(fresh)
                continue
            previous = trace.expert_ids[p - 1, m]
            gained = [int(e) for e in fresh if e not in previous]
            dropped = [int(e) for e in previous if e not in fresh]
            margin = max(0.0, sum(sel[e] for e in gained) - sum(sel[e] for e in dropped))
            assert trace.cache_margin[p, m] == np.float32(margin), (p, m)
            keep = bool(gained) and margin < threshold
            assert bool(trace.cache_kept[p, m]) == keep, (p, m)
            if keep:
                kept_total += 1
                order = sorted((int(e) for e in previous), key=lambda e: (-sel[e], e))
                assert list(ids) == order, (p, m)
            else:
                assert list(ids) == list(fresh), (p, m)
    return kept_total


def test_every_decision_follows_the_rule(rule_model: Model) -> None:
    """For each rule kind, over thresholds from small to large on its selection scale, decisions
    that keep the previous set and decisions that take a different fresh set both occur."""
    kept = switched = 0
    for threshold in (0.02, 0.2, 0.5):
        _, trace = cached_run(rule_model, threshold)
        kept += check_rule(trace, threshold)
        switched += int((np.sort(trace.expert_ids[1:], -1)
                         != np.sort(trace.expert_ids[:-1], -1)).any(-1).sum())
    assert kept > 0 and switched > 0, (kept, switched)


def test_fresh_ids_are_plain_top_k_of_the_same_values(rule_model: Model) -> None:
    """The fresh choice is what plain top-k makes: up to the first kept decision the two runs
    are the same computation, so their ids, router logits and fresh choice agree bit for bit."""
    _, trace = cached_run(rule_model, 0.5)
    kept = np.argwhere(trace.cache_kept)
    assert kept.size
    p, m = (int(x) for x in kept[0])
    with Session(rule_model, routing="topk") as plain:
        plain.prefill(TOKENS)
        ptrace = plain.trace
        assert ptrace is not None
        assert np.array_equal(ptrace.expert_ids[:p], trace.expert_ids[:p])
        assert np.array_equal(ptrace.expert_ids[:p], trace.fresh_ids[:p])
        assert np.array_equal(ptrace.expert_ids[p, :m + 1], trace.fresh_ids[p, :m + 1])
        assert np.array_equal(ptrace.router_logits[p, :m + 1], trace.router_logits[p, :m + 1])
        assert not np.array_equal(ptrace.expert_ids[p, m], trace.expert_ids[p, m])


def test_threshold_zero_is_plain_top_k(rule_model: Model) -> None:
    logits, trace = cached_run(rule_model, 0.0)
    with Session(rule_model, routing="topk") as plain:
        assert plain.prefill(TOKENS).tobytes() == logits.tobytes()
        ptrace = plain.trace
        assert ptrace is not None
        assert np.array_equal(ptrace.expert_ids, trace.expert_ids)
        assert np.array_equal(ptrace.expert_weights, trace.expert_weights)
    assert not trace.cache_kept.any()


def test_a_huge_threshold_keeps_the_first_set_for_ever(tiny_model_path: Callable[..., Path]
                                                        ) -> None:
    with Model.open(tiny_model_path()) as model:
        _, trace = cached_run(model, 1e30)
    sets = np.sort(trace.expert_ids, axis=-1)
    assert (sets == sets[:1]).all()
    assert trace.cache_kept[1:].sum() > 0


def test_prefill_equals_stepping_and_threads_do_not_matter(rule_model: Model) -> None:
    """The cache state flows position by position: one prefill, one step per token and three
    threads give the same bits, trace included."""
    runs = [cached_run(rule_model, 0.5, expert_cache=rule_model.hparams.n_experts - 1),
            cached_run(rule_model, 0.5, expert_cache=rule_model.hparams.n_experts - 1,
                       step=True),
            cached_run(rule_model, 0.5, expert_cache=rule_model.hparams.n_experts - 1,
                       threads=3)]
    (logits, trace), others = runs[0], runs[1:]
    for other_logits, other in others:
        assert other_logits.tobytes() == logits.tobytes()
        for name in ("expert_ids", "expert_weights", "fresh_ids", "cache_kept", "cache_margin",
                     "cache_hits", "selection_scores"):
            assert getattr(other, name).tobytes() == getattr(trace, name).tobytes(), name


def test_a_block_boundary_carries_the_state() -> None:
    """A prefill longer than one engine block (256 positions) of the demo model is the same as
    stepping."""
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, 4096, 300)]
    with Model.open(DEMO) as model:
        a = cached_run(model, 0.5, tokens, expert_cache=3)
        b = cached_run(model, 0.5, tokens, expert_cache=3, step=True)
    assert a[1].cache_kept.sum() > 0
    assert a[0].tobytes() == b[0].tobytes()
    assert a[1].expert_ids.tobytes() == b[1].expert_ids.tobytes()
    assert a[1].cache_hits.tobytes() == b[1].cache_hits.tobytes()


def test_reset_forgets_the_state(tiny_model_path: Callable[..., Path]) -> None:
    with Model.open(tiny_model_path()) as model, \
            Session(model, routing="cached", cache_threshold=0.5, expert_cache=3) as s:
        first = s.prefill(TOKENS)
        ids = np.array(s.trace.expert_ids)
        stats = s.cache_stats()
        s.reset()
        assert s.cache_stats().decisions == 0 and s.cache_stats().resident == 0
        assert s.prefill(TOKENS).tobytes() == first.tobytes()
        assert np.array_equal(s.trace.expert_ids, ids)
        assert s.cache_stats() == stats


def replay_lru(ids: np.ndarray, capacity: int) -> np.ndarray:
    """The trace's lookups through a plain LRU per layer (OrderedDict, most recent last)."""
    P, M, k = ids.shape
    hits = np.zeros((P, M, k), bool)
    for m in range(M):
        resident: OrderedDict[int, None] = OrderedDict()
        for p in range(P):
            for slot in range(k):
                e = int(ids[p, m, slot])
                if e in resident:
                    hits[p, m, slot] = True
                    resident.move_to_end(e)
                else:
                    if len(resident) == capacity:
                        resident.popitem(last=False)
                    resident[e] = None
    return hits


@pytest.mark.parametrize("routing", ["topk", "cached", "soft"])
def test_lru_hits_match_a_reference_lru(tiny_model_path: Callable[..., Path],
                                        routing: str) -> None:
    with Model.open(tiny_model_path("mixtral", n_experts=8, rule=V3_RULE)) as model:
        capacity = 8 if routing == "soft" else 3
        with Session(model, routing=routing, cache_threshold=0.2, expert_cache=capacity) as s:
            s.prefill(TOKENS)
            trace = s.trace
            assert trace is not None
            want = replay_lru(trace.expert_ids, capacity)
            assert np.array_equal(trace.cache_hits, want)
            hits, lookups = trace.cache_counts()
            stats = s.cache_stats()
            assert (stats.hits, stats.hits + stats.misses) == (hits, lookups)
            assert stats.resident == capacity * model.hparams.n_moe_layers
            per_layer = [s.cache_stats(m) for m in range(model.hparams.n_moe_layers)]
            assert sum(x.hits for x in per_layer) == stats.hits
            assert per_layer[0].hits == int(want[:, 0].sum())
            assert stats.kept == int(trace.cache_kept.sum())


def test_counts_without_a_trace(tiny_model_path: Callable[..., Path]) -> None:
    """The CLI's summary reads the counts of a session whose trace is off."""
    with Model.open(tiny_model_path()) as model:
        with Session(model, routing="cached", cache_threshold=0.5, expert_cache=3,
                     trace=False) as a, \
                Session(model, routing="cached", cache_threshold=0.5, expert_cache=3) as b:
            assert a.prefill(TOKENS).tobytes() == b.prefill(TOKENS).tobytes()
            assert a.trace is None
            assert a.cache_stats() == b.cache_stats()
            assert a.cache_stats().hits > 0


def test_cached_routing_raises_the_hit_rate(tiny_model_path: Callable[..., Path]) -> None:
    """What the remedy is for: keeping sets more often means fewer loads."""
    with Model.open(tiny_model_path("mixtral", n_experts=8, rule=V3_RULE)) as model:
        rates = []
        for threshold in (0.0, 0.2, 1.0):
            with Session(model, routing="cached", cache_threshold=threshold, expert_cache=4) as s:
                s.prefill(TOKENS)
                rates.append(s.cache_stats().hit_rate)
    assert rates[0] < rates[1] < rates[2]


def test_without_caching_nothing_is_counted(tiny_model_path: Callable[..., Path]) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as s:
        s.prefill(TOKENS)
        trace = s.trace
        assert trace is not None
        assert s.cache_stats().decisions == 0
        assert trace.cache_hits.shape[2] == 0 and trace.fresh_ids.shape[2] == 0
        assert not trace.cache_kept.any() and np.isnan(trace.cache_margin).all()
        assert trace.cache_counts() == (0, 0)


def test_settings_refused_in_the_engines_words(tiny_model_path: Callable[..., Path]) -> None:
    with Model.open(tiny_model_path()) as model:  # 4 experts, top-2
        with pytest.raises(ColibriValueError, match="cache_threshold must be finite and >= 0"):
            Session(model, routing="cached", cache_threshold=-1.0)
        with pytest.raises(ColibriValueError, match="cache_threshold must be finite and >= 0"):
            Session(model, routing="cached", cache_threshold=float("nan"))
        with pytest.raises(ColibriValueError, match=r"expert_cache 1 outside 2\.\.4"):
            Session(model, expert_cache=1)
        with pytest.raises(ColibriValueError, match=r"expert_cache 5 outside 2\.\.4"):
            Session(model, expert_cache=5)
        with pytest.raises(ColibriValueError, match=r"expert_cache 2 outside 4\.\.4"):
            Session(model, routing="soft", expert_cache=2)
        with pytest.raises(ColibriValueError, match="cache_threshold must be a number"):
            Session(model, routing="cached", cache_threshold="0.5")  # type: ignore[arg-type]
        with pytest.raises(ColibriValueError, match="expert_cache must be an int"):
            Session(model, expert_cache=2.0)  # type: ignore[arg-type]
        with Session(model) as s, pytest.raises(ColibriValueError, match="no MoE layer 7"):
            s.cache_stats(7)
