"""Event list derivations (margin, ULPs, routing changes) and navigation."""

from __future__ import annotations

import numpy as np

from colibri.debugging import Debugger, RunSettings, float32_ulp_distance
from colibri.debugging.events import derive, ulps_or_none
from colibri.engine import Model

from dbg_helpers import PROMPT, reference_run


def test_ulp_distance_on_crafted_values() -> None:
    one = np.float32(1.0)
    up = np.nextafter(one, np.float32(2))
    assert float32_ulp_distance(up, one) == 1
    assert float32_ulp_distance(one, up) == -1
    assert float32_ulp_distance(np.float32(2.0), one) == 2**23  # one binade of float32
    assert float32_ulp_distance(np.float32(0.0), np.float32(-0.0)) == 0
    tiny = np.nextafter(np.float32(0), np.float32(1))
    assert float32_ulp_distance(tiny, -tiny) == 2  # across zero: -tiny, 0, +tiny
    assert float32_ulp_distance(np.float32(np.inf), np.finfo(np.float32).max) == 1
    assert ulps_or_none(int(float32_ulp_distance(np.float32(np.nan), one))) is None


def _derive(ids: np.ndarray, logits: np.ndarray, hidden: np.ndarray, finite: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """derive() for a rule that selects on the logits themselves, with no group limit."""
    P, M, _ = logits.shape
    return derive(ids, logits, logits, np.zeros((P, M, 0), np.int32), hidden, finite, k)


def test_margin_on_crafted_logits() -> None:
    one = np.float32(1.0)
    up = np.nextafter(one, np.float32(2))
    # 1 position, 2 MoE layers, 4 experts, top-2
    logits = np.array([[[3.0, up, one, -1.0], [0.5, 2.0, 2.0, -3.0]]], np.float32)
    ids = np.array([[[0, 1], [1, 2]]], np.int32)
    margin, ulps, nonfinite = _derive(ids, logits, np.ones((1, 2), np.float32),
                                      np.ones(1, bool), 2)
    assert margin[0, 0] == np.float32(up - one) and ulps[0, 0] == 1
    assert margin[0, 1] == np.float32(1.5) and ulps[0, 1] > 0
    assert not nonfinite.any()
    # stable/gumbel can choose a lower-logit expert: negative margin
    margin, ulps, _ = _derive(np.array([[[0, 2]]], np.int32), logits[:, :1], np.ones((1, 1)),
                              np.ones(1, bool), 2)
    assert margin[0, 0] == np.float32(one - up) and ulps[0, 0] == -1
    # soft routing (every slot filled) measures at the model's k
    soft_ids = np.array([[[0, 1, 2, 3]]], np.int32)
    margin, ulps, _ = _derive(soft_ids, logits[:, :1], np.ones((1, 1)), np.ones(1, bool), 2)
    assert ulps[0, 0] == 1
    # NaN in logits, in the hidden norm, or in the output logits (blames the last layer)
    bad = logits.copy()
    bad[0, 0, 3] = np.nan
    _, _, nonfinite = _derive(ids, bad, np.array([[1.0, np.inf]], np.float32),
                              np.zeros(1, bool), 2)
    assert nonfinite.tolist() == [[True, True]]
    _, _, nonfinite = _derive(ids, logits, np.ones((1, 2), np.float32), np.zeros(1, bool), 2)
    assert nonfinite.tolist() == [[False, True]]


def test_margin_is_taken_on_the_selection_scores_not_the_logits() -> None:
    """A DeepSeek-V3-style decision: the logits are far apart, the selection scores (sigmoid +
    correction bias) one ULP apart; the margin is the one ULP."""
    logits = np.array([[[2.0, 0.0, -4.0]]], np.float32)
    chosen = np.float32(0.75)
    selection = np.array([[[chosen, np.nextafter(chosen, np.float32(0)), 0.1]]], np.float32)
    ids = np.array([[[0]]], np.int32)
    margin, ulps, _ = derive(ids, logits, selection, np.zeros((1, 1, 0), np.int32),
                             np.ones((1, 1), np.float32), np.ones(1, bool), 1)
    assert ulps[0, 0] == 1 and margin[0, 0] > 0


def test_routing_change_find_and_bookmarks(model: Model) -> None:
    ref, _ = reference_run(model, PROMPT, 8)
    dbg = Debugger(model, RunSettings(PROMPT, 8))
    dbg.run()
    ev = dbg.events
    M = ref.moe_layers.size
    sets = np.sort(ref.expert_ids, axis=2)
    changed = np.zeros(sets.shape[:2], bool)
    changed[1:] = (sets[1:] != sets[:-1]).any(axis=2)
    assert np.array_equal(ev.routing_changed, changed)

    flat = np.flatnonzero(changed.reshape(-1))
    assert ev.next_change(None).index == flat[0]
    assert ev.next_change(int(flat[0])).index == flat[1]
    assert ev.previous_change(int(flat[1])).index == flat[0]
    assert ev.previous_change(int(flat[0])) is None
    only1 = np.flatnonzero(changed[:, 1])
    assert ev.next_change(None, moe_index=1).key == (int(only1[0]), 1)

    expert = int(ref.expert_ids[3, 1, 1])
    hits = np.argwhere((ref.expert_ids == expert).any(axis=2))
    assert ev.find(expert=expert).key == tuple(int(x) for x in hits[0])
    assert ev.find(expert=expert, start=int(hits[0][0]) * M + int(hits[0][1])).key == \
        tuple(int(x) for x in hits[1])
    assert ev.find(token="SAT").key == (2, 0)  # case-insensitive substring of the piece
    assert ev.find(token="sat", start=ev.index_of(2, 0)).key == (2, 1)
    assert ev.find(position=4, layer=int(ref.moe_layers[1])).key == (4, 1)
    assert ev.find(token="sat", start=ev.index_of(2, 1), backward=True).key == (2, 0)
    assert ev.find(expert=99) is None

    assert ev.toggle_bookmark(5) and ev.toggle_bookmark(2)
    assert ev.sorted_bookmarks() == [2, 5]
    assert ev.next_bookmark(2).index == 5 and ev.previous_bookmark(5).index == 2
    assert not ev.toggle_bookmark(2) and ev.sorted_bookmarks() == [5]
    assert dbg.go_to(7).index == 7 and dbg.cursor == 7
