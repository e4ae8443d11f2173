"""The event list: one event per (position, MoE layer) routing decision, in execution order.

Event index = position * n_moe_layers + moe_index, so the list is the debugger's navigation spine
(RenderDoc's event browser): go to an event, find, bookmarks, next/previous routing change.

Derived fields are computed once per position from the engine's trace (vectorised over layers),
never by re-running the router:
  * margin      - how close the decision was to going another way, on the *selection scores*
                  (the values the rule ranks: the logits for a softmax without a correction bias,
                  sigmoid + bias for DeepSeek-V3, ...): the lowest chosen minus the highest
                  unchosen eligible selection score, or with a group limit the kept/dropped group
                  gap when that is smaller (colibri.margins). Under stable or Gumbel routing it can
                  be negative; in soft routing it is taken at the model's n_experts_active. NaN
                  when undefined (k >= n_experts, NaN scores).
  * margin_ulps - the same gap counted in float32 ULPs: the number of representable float32
                  values stepped over going from the smaller to the larger value (signed like the
                  margin), from the integer ordering of IEEE-754 bit patterns. None when NaN.
  * routing_changed - the *set* of chosen experts differs from the previous position's at the
                  same layer (position 0 never counts as a change).
  * nonfinite   - NaN or Inf in this event's router logits or hidden-state norm; non-finite
                  output logits of a position flag its last MoE layer's event (they are
                  computed after every layer).
  * intervened  - the bits (1 << k, k indexing colibri.interventions.KINDS) of the intervention
                  kinds that acted on the decision, from the engine's trace; 0 for none.
Expert caching's fields are the engine's, copied as they are: whether cached routing kept the
previous position's experts over a different fresh top-k (`cache_kept`, with `cache_margin` and
the fresh set `fresh_ids`), and which chosen experts the layer's LRU had resident (`cache_hits`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from colibri.interventions import KINDS
from colibri.margins import NO_ULPS, GroupLimit, selection_margins
from colibri.margins import ulp_distance as float32_ulp_distance

if TYPE_CHECKING:  # pragma: no cover
    from colibri.debugging.run import RoutingRecord


def ulps_or_none(value: int) -> int | None:
    return None if value == NO_ULPS else int(value)


@dataclass(frozen=True)
class Event:
    """One routing decision, (position, moe_index). `layer` is the model layer index. Arrays are
    read-only views of the routing record (never copied, never modified)."""

    index: int
    position: int
    moe_index: int
    layer: int
    token: int
    token_text: str
    expert_ids: tuple[int, ...]        # chosen experts in selection order (no empty slots)
    expert_weights: tuple[float, ...]  # their combination weights
    margin: float
    margin_ulps: int | None
    routing_changed: bool
    hidden_norm: float                 # L2 norm of the hidden state arriving at the router
    shared_gate: float                 # NaN when the family has no shared-expert gate
    nonfinite: bool
    router_logits: np.ndarray = field(compare=False, repr=False)  # [n_experts] float32
    selection_scores: np.ndarray = field(compare=False, repr=False)  # [n_experts] float32
    chosen_groups: tuple[int, ...] = ()  # kept groups, best first (empty without a group limit)
    bias_changed: bool = False  # the correction bias changed the choice (the scores alone chose another set)
    intervened: int = 0         # bits of the intervention kinds that acted (colibri.interventions.KINDS)
    cache_kept: bool = False    # cached routing kept the previous position's experts
    # the fresh top-k's margin over them (NaN: no cached routing, or position 0); not compared,
    # as NaN never equals itself (cache_kept and fresh_ids say what it decided)
    cache_margin: float = field(default=float("nan"), compare=False)
    fresh_ids: tuple[int, ...] = ()     # the fresh top-k under cached routing (empty otherwise)
    cache_hits: tuple[bool, ...] = ()   # per chosen expert: resident in the LRU (empty without one)

    @property
    def top1(self) -> int:
        return self.expert_ids[0] if self.expert_ids else -1

    @property
    def key(self) -> tuple[int, int]:
        return (self.position, self.moe_index)

    def label(self) -> str:
        return f"#{self.index} pos {self.position} {self.token_text!r} layer {self.layer}"

    @property
    def intervention_kinds(self) -> tuple[str, ...]:
        """Names of the intervention kinds that acted on this decision."""
        return tuple(k for i, k in enumerate(KINDS) if self.intervened >> i & 1)


def derive(expert_ids: np.ndarray, router_logits: np.ndarray, selection_scores: np.ndarray,
           chosen_groups: np.ndarray, hidden_norm: np.ndarray, logits_finite: np.ndarray,
           k_active: int, limits: Sequence[GroupLimit] | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Margin, margin in ULPs and non-finite flags for rows [P, M] from ids [P, M, k], router
    logits and selection scores [P, M, E], kept groups [P, M, g], hidden norms [P, M], per-position
    output-logit finiteness [P] and each MoE layer's group limit (None: no groups)."""
    P, M, E = router_logits.shape
    logits = router_logits.astype(np.float32, copy=False)
    limits = list(limits) if limits is not None else [GroupLimit()] * M
    margin, ulps = selection_margins(selection_scores, expert_ids, chosen_groups, limits, k_active)
    nonfinite = (~np.isfinite(logits).all(axis=2)) | (~np.isfinite(hidden_norm))
    if M:  # the output logits come after the last layer: blame its event
        nonfinite[:, M - 1] |= ~logits_finite.astype(bool)
    return margin, ulps, nonfinite


