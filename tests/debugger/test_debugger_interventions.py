"""Interventions under the debugger: a change mid-run recomputes from the first position it can
affect and is compared with the run as it was; an edit between layers remakes the decision just
made; a breakpoint's 'forbid' action goes on; saved sessions keep all of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.debugging import (CacheKept, Counterfactual, Debugger, ExpertChosen, RunImage,
                                RunSettings)
from colibri.debugging.session_file import load_session, save_session
from colibri.debugging import run as run_module
from colibri.engine import Model
from colibri.generation import Generation
from colibri.interventions import KINDS, Intervention
from colibri.jitter.analysis import logit_divergence

from dbg_helpers import PROMPT, drop_arrays, finished, rewrite_session

FORCE = Intervention.parse("force:pos=3,layer=2,experts=5+6")


def test_a_change_recomputes_from_its_position_and_is_compared(model: Model) -> None:
    dbg = finished(model, RunSettings(PROMPT, 6))
    before_ids, before_logits = np.array(dbg.record.expert_ids), dbg.logits()
    before_tokens = list(dbg.generation.tokens)
    cf = dbg.set_interventions([FORCE])
    assert cf is not None and cf.from_position == 3 and dbg.counterfactual is cf
    # the run now is the run made with the intervention from the start
    ref = finished(model, RunSettings(PROMPT, 6, interventions=[FORCE]))
    assert dbg.record.equals(ref.record, timings=False) and dbg.generated == ref.generated
    assert dbg.settings.interventions == (FORCE,)
    # ... and the comparison holds both runs' own numbers
    assert np.array_equal(cf.original_expert_ids, before_ids)
    assert np.array_equal(cf.expert_ids, ref.record.expert_ids)
    assert list(cf.original_tokens) == before_tokens and list(cf.tokens) == ref.generation.tokens
    max_abs, kl = logit_divergence(before_logits, ref.logits())
    assert np.array_equal(cf.max_abs, max_abs) and np.array_equal(cf.kl, kl)
    assert not cf.kl[:3].any() and cf.kl[3] > 0
    changed = cf.routing_changed
    assert changed[3, 1] and not changed[:3].any()
    assert cf.intervened[3, 1] == 1 << KINDS.index("force")
    assert cf.summary()["downstream_changed"] == int((changed & (cf.intervened == 0)).sum())
    # the event carries what acted on it
    assert dbg.events[dbg.events.index_of(3, 1)].intervention_kinds == ("force",)
    # the same list again changes nothing; removing it restores the first run exactly
    assert dbg.set_interventions([FORCE]) is None
    back = dbg.set_interventions([])
    assert back is not None and np.array_equal(dbg.record.expert_ids, before_ids)


def test_a_late_change_keeps_and_compares_only_the_positions_it_recomputes(model: Model) -> None:
    dbg = finished(model, RunSettings(PROMPT, 6))
    before = dbg.logits()
    cf = dbg.set_interventions([Intervention.parse("force:pos=8,layer=2,experts=5+6")])
    assert cf is not None and cf.from_position == 8 and cf.n_positions == dbg.position == 10
    max_abs, kl = logit_divergence(before, dbg.logits())  # the whole runs compared
    assert np.array_equal(cf.max_abs, max_abs) and np.array_equal(cf.kl, kl)
    assert not cf.kl[:8].any() and cf.kl[8] > 0
    image = RunImage.of_generation(dbg.generation, 8)
    assert image.n_positions == 10 and image.logits.tobytes() == dbg.logits()[8:].tobytes()
    with pytest.raises(ValueError, match="after the change's first"):
        Counterfactual.between(image, image, 7, len(PROMPT))


def test_an_edit_between_layers_remakes_the_decision_just_made(model: Model) -> None:
    dbg2 = Debugger(model, RunSettings(PROMPT, 4))
    while dbg2.step_layer().key != (3, 0):
        pass
    assert dbg2.layers_done == 1                             # paused after layer 0 of position 3
    assert dbg2.set_interventions([FORCE]) is None           # nothing complete changed
    assert dbg2.layers_done == 1 and dbg2.position == 3      # still paused at the same place
    event = dbg2.step_layer()                                # layer 2 runs under the edit
    assert event.key == (3, 1) and event.expert_ids == (5, 6)
    assert event.intervention_kinds == ("force",)
    dbg2.run()
    ref = finished(model, RunSettings(PROMPT, 4, interventions=[FORCE]))
    assert dbg2.record.equals(ref.record, timings=False)


def test_the_decision_just_made_can_be_made_again(model: Model) -> None:
    dbg = Debugger(model, RunSettings(PROMPT, 4))
    while dbg.step_layer().key != (2, 0):
        pass
    chosen = dbg.current.expert_ids
    other = tuple(e for e in range(8) if e not in chosen)[:2]
    edit = Intervention("force", other, first=2, last=2, layer=0)
    assert dbg.set_interventions([edit]) is None
    assert dbg.current.key == (2, 0) and dbg.current.expert_ids == other
    assert dbg.layers_done == 1
    dbg.run()
    ref = finished(model, RunSettings(PROMPT, 4, interventions=[edit]))
    assert dbg.record.equals(ref.record, timings=False)


def test_a_forbid_breakpoint_goes_on_without_the_expert(model: Model) -> None:
    plain = finished(model, RunSettings(PROMPT, 8))
    layer = 2
    counts = np.bincount(plain.record.expert_ids[:, 1].ravel(), minlength=8)
    expert = int(np.argmax(counts))                      # the expert layer 2 chose most
    dbg = Debugger(model, RunSettings(PROMPT, 8))
    dbg.breakpoints.add(ExpertChosen(expert, layer, action="forbid"))
    result = dbg.continue_()
    assert result.reason == "finished" and len(result.actions) >= 2
    assert not (dbg.record.expert_ids[:, 1] == expert).any()
    hits = [a.first for a in result.actions]
    assert all(a.kind == "forbid" and a.experts == (expert,) and a.layer == layer and
               a.first == a.last for a in result.actions) and hits == sorted(hits)
    assert dbg.settings.interventions == result.actions
    ref = finished(model, RunSettings(PROMPT, 8, interventions=result.actions))
    assert dbg.record.equals(ref.record, timings=False)
    assert np.flatnonzero(dbg.record.intervened[:, 1]).tolist() == hits


def test_under_expert_caching_a_forbid_breakpoint_recomputes_to_a_fresh_runs_bits(
        moe3_path: Path, tmp_path: Path) -> None:
    """"When cached routing keeps a set, forbid its first choice and go on": each hit truncates
    and recomputes, expert caching's state rebuilt at the truncation, so the record (the caching
    columns included) is the one a run made under the collected forbids from the start gives;
    a forbidden expert's set is never kept where the forbid acts, and the saved session keeps
    both the caching columns and the interventions."""
    cached = dict(routing="cached", cache_threshold=0.5, expert_cache=3)
    with Model.open(moe3_path) as model:
        plain = finished(model, RunSettings(PROMPT, 8, **cached))  # type: ignore[arg-type]
        assert plain.record.cache_kept.any()
        dbg = Debugger(model, RunSettings(PROMPT, 8, **cached))  # type: ignore[arg-type]
        dbg.breakpoints.add(CacheKept(action="forbid"))
        result = dbg.continue_()
        assert result.reason == "finished" and result.actions
        ref = finished(model, RunSettings(PROMPT, 8, interventions=result.actions,
                                       **cached))  # type: ignore[arg-type]
        assert dbg.record.equals(ref.record, timings=False)
        assert dbg.session.cache_stats() == ref.session.cache_stats()
        forbid = 1 << KINDS.index("forbid")
        acted = (dbg.record.intervened & forbid) != 0
        assert acted.sum() == len(result.actions) and not dbg.record.cache_kept[acted].any()
        path = tmp_path / "cached.colibri-session"
        save_session(path, dbg)
        loaded = load_session(path)
        assert loaded.record.equals(dbg.record, timings=False)
        assert loaded.settings == dbg.settings
        for d in (plain, dbg, ref):
            d.close()


@pytest.mark.parametrize("piece", [1, 5])
def test_forbid_breakpoints_inside_prompt_pieces_give_the_stepped_runs_bits(
        moe3_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    """A 40-token prompt under expert caching, run in pieces of at most `piece` positions
    (after the first of PROMPT_PIECE_FIRST) with a forbid breakpoint on every kept set: each hit
    inside a piece forgets the positions after it, so the hits, the actions and the record are
    those of a run that stepped every position (the piece's only effect is the engine calls)."""
    monkeypatch.setattr(run_module, "PROMPT_PIECE_MAX", piece)
    cached = dict(routing="cached", cache_threshold=0.5, expert_cache=3)
    prompt = tuple(3 + (7 * i) % 40 for i in range(40))
    with Model.open(moe3_path) as model:
        stepped = Debugger(model, RunSettings(prompt, 8, **cached))  # type: ignore[arg-type]
        stepped.breakpoints.add(CacheKept(action="forbid"))
        one_at_a_time = stepped.generation
        one_at_a_time.advance = (  # type: ignore[method-assign]
            lambda limit=None: Generation.advance(one_at_a_time, 1))
        expected = stepped.continue_()
        dbg = Debugger(model, RunSettings(prompt, 8, **cached))  # type: ignore[arg-type]
        dbg.breakpoints.add(CacheKept(action="forbid"))
        result = dbg.continue_()
        assert result.reason == "finished" and len(result.actions) >= 2
        assert any(a.first < len(prompt) for a in result.actions)  # hits inside the prompt
        assert result.actions == expected.actions
        assert dbg.record.equals(stepped.record, timings=False)
        assert dbg.logits().tobytes() == stepped.logits().tobytes()
        assert dbg.session.cache_stats() == stepped.session.cache_stats()
        for d in (stepped, dbg):
            d.close()


def test_sessions_keep_interventions_and_the_comparison(model: Model, tmp_path: Path) -> None:
    dbg = finished(model, RunSettings(PROMPT, 5))
    dbg.breakpoints.add(ExpertChosen(1, 2, action="forbid"))
    dbg.set_interventions([FORCE, Intervention.parse("ablate:layer=0,experts=4")])
    path = tmp_path / "run.colibri-session"
    saved = save_session(path, dbg)
    loaded = load_session(path)
    assert loaded == saved
    assert loaded.settings.interventions == dbg.settings.interventions
    assert loaded.breakpoints[0].action == "forbid"
    assert loaded.counterfactual is not None
    assert loaded.counterfactual.to_dict() == dbg.counterfactual.to_dict()
    assert np.array_equal(loaded.record.intervened, dbg.record.intervened)
    assert loaded.events()[loaded.events().index_of(3, 1)].intervention_kinds == ("force",)


def test_a_session_from_before_interventions_still_opens(model: Model, tmp_path: Path) -> None:
    dbg = finished(model, RunSettings(PROMPT, 3))
    dbg.breakpoints.add(ExpertChosen(1, 2))
    path = tmp_path / "new.colibri-session"
    save_session(path, dbg)

    def before_interventions(manifest: dict[str, Any], members: dict[str, bytes]) -> None:
        manifest.pop("counterfactual")
        manifest["settings"].pop("interventions")
        for bp in manifest["breakpoints"]:
            bp.pop("action")
        drop_arrays(manifest, members, "intervened")

    loaded = load_session(rewrite_session(path, tmp_path / "old.colibri-session",
                                          before_interventions))
    assert loaded.settings.interventions == () and loaded.counterfactual is None
    assert loaded.breakpoints[0].action == "stop"
    assert not loaded.record.intervened.any()
    assert loaded.record.equals(dbg.record)


def test_a_pause_ends_a_recomputation_early_and_the_run_goes_on(model: Model) -> None:
    dbg = finished(model, RunSettings(PROMPT, 6))
    dbg.request_pause()                       # as the Pause button would, during the recompute
    assert dbg.set_interventions([FORCE]) is None
    assert dbg.position == 3                  # the positions from the change on are not redone
    dbg.clear_requests()
    assert dbg.run().reason == "finished"
    ref = finished(model, RunSettings(PROMPT, 6, interventions=[FORCE]))
    assert dbg.record.equals(ref.record, timings=False) and dbg.generated == ref.generated
