"""Stepping, running, pausing and stopping produce exactly the engine's routing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from colibri.debugging import AtPosition, Debugger, RunSettings
from colibri.debugging import run as run_module
from colibri.debugging.run import PROMPT_PIECE_FIRST
from colibri.engine import Model

from dbg_helpers import PROMPT, reference_run

ROUTING_FIELDS = ("tokens", "expert_ids", "expert_weights", "router_logits", "shared_gate",
                  "hidden_norm")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("routing", ["topk", "stable", "soft", "gumbel"])
def test_step_token_matches_python_api_trace(model: Model, routing: str) -> None:
    ref, generated = reference_run(model, PROMPT, 6, routing=routing, seed=7)
    dbg = Debugger(model, RunSettings(PROMPT, 6, routing=routing, seed=7))
    steps = 0
    while not dbg.finished:
        new = dbg.step_token()
        if new:
            steps += 1
            assert [e.position for e in new] == [steps - 1] * dbg.record.n_moe_layers
            assert dbg.cursor == new[0].index
    assert dbg.generated == generated
    assert dbg.position == ref.n_positions == len(PROMPT) + 5
    for name in ROUTING_FIELDS:
        assert _same_bits(dbg.record.array(name), getattr(ref, name)), name
    assert np.array_equal(dbg.record.moe_layers, ref.moe_layers)
    assert dbg.step_token() == []  # finished: nothing more


def test_events_carry_the_trace_values(model: Model) -> None:
    ref, _ = reference_run(model, PROMPT, 3)
    dbg = Debugger(model, RunSettings(PROMPT, 3))
    dbg.run()
    M = ref.moe_layers.size
    assert len(dbg.events) == ref.n_positions * M
    for e in dbg.events:
        ids = ref.expert_ids[e.position, e.moe_index]
        assert e.expert_ids == tuple(int(i) for i in ids)
        assert e.expert_weights == tuple(float(w) for w in ref.expert_weights[e.position, e.moe_index])
        assert e.layer == int(ref.moe_layers[e.moe_index])
        assert e.hidden_norm == float(ref.hidden_norm[e.position, e.moe_index])
        assert np.array_equal(e.router_logits, ref.router_logits[e.position, e.moe_index])
        assert not np.isnan(e.shared_gate)  # qwen2_moe has a shared-expert gate
        # margin: k-th minus (k+1)-th sorted router logit (plain top-k), computed independently
        s = np.sort(ref.router_logits[e.position, e.moe_index])[::-1]
        assert e.margin == float(np.float32(s[1] - s[2]))
        assert e.margin >= 0 and e.margin_ulps is not None and e.margin_ulps >= 0


def test_step_layer_runs_the_engine_one_moe_layer_at_a_time(model: Model) -> None:
    ref, _ = reference_run(model, PROMPT, 2)
    dbg = Debugger(model, RunSettings(PROMPT, 2))
    layers = [int(x) for x in ref.moe_layers]          # qwen2_moe here: 0 and 2 (1 is dense)
    seen = []
    while True:
        before = dbg.position
        event = dbg.step_layer()
        if event is None:
            break
        assert dbg.current == event
        assert event.expert_ids == tuple(int(e) for e in ref.expert_ids[event.position,
                                                                         event.moe_index])
        assert event.hidden_norm == float(ref.hidden_norm[event.position, event.moe_index])
        if event.layer == layers[-1] == model.hparams.n_layers - 1:
            # the position's last layer ran: it joined the record
            assert dbg.position == before + 1 and dbg.layers_done is None
        else:
            # the run pauses right after the layer: the next one has not run
            assert dbg.position == before and dbg.layers_done == event.layer + 1
        seen.append(event.key)
    assert seen == [(p, m) for p in range(ref.n_positions) for m in range(len(layers))]
    assert dbg.record.expert_ids.tobytes() == ref.expert_ids.tobytes()


def test_step_layer_over_computed_decisions_moves_the_cursor(model: Model) -> None:
    dbg = Debugger(model, RunSettings(PROMPT, 2))
    dbg.step_token()
    assert dbg.cursor == 0 and dbg.position == 1
    event = dbg.step_layer()
    assert event.key == (0, 1) and dbg.position == 1 and dbg.layers_done is None
    event = dbg.step_layer()       # past the last computed decision: the engine runs
    assert event.key == (1, 0) and dbg.position == 1 and dbg.layers_done == 1


def test_pause_and_resume_equal_an_uninterrupted_run(model: Model) -> None:
    settings = RunSettings(PROMPT, 8, decoding="sample", seed=3, temperature=1.5)
    whole = Debugger(model, settings)
    assert whole.run().reason == "finished"

    dbg = Debugger(model, settings)
    results = []

    def pause_every_third(position: int) -> None:
        if dbg.position % 3 == 0:
            dbg.request_pause()

    def worker() -> None:
        while True:
            r = dbg.run(on_position=pause_every_third)
            results.append(r)
            if r.reason != "paused":
                return

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert [r.reason for r in results[:-1]] == ["paused"] * (len(results) - 1)
    assert results[-1].reason == "finished" and len(results) > 2
    assert dbg.generated == whole.generated
    assert dbg.record.equals(whole.record, timings=False)


LONG_PROMPT = tuple(3 + (7 * i) % 40 for i in range(40))


def _count_prefills(dbg: Debugger) -> list[int]:
    """Record the size of every prefill the debugger's session makes from now on."""
    sizes: list[int] = []
    prefill = dbg.session.prefill

    def counted(tokens, **kw):  # type: ignore[no-untyped-def]
        sizes.append(len(tokens))
        return prefill(tokens, **kw)

    dbg.session.prefill = counted  # type: ignore[method-assign]
    return sizes


