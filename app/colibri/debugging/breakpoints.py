"""Breakpoints on routing events: what to stop at, checked against the event list only.

Kinds (each a frozen dataclass with an `enabled` flag; `toggled()` returns the flipped copy):
  * ExpertChosen(expert, layer=None) - `expert` is among the chosen at model layer `layer`
                                       (any MoE layer when None).
  * MarginBelow(threshold, layer=None) - the top-k margin (see events.py) is below `threshold`;
                                       a NaN margin never hits.
  * NonFinite()                      - NaN or Inf in the router logits, the hidden-state norm or
                                       the position's output logits.
  * AtPosition(position)             - the first event of `position` (its first MoE layer).
  * BiasChanged(layer=None)          - the layer's correction bias changed the choice: the same
                                       ranking of the scores without it chose another set
                                       (DeepSeek-V3's e_score_correction_bias, ERNIE's moe_statics).
  * CacheKept(layer=None)            - cached routing kept the previous position's experts over a
                                       different fresh top-k.
  * CacheMiss(layer=None)            - a chosen expert was not resident in the layer's expert
                                       cache (the LRU had to load it).

`first_hit(breakpoints, events, start)` scans vectorised over the whole list and returns the first
event after index `start` that any enabled breakpoint hits, so run-to-breakpoint lands on exactly
that (position, layer) even when the engine computed the whole position.

Actions (`action`, every kind): 'stop' (the default) stops the run at the hit; 'forbid' does not
stop: at the hit decision it forbids the breakpoint's expert (ExpertChosen's, CacheMiss's first
missed expert; the decision's first choice for the other kinds) and the run goes on, the hit's position computed again
("when expert 3 is chosen at layer 1, forbid it and continue"; Debugger.run).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from colibri.debugging.events import Event, EventList
from colibri.interventions import Intervention

ACTIONS = ("stop", "forbid")


@dataclass(frozen=True)
class Breakpoint(ABC):
    kind: ClassVar[str] = ""
    enabled: bool = field(default=True, kw_only=True)
    action: str = field(default="stop", kw_only=True)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown breakpoint action {self.action!r}; expected one of "
                             f"{', '.join(ACTIONS)}")

    def intervention(self, event: Event) -> Intervention:
        """What the 'forbid' action adds at a hit: the expert this breakpoint is about (the
        decision's first choice for kinds about no expert), forbidden at that decision only."""
        return Intervention("forbid", (self._expert(event),), first=event.position,
                            last=event.position, layer=event.layer)

    def _expert(self, event: Event) -> int:
        return event.top1

    def describe_action(self) -> str:
        return "" if self.action == "stop" else \
            ", then forbid " + ("it" if self._about_expert() else "its first choice") + \
            " and continue"

    def _about_expert(self) -> bool:
        return False

    @abstractmethod
    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        """[positions first.., moe_layers] bool: the events this breakpoint hits."""

    def hits(self, event: Event, events: EventList) -> bool:
        return bool(self.mask(events, event.position)[0, event.moe_index])

    def first_hit(self, events: EventList, start: int | None = None) -> Event | None:
        """The first event after index `start` this breakpoint hits (ignores `enabled`)."""
        found = first_hit([replace(self, enabled=True)], events, start)
        return found[0] if found else None

    def toggled(self) -> Breakpoint:
        return replace(self, enabled=not self.enabled)

    @abstractmethod
    def describe(self) -> str:
        """One line for the breakpoint list."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Breakpoint:
        values = dict(data)
        kind = values.pop("kind")
        cls = KINDS.get(kind)
        if cls is None:
            raise ValueError(f"unknown breakpoint kind {kind!r}; expected one of "
                             f"{', '.join(KINDS)}")
        return cls(**values)


def _layer_columns(events: EventList, layer: int | None) -> np.ndarray:
    layers = np.asarray(events.record.moe_layers)
    return np.ones(layers.shape, bool) if layer is None else layers == int(layer)


@dataclass(frozen=True)
class ExpertChosen(Breakpoint):
    kind: ClassVar[str] = "expert_chosen"
    expert: int = 0
    layer: int | None = None

    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        ids = events.record.expert_ids[first:events.n_positions]
        return (ids == self.expert).any(axis=2) & _layer_columns(events, self.layer)[None, :]

    def _expert(self, event: Event) -> int:
        return self.expert

    def _about_expert(self) -> bool:
        return True

    def describe(self) -> str:
        where = "any layer" if self.layer is None else f"layer {self.layer}"
        return f"expert {self.expert} chosen at {where}{self.describe_action()}"


@dataclass(frozen=True)
class MarginBelow(Breakpoint):
    kind: ClassVar[str] = "margin_below"
    threshold: float = 0.0
    layer: int | None = None

    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            below = events.margins[first:] < np.float32(self.threshold)
        return below & _layer_columns(events, self.layer)[None, :]

    def describe(self) -> str:
        where = "" if self.layer is None else f" at layer {self.layer}"
        return f"top-k margin < {self.threshold:g}{where}{self.describe_action()}"


@dataclass(frozen=True)
class NonFinite(Breakpoint):
    kind: ClassVar[str] = "nonfinite"

    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        return np.array(events.nonfinite[first:])

    def describe(self) -> str:
        return f"NaN or Inf in router logits, hidden state or logits{self.describe_action()}"


@dataclass(frozen=True)
class AtPosition(Breakpoint):
    kind: ClassVar[str] = "at_position"
    position: int = 0

    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        mask = np.zeros((max(events.n_positions - first, 0), events.n_moe_layers), bool)
        if first <= self.position < events.n_positions and events.n_moe_layers:
            mask[self.position - first, 0] = True
        return mask

    def describe(self) -> str:
        return f"position {self.position}{self.describe_action()}"


@dataclass(frozen=True)
class BiasChanged(Breakpoint):
    kind: ClassVar[str] = "bias_changed"
    layer: int | None = None

    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        changed = events.record.bias_changed[first:events.n_positions]
        return np.array(changed) & _layer_columns(events, self.layer)[None, :]

    def describe(self) -> str:
        where = "any MoE layer" if self.layer is None else f"layer {self.layer}"
        return f"the correction bias changed the choice at {where}{self.describe_action()}"


@dataclass(frozen=True)
class CacheKept(Breakpoint):
    kind: ClassVar[str] = "cache_kept"
    layer: int | None = None

    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        kept = events.record.cache_kept[first:events.n_positions]
        return np.array(kept) & _layer_columns(events, self.layer)[None, :]

    def describe(self) -> str:
        where = "any MoE layer" if self.layer is None else f"layer {self.layer}"
        return f"cached routing kept the previous experts at {where}{self.describe_action()}"


@dataclass(frozen=True)
class CacheMiss(Breakpoint):
    kind: ClassVar[str] = "cache_miss"
    layer: int | None = None

    def mask(self, events: EventList, first: int = 0) -> np.ndarray:
        rec = events.record
        hits = rec.cache_hits[first:events.n_positions]
        if not hits.shape[2]:  # no expert cache: nothing misses
            return np.zeros(hits.shape[:2], bool)
        looked = rec.expert_ids[first:events.n_positions] >= 0
        return (looked & ~hits).any(axis=2) & _layer_columns(events, self.layer)[None, :]

    def describe(self) -> str:
        where = "any MoE layer" if self.layer is None else f"layer {self.layer}"
        return f"an expert missed the expert cache at {where}{self.describe_action()}"

    def _expert(self, event: Event) -> int:  # the first chosen expert that missed
        return next((e for e, hit in zip(event.expert_ids, event.cache_hits) if not hit),
                    event.top1)

    def _about_expert(self) -> bool:
        return True


KINDS: dict[str, type[Breakpoint]] = {c.kind: c for c in (ExpertChosen, MarginBelow, NonFinite,
                                                            AtPosition, BiasChanged, CacheKept,
                                                            CacheMiss)}


def first_hit(breakpoints: Iterator[Breakpoint] | list[Breakpoint] | BreakpointList,
              events: EventList, start: int | None = None
              ) -> tuple[Event, Breakpoint] | None:
    """The first event after index `start` (from the beginning when None) that an enabled
    breakpoint hits, with the first breakpoint (in list order) that hits it."""
    enabled = [b for b in breakpoints if b.enabled]
    if not enabled or len(events) == 0:
        return None
    begin = 0 if start is None else start + 1
    if begin >= len(events):
        return None
    first_position = begin // events.n_moe_layers  # only the rows that can still hit
    offset = first_position * events.n_moe_layers
    masks = [b.mask(events, first_position).reshape(-1) for b in enabled]
    hits = np.flatnonzero(np.logical_or.reduce(masks)[begin - offset:])
    if not hits.size:
        return None
    local = begin - offset + int(hits[0])
    which = next(b for b, m in zip(enabled, masks) if m[local])
    return events[offset + local], which


class BreakpointList:
    """An ordered, editable list of breakpoints (the breakpoints panel's model)."""

    def __init__(self, items: list[Breakpoint] | None = None) -> None:
        self._items: list[Breakpoint] = list(items or [])

    def __iter__(self) -> Iterator[Breakpoint]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> Breakpoint:
        return self._items[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BreakpointList) and self._items == other._items

    def add(self, bp: Breakpoint) -> int:
        self._items.append(bp)
        return len(self._items) - 1

    def remove(self, i: int) -> None:
        del self._items[i]

    def toggle(self, i: int) -> Breakpoint:
        self._items[i] = self._items[i].toggled()
        return self._items[i]

    def clear(self) -> None:
        self._items.clear()

    def first_hit(self, events: EventList, start: int | None = None
                  ) -> tuple[Event, Breakpoint] | None:
        return first_hit(self._items, events, start)

    def to_list(self) -> list[dict[str, Any]]:
        return [b.to_dict() for b in self._items]

    @classmethod
    def from_list(cls, data: list[dict[str, Any]]) -> BreakpointList:
        return cls([Breakpoint.from_dict(d) for d in data])
