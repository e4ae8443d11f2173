"""Changing a debugged run's routing mid-run (Debugger.set_routing): the engine routes the
computed positions again from their recorded router logits, the run is computed again from the
first one decided differently, and the run as it was is compared with the new one. The result is
the run made with that routing from the start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from colibri.debugging import Debugger, RunSettings
from colibri.debugging.session_file import load_session, save_session
from colibri.engine import Model
from colibri.errors import ColibriValueError
from colibri.jitter.analysis import logit_divergence

from dbg_helpers import PROMPT, finished


def first_difference(a: np.ndarray, b: np.ndarray) -> int:
    differ = np.flatnonzero((a != b).reshape(a.shape[0], -1).any(axis=1))
    return int(differ[0]) if differ.size else a.shape[0]


def test_gumbel_routing_recomputes_from_the_first_changed_decision(model: Model) -> None:
    dbg = finished(model, RunSettings(PROMPT, 6, seed=4))
    before_ids, before_logits = np.array(dbg.record.expert_ids), dbg.logits()
    cf = dbg.set_routing("gumbel")
    ref = finished(model, RunSettings(PROMPT, 6, seed=4, routing="gumbel"))
    assert dbg.record.equals(ref.record, timings=False) and dbg.generated == ref.generated
    assert dbg.settings.routing == "gumbel"
    first = first_difference(before_ids, np.array(ref.record.expert_ids))
    assert first < dbg.position, "gumbel noise changed nothing: the test shows nothing"
    assert cf is not None and cf.from_position == first and dbg.counterfactual is cf
    assert np.array_equal(cf.original_expert_ids, before_ids)
    max_abs, kl = logit_divergence(before_logits, ref.logits())
    assert np.array_equal(cf.max_abs, max_abs) and np.array_equal(cf.kl, kl)
    assert not cf.routing_changed[:first].any() and cf.routing_changed[first].any()


def test_a_routing_that_decides_the_same_recomputes_nothing(model: Model) -> None:
    """Stable routing at epsilon 0 ranks as top-k does: no decision changes, nothing is
    computed again, and the run's settings say stable routing from now on."""
    dbg = finished(model, RunSettings(PROMPT, 6))
    before = np.array(dbg.record.expert_ids)
    assert dbg.set_routing("stable", 0.0) is None
    assert np.array_equal(dbg.record.expert_ids, before)
    assert dbg.settings.routing == "stable" and dbg.settings.epsilon == 0.0


@pytest.mark.parametrize("routing", ["soft", "cached"])
def test_soft_and_cached_routing_are_refused_and_change_nothing(model: Model, routing: str) -> None:
    dbg = finished(model, RunSettings(PROMPT, 6))
    with pytest.raises(ColibriValueError, match="routing changes only among"):
        dbg.set_routing(routing)
    assert dbg.settings.routing == "topk"


def test_a_position_in_progress_is_refused(model: Model) -> None:
    dbg = Debugger(model, RunSettings(PROMPT, 6))
    dbg.step_layer()
    with pytest.raises(ValueError, match="in progress"):
        dbg.set_routing("gumbel")
    assert dbg.settings.routing == "topk"


def test_a_saved_session_reopens_with_the_routing_it_ended_with(model: Model,
                                                                tmp_path: Path) -> None:
    dbg = finished(model, RunSettings(PROMPT, 6, seed=4))
    dbg.set_routing("gumbel")
    path = tmp_path / "routed.colibri-session"
    save_session(path, dbg)
    loaded = load_session(path)
    assert loaded.settings.routing == "gumbel"
    ref = finished(model, loaded.settings)
    assert ref.record.equals(dbg.record, timings=False)
