"""Routing decisions as the trace records them: how close each one was to going another way.

A MoE layer chooses its experts by ranking *selection scores* (docs/format.md, "The routing
rule"): the logits themselves for a softmax without a correction bias, sigmoid(logit) +
correction bias for DeepSeek-V3, softmax + bias for ERNIE. A decision flips when two selection
scores swap, so its margin is measured on them, in absolute terms and in float32 ULPs (the
number of representable floats between the two values, which is what a different reduction
order or thread split moves them by). With a group limit a decision can also flip when two
groups swap; its margin is then the smaller of the two gaps:
  * experts: the lowest chosen selection score minus the highest unchosen one among the experts
    of the kept groups (every expert without groups);
  * groups: the lowest kept group score minus the highest dropped one, a group's score being its
    best selection score or the sum of its best two, as the rule says (summed in float32, as
    transformers does).
Under stable or Gumbel routing a margin can be negative (a lower-scored expert was chosen). With
every expert chosen (soft routing) there is no unchosen expert, and the margin is taken at the
model's top-k: the k-th minus the (k+1)-th selection score.

Qt-free and engine-free: plain numpy over trace arrays. The debugger's events, its breakpoints
and the jitter lab all measure margins here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

GROUP_MAX, GROUP_TOP2_SUM = 1, 2  # col_group_score (colibri.h)
NO_ULPS = np.iinfo(np.int64).min  # the ULP distance of a pair with a NaN


class Decisions(Protocol):
    """Routing decisions as a trace holds them (engine.Trace, jitter.Run): expert_ids [P, M, k]
    (-1 = empty slot), selection_scores [P, M, E] float32, chosen_groups [P, M, g] (g 0: no
    groups)."""

    @property
    def expert_ids(self) -> np.ndarray: ...
    @property
    def selection_scores(self) -> np.ndarray: ...
    @property
    def chosen_groups(self) -> np.ndarray: ...


@dataclass(frozen=True)
class GroupLimit:
    """The group limit of one MoE layer's rule (RoutingInfo's n_groups, n_groups_kept,
    group_score); n_groups 1 = none."""

    n_groups: int = 1
    n_groups_kept: int = 1
    group_score: int = 0

    @property
    def active(self) -> bool:
        return self.n_groups > 1


def group_limits(model: Model) -> list[GroupLimit]:
    """The group limit of every MoE layer of `model`, in MoE-layer order."""
    out = []
    for layer in range(model.hparams.n_layers):
        info = model.routing(layer)
        if info.kind == "moe":
            out.append(GroupLimit(info.n_groups, info.n_groups_kept, info.group_score))
    return out


def ordered_keys(values: np.ndarray | float) -> np.ndarray:
    """float32 values -> int64 keys whose order (and differences) follow the float32 number line;
    +0.0 and -0.0 share key 0, adjacent floats differ by 1."""
    arr = np.asarray(values, dtype=np.float32)
    bits = np.ascontiguousarray(arr).view(np.int32).astype(np.int64).reshape(arr.shape)
    return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def ulp_distance(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    """Signed number of float32 ULPs from b up to a (a - b in representable steps), as int64;
    NO_ULPS where either value is NaN."""
    fa = np.asarray(a, dtype=np.float32)
    fb = np.asarray(b, dtype=np.float32)
    out = ordered_keys(fa) - ordered_keys(fb)
    return np.where(np.isnan(fa) | np.isnan(fb), NO_ULPS, out)


def _group_scores(selection: np.ndarray, limit: GroupLimit) -> np.ndarray:
    """[..., n_groups] float32 scores of each group of consecutive experts."""
    grouped = selection.reshape(*selection.shape[:-1], limit.n_groups, -1)
    best = -np.sort(-grouped, axis=-1)
    if limit.group_score == GROUP_TOP2_SUM:
        return (best[..., 0] + best[..., 1]).astype(np.float32)
    return best[..., 0]


def decisive_pair(selection: np.ndarray, expert_ids: np.ndarray, chosen_groups: np.ndarray | None,
                  limits: Sequence[GroupLimit], k_active: int) -> tuple[np.ndarray, np.ndarray]:
    """For decisions [P, M]: the pair (a, b) of float32 values whose gap a - b is the margin
    (module docstring). selection [P, M, E] float32, expert_ids [P, M, k] (-1 = empty slot),
    chosen_groups [P, M, g] (-1 = none; None or g = 0 without groups), limits: one per MoE
    layer. NaN where undefined (no expert chosen, k_active >= E in soft routing)."""
    sel = np.asarray(selection, dtype=np.float32)
    P, M, E = sel.shape
    chosen = np.zeros((P, M, E), dtype=bool)
    p_idx, m_idx, s_idx = np.nonzero(expert_ids >= 0)
    chosen[p_idx, m_idx, expert_ids[p_idx, m_idx, s_idx]] = True
    n_chosen = chosen.sum(axis=2)
    eligible = np.ones((P, M, E), dtype=bool)
    kept = np.zeros((P, M, 0), dtype=bool)
    grouped = [m for m, lim in enumerate(limits) if lim.active]
    if grouped and chosen_groups is not None and chosen_groups.shape[-1]:
        for m in grouped:
            lim = limits[m]
            size = E // lim.n_groups
            keep = np.zeros((P, lim.n_groups), dtype=bool)
            g = chosen_groups[:, m]
            rows, cols = np.nonzero(g >= 0)
            keep[rows, g[rows, cols]] = True
            eligible[:, m] = np.repeat(keep, size, axis=1) | ~keep.any(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        a = np.where(chosen, sel, np.float32(np.inf)).min(axis=2)
        b = np.where(chosen | ~eligible, np.float32(-np.inf), sel).max(axis=2)
    a = a.astype(np.float32)
    b = b.astype(np.float32)
    if grouped and chosen_groups is not None and chosen_groups.shape[-1]:
        for m in grouped:
            lim = limits[m]
            scores = _group_scores(sel[:, m], lim)                       # [P, G]
            g = chosen_groups[:, m]
            keep = np.zeros_like(scores, dtype=bool)
            rows, cols = np.nonzero(g >= 0)
            keep[rows, g[rows, cols]] = True
            decided = keep.any(axis=1) & ~keep.all(axis=1)
            with np.errstate(invalid="ignore"):
                ga = np.where(keep, scores, np.float32(np.inf)).min(axis=1).astype(np.float32)
                gb = np.where(keep, np.float32(-np.inf), scores).max(axis=1).astype(np.float32)
                closer = decided & ((ga - gb) < (a[:, m] - b[:, m]))
            a[:, m] = np.where(closer, ga, a[:, m])
            b[:, m] = np.where(closer, gb, b[:, m])
    every = n_chosen >= E
    if every.any():  # soft routing: measure at the model's k
        if 0 < k_active < E:
            ordered = -np.sort(-sel, axis=2)
            a = np.where(every, ordered[:, :, k_active - 1], a)
            b = np.where(every, ordered[:, :, k_active], b)
        else:
            a = np.where(every, np.float32(np.nan), a)
    a = np.where(n_chosen == 0, np.float32(np.nan), a)
    return a.astype(np.float32), b.astype(np.float32)


def selection_margins(selection: np.ndarray, expert_ids: np.ndarray,
                      chosen_groups: np.ndarray | None, limits: Sequence[GroupLimit],
                      k_active: int) -> tuple[np.ndarray, np.ndarray]:
    """(margin float32 [P, M], margin in ULPs int64 [P, M]) of each decision: decisive_pair's
    a - b, and its ULP distance (NO_ULPS where the margin is not finite)."""
    a, b = decisive_pair(selection, expert_ids, chosen_groups, limits, k_active)
    with np.errstate(invalid="ignore", over="ignore"):
        margin = (a - b).astype(np.float32)
    ulps = np.where(np.isfinite(margin), ulp_distance(a, b), NO_ULPS)
    return margin, ulps


__all__ = ["Decisions", "GroupLimit", "NO_ULPS", "decisive_pair", "group_limits", "ordered_keys",
           "selection_margins", "ulp_distance"]