def test_run_takes_the_prompt_in_pieces_with_the_bits_of_stepping(model: Model) -> None:
    settings = RunSettings(LONG_PROMPT, 4)
    stepped = Debugger(model, settings)
    while stepped.step_token():
        pass
    dbg = Debugger(model, settings)
    pieces = _count_prefills(dbg)
    assert dbg.run().reason == "finished"
    assert sum(pieces) == len(LONG_PROMPT) and 1 < len(pieces) < len(LONG_PROMPT)
    assert pieces[0] == PROMPT_PIECE_FIRST
    assert dbg.record.equals(stepped.record, timings=False)
    assert dbg.logits().tobytes() == stepped.logits().tobytes()
    assert dbg.generated == stepped.generated
    # a piece's positions share its engine time evenly
    first = dbg.record.token_ns[:PROMPT_PIECE_FIRST]
    assert (first == first[0]).all() and first[0] > 0


def test_a_breakpoint_inside_a_piece_stands_where_stepping_would(model: Model) -> None:
    settings = RunSettings(LONG_PROMPT, 4)
    dbg = Debugger(model, settings)
    pieces = _count_prefills(dbg)
    r = dbg.run(until=[AtPosition(5)])
    assert r.reason == "breakpoint" and r.event is not None and r.event.key == (5, 0)
    assert pieces == [PROMPT_PIECE_FIRST]  # positions 6 and 7 were computed, then forgotten
    assert dbg.position == 6 and dbg.generation.positions == 6 and dbg.session.position == 6
    assert dbg.cursor == r.event.index and len(dbg.events) == 6 * dbg.record.n_moe_layers
    assert dbg.run().reason == "finished"
    whole = Debugger(model, settings)
    whole.run()
    assert dbg.record.equals(whole.record, timings=False)
    assert dbg.logits().tobytes() == whole.logits().tobytes()


def test_a_pause_inside_the_prompt_waits_for_the_piece_and_resumes_exactly(
        model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_module, "PROMPT_PIECE_MAX", 4)
    settings = RunSettings(LONG_PROMPT, 4, decoding="sample", seed=3, temperature=1.5)
    whole = Debugger(model, settings)
    whole.run()
    dbg = Debugger(model, settings)
    pieces = _count_prefills(dbg)

    def pause_at_ten(position: int) -> None:
        if position == 10:
            dbg.request_pause()

    r = dbg.run(on_position=pause_at_ten)
    # pieces of 8 (the first, positions 0-7), then 4: position 10 is in the second, to 11
    assert r.reason == "paused" and dbg.position == 12 and pieces == [8, 4]
    assert dbg.run().reason == "finished"
    assert dbg.record.equals(whole.record, timings=False) and dbg.generated == whole.generated


def test_a_run_limited_to_fewer_positions_than_a_piece_computes_no_more(model: Model) -> None:
    dbg = Debugger(model, RunSettings(LONG_PROMPT, 4))
    pieces = _count_prefills(dbg)
    assert dbg.run(max_positions=3).reason == "limit"
    assert pieces == [3] and dbg.position == 3


def test_stop_keeps_what_was_produced(model: Model) -> None:
    dbg = Debugger(model, RunSettings(PROMPT, 10))

    def stop_at_six(position: int) -> None:
        if dbg.position == 6:
            dbg.request_stop()

    r = dbg.run(on_position=stop_at_six)
    assert r.reason == "stopped" and dbg.finished and dbg.stop_reason == "stopped"
    assert dbg.position == 6 and len(dbg.events) == 6 * dbg.record.n_moe_layers
    ref, _ = reference_run(model, PROMPT, 10)
    assert _same_bits(dbg.record.expert_ids, ref.expert_ids[:6])
    assert dbg.run().reason == "finished" and dbg.position == 6  # nothing more after a stop


def test_max_positions_and_eos(tiny_model_path) -> None:
    # eos = the token greedy decoding produces first, so decoding stops right after it
    path = tiny_model_path("qwen2_moe", n_layers=3, n_experts=8, top_k=2, dense_layers=(1,))
    with Model.open(path) as m:
        _, generated = reference_run(m, PROMPT, 4)
    eos_path = tiny_model_path("qwen2_moe", n_layers=3, n_experts=8, top_k=2, dense_layers=(1,),
                               eos_token_id=generated[0])
    with Model.open(eos_path) as m:
        dbg = Debugger(m, RunSettings(PROMPT, 8))
        assert dbg.run(max_positions=2).reason == "limit" and dbg.position == 2
        assert dbg.run().reason == "finished"
        assert dbg.stop_reason == "eos" and dbg.generated == [generated[0]]
        assert dbg.position == len(PROMPT)


def test_settings_are_checked(model: Model) -> None:
    with pytest.raises(ValueError, match="empty"):
        RunSettings(())
    with pytest.raises(ValueError, match="decoding"):
        RunSettings((1,), decoding="beam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_context"):
        Debugger(model, RunSettings((3,), max_new_tokens=1000))
    s = RunSettings((3, 4), 5, "sample", 9, 0.7, "stable", 1e-4, 2)
    assert RunSettings.from_dict(s.to_dict()) == s


def test_prompt_pieces(model: Model) -> None:
    dbg = Debugger(model, RunSettings(PROMPT, 1))
    assert dbg.prompt_pieces() == [(3, "the"), (4, "cat"), (5, "sat"), (6, "on"), (7, "mat")]
