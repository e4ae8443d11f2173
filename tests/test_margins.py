"""colibri.margins: how close a routing decision was to going another way, on the selection
scores and, with a group limit, on the groups (docs/format.md, "The routing rule")."""

from __future__ import annotations

import numpy as np

from colibri.margins import (NO_ULPS, GroupLimit, decisive_pair, selection_margins,
                             ulp_distance)

TOP2_SUM = GroupLimit(n_groups=2, n_groups_kept=1, group_score=2)


def test_ulp_distance_counts_representable_floats() -> None:
    one = np.float32(1.0)
    assert ulp_distance(np.nextafter(one, np.float32(2)), one) == 1
    assert ulp_distance(np.float32(0.0), np.float32(-0.0)) == 0
    assert ulp_distance(np.float32(np.nan), one) == NO_ULPS


def test_without_groups_the_margin_is_last_chosen_minus_best_unchosen() -> None:
    sel = np.array([[[0.9, 0.5, 0.7, 0.1]]], np.float32)
    a, b = decisive_pair(sel, np.array([[[0, 2]]], np.int32), None, [GroupLimit()], 2)
    assert (a[0, 0], b[0, 0]) == (np.float32(0.7), np.float32(0.5))


def test_an_expert_of_a_dropped_group_does_not_count() -> None:
    """Group 1 (experts 2, 3) was kept; expert 0 scores higher than the chosen but its group was
    dropped by a wide group gap, so the expert gap inside group 1 decides."""
    sel = np.array([[[0.95, 0.0, 0.6, 0.55]]], np.float32)
    ids = np.array([[[2]]], np.int32)
    groups = np.array([[[1]]], np.int32)
    margin, ulps = selection_margins(sel, ids, groups, [TOP2_SUM], 1)
    assert margin[0, 0] == np.float32(0.6) - np.float32(0.55)
    assert ulps[0, 0] > 0


def test_a_closer_group_gap_decides() -> None:
    """The kept group's top-2 sum (0.5 + 0.5) beats the best dropped one's (the float just below
    1 + 0) by one ULP: that is the decision's margin, though no eligible expert was left out."""
    below_one = np.nextafter(np.float32(1), np.float32(0))
    sel = np.array([[[below_one, 0.0, 0.5, 0.5, 0.0, 0.0]]], np.float32)
    limit = GroupLimit(n_groups=3, n_groups_kept=1, group_score=2)
    ids = np.array([[[2, 3]]], np.int32)
    groups = np.array([[[1]]], np.int32)
    a, b = decisive_pair(sel, ids, groups, [limit], 2)
    assert (a[0, 0], b[0, 0]) == (np.float32(1.0), below_one)
    assert ulp_distance(a[0, 0], b[0, 0]) == 1


def test_soft_routing_is_measured_at_the_models_k() -> None:
    sel = np.array([[[0.9, 0.5, 0.7, 0.1]]], np.float32)
    every = np.array([[[0, 2, 1, 3]]], np.int32)
    margin, _ = selection_margins(sel, every, None, [GroupLimit()], 2)
    assert margin[0, 0] == np.float32(0.7) - np.float32(0.5)