class EventList:
    """Every (position, MoE layer) event of a routing record, with navigation. Grows with the
    record (`sync()`); derived fields are computed once per position."""

    def __init__(self, record: RoutingRecord, k_active: int,
                 limits: Sequence[GroupLimit] | None = None) -> None:
        self._record = record
        self._k_active = int(k_active)
        self._limits = list(limits) if limits is not None else [GroupLimit()] * record.n_moe_layers
        self._n_moe = int(record.n_moe_layers)
        self._n_positions = 0
        self._rows = 0  # allocated rows of the derived arrays (grown by doubling)
        self._margin = np.zeros((0, self._n_moe), np.float32)
        self._ulps = np.zeros((0, self._n_moe), np.int64)
        self._nonfinite = np.zeros((0, self._n_moe), bool)
        self._changed = np.zeros((0, self._n_moe), bool)
        self.bookmarks: set[int] = set()
        self.sync()

    # -- growth ---------------------------------------------------------------------------------

    @property
    def record(self) -> RoutingRecord:
        return self._record

    @property
    def n_moe_layers(self) -> int:
        return self._n_moe

    @property
    def n_positions(self) -> int:
        return self._n_positions

    def sync(self) -> range:
        """Derive the fields of positions added to the record since the last call; returns the
        indices of the new events (`[self[i] for i in ...]` builds them)."""
        rec = self._record
        start, stop = self._n_positions, rec.n_positions
        if stop <= start:
            return range(0)
        ids = rec.expert_ids[start:stop]
        margin, ulps, nonfinite = derive(ids, rec.router_logits[start:stop],
                                         rec.selection_scores[start:stop],
                                         rec.chosen_groups[start:stop],
                                         rec.hidden_norm[start:stop],
                                         rec.logits_finite[start:stop], self._k_active,
                                         self._limits)
        all_ids = rec.expert_ids[max(start - 1, 0):stop]
        sets = np.sort(np.where(all_ids >= 0, all_ids, np.iinfo(np.int32).max), axis=2)
        changed = np.zeros((stop - start, self._n_moe), bool)
        if start > 0:
            changed[:] = (sets[1:] != sets[:-1]).any(axis=2)
        elif stop > 1:
            changed[1:] = (sets[1:] != sets[:-1]).any(axis=2)
        if stop > self._rows:
            rows = max(stop, 2 * self._rows, 64)

            def grown(a: np.ndarray) -> np.ndarray:
                out = np.zeros((rows, self._n_moe), a.dtype)
                out[:start] = a[:start]
                return out

            self._margin, self._ulps = grown(self._margin), grown(self._ulps)
            self._nonfinite, self._changed = grown(self._nonfinite), grown(self._changed)
            self._rows = rows
        self._margin[start:stop] = margin
        self._ulps[start:stop] = ulps
        self._nonfinite[start:stop] = nonfinite
        self._changed[start:stop] = changed
        self._n_positions = stop
        return range(start * self._n_moe, stop * self._n_moe)

    def truncate(self, n_positions: int) -> None:
        """Keep the events of the first `n_positions` positions (after the record was truncated
        to them); derived rows are copied, so snapshots taken before keep theirs."""
        n = min(n_positions, self._n_positions)
        self._margin, self._ulps = self._margin[:n].copy(), self._ulps[:n].copy()
        self._nonfinite, self._changed = self._nonfinite[:n].copy(), self._changed[:n].copy()
        self._rows = n
        self._n_positions = n

    def snapshot(self, record: RoutingRecord | None = None) -> EventList:
        """An event list frozen at the current length, sharing the derived arrays (rows once
        derived never change), over `record` (default: a snapshot of this list's record). For
        handing to another thread."""
        snap = EventList.__new__(EventList)
        snap.__dict__.update(self.__dict__)
        snap._record = record if record is not None else self._record.snapshot()
        snap._rows = 0  # a later sync() on the snapshot reallocates instead of writing shared rows
        snap.bookmarks = set(self.bookmarks)
        return snap

    # -- access ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n_positions * self._n_moe

    def __iter__(self) -> Iterable[Event]:
        return (self[i] for i in range(len(self)))

    def index_of(self, position: int, moe_index: int) -> int:
        if not (0 <= position < self._n_positions and 0 <= moe_index < self._n_moe):
            raise IndexError(f"no event at position {position}, MoE layer {moe_index}")
        return position * self._n_moe + moe_index

    def __getitem__(self, index: int) -> Event:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"event {index} outside [0, {n})")
        p, m = divmod(index, self._n_moe)
        rec = self._record
        ids = rec.expert_ids[p, m]
        keep = ids >= 0
        return Event(
            index=index, position=p, moe_index=m, layer=int(rec.moe_layers[m]),
            token=int(rec.tokens[p]), token_text=rec.token_text(p),
            expert_ids=tuple(int(e) for e in ids[keep]),
            expert_weights=tuple(float(w) for w in rec.expert_weights[p, m][keep]),
            margin=float(self._margin[p, m]), margin_ulps=ulps_or_none(int(self._ulps[p, m])),
            routing_changed=bool(self._changed[p, m]), hidden_norm=float(rec.hidden_norm[p, m]),
            shared_gate=float(rec.shared_gate[p, m]), nonfinite=bool(self._nonfinite[p, m]),
            router_logits=rec.router_logits[p, m], selection_scores=rec.selection_scores[p, m],
            chosen_groups=tuple(int(g) for g in rec.chosen_groups[p, m] if g >= 0),
            bias_changed=bool(rec.bias_changed[p, m]), intervened=int(rec.intervened[p, m]),
            cache_kept=bool(rec.cache_kept[p, m]), cache_margin=float(rec.cache_margin[p, m]),
            fresh_ids=tuple(int(e) for e in rec.fresh_ids[p, m] if e >= 0),
            cache_hits=tuple(bool(h) for h in rec.cache_hits[p, m][keep[:rec.k_hits]]))

    def position_events(self, position: int) -> list[Event]:
        return [self[position * self._n_moe + m] for m in range(self._n_moe)]

    # Whole-list derived arrays [positions, moe_layers] (read-only views) for views and breakpoints.
    @property
    def margins(self) -> np.ndarray:
        return _ro(self._margin[:self._n_positions])

    @property
    def margin_ulps(self) -> np.ndarray:
        return _ro(self._ulps[:self._n_positions])

    @property
    def nonfinite(self) -> np.ndarray:
        return _ro(self._nonfinite[:self._n_positions])

    @property
    def routing_changed(self) -> np.ndarray:
        return _ro(self._changed[:self._n_positions])

    # -- navigation -----------------------------------------------------------------------------

    def _scan(self, mask: np.ndarray, start: int | None, backward: bool) -> Event | None:
        """The first event after `start` (before it when backward) where the flat mask is True;
        start None scans from the beginning (or the end)."""
        flat = np.asarray(mask).reshape(-1)[:len(self)]
        if backward:
            stop = len(self) if start is None else max(min(start, len(self)), 0)
            hits = np.flatnonzero(flat[:stop])
            return self[int(hits[-1])] if hits.size else None
        begin = 0 if start is None else start + 1
        hits = np.flatnonzero(flat[begin:])
        return self[begin + int(hits[0])] if hits.size else None

    def match_mask(self, expert: int | None = None, token: str | None = None,
                   position: int | None = None, layer: int | None = None) -> np.ndarray:
        """[positions, moe_layers] bool: events matching every given criterion. `expert` = the
        expert is among the chosen; `token` = case-insensitive substring of the token text;
        `layer` = model layer index."""
        P, M, rec = self._n_positions, self._n_moe, self._record
        mask = np.ones((P, M), bool)
        if expert is not None:
            mask &= (rec.expert_ids[:P] == int(expert)).any(axis=2)
        if token is not None:
            needle = token.lower()
            hit = np.array([needle in rec.token_text(p).lower() for p in range(P)], bool)
            mask &= hit[:, None]
        if position is not None:
            rows = np.zeros(P, bool)
            if 0 <= position < P:
                rows[position] = True
            mask &= rows[:, None]
        if layer is not None:
            mask &= (np.asarray(rec.moe_layers) == int(layer))[None, :]
        return mask

    def find(self, expert: int | None = None, token: str | None = None,
             position: int | None = None, layer: int | None = None, start: int | None = None,
             backward: bool = False) -> Event | None:
        """The next (previous when backward) event after (before) index `start` that matches."""
        return self._scan(self.match_mask(expert, token, position, layer), start, backward)

    def next_change(self, start: int | None, moe_index: int | None = None) -> Event | None:
        """The next event after `start` whose routing differs from the previous position's (at
        one MoE layer when moe_index is given)."""
        return self._scan(self._change_mask(moe_index), start, backward=False)

    def previous_change(self, start: int | None, moe_index: int | None = None) -> Event | None:
        return self._scan(self._change_mask(moe_index), start, backward=True)

    def _change_mask(self, moe_index: int | None) -> np.ndarray:
        mask = self._changed[:self._n_positions].copy()
        if moe_index is not None:
            keep = np.zeros(self._n_moe, bool)
            keep[moe_index] = True
            mask &= keep[None, :]
        return mask

    # -- bookmarks ------------------------------------------------------------------------------

    def toggle_bookmark(self, index: int) -> bool:
        """Add or remove a bookmark; returns whether it is now set."""
        if index in self.bookmarks:
            self.bookmarks.discard(index)
            return False
        self[index]  # raises IndexError for an event that does not exist
        self.bookmarks.add(index)
        return True

    def sorted_bookmarks(self) -> list[int]:
        return sorted(self.bookmarks)

    def next_bookmark(self, start: int | None) -> Event | None:
        # a bookmark beyond the events (a recomputation that ended early) waits for them
        after = [b for b in sorted(self.bookmarks) if b < len(self) and (start is None or b > start)]
        return self[after[0]] if after else None

    def previous_bookmark(self, start: int | None) -> Event | None:
        before = [b for b in sorted(self.bookmarks) if b < len(self) and (start is None or b < start)]
        return self[before[-1]] if before else None


def _ro(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def filter_events(events: Iterable[Event], predicate: Callable[[Event], bool]) -> list[Event]:
    return [e for e in events if predicate(e)]
