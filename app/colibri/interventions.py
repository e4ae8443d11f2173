"""Interventions: edits of routing decisions, as values and as the spec strings users type.

    force:pos=5,layer=2,experts=1+4     the choice at (5, 2) is experts 1 and 4, weighted by the rule
    forbid:pos=5-9,layer=2,experts=3    expert 3 may not be chosen there; the rule picks among the rest
    weights:pos=5,layer=2,values=0.9+0.1   the first chosen slots' combine weights
    logits:pos=5,layer=2,expert=3,add=1.5  (or set=X) the router logit the rule reads
    bias:layer=0,expert=2,add=0.5       (or set=X) the correction bias (zeros where a layer has none)
    ablate:layer=1,expert=3             expert 3 removed from layer 1 (never chosen), at every position
    swap:layer=1,experts=2+5            a slot choosing 2 runs 5's weights and the other way round

`pos` is one position (`5`), a range (`5-9`) or a start (`5-`, to the end); without it a kind
acts at every position (ablate takes none). `layer` is a model layer index of a MoE layer;
without it every MoE layer. `expert=3` and `experts=3+4` mean the same. docs/interventions.md
states what each kind does and the order they act in at one decision.

Only the grammar is judged here (kinds, keys, numbers, which keys a kind needs): whether an expert
or a layer exists, counts against top-k, finite values are the engine's to judge
(`col_session_set_interventions`), and `Session.set_interventions` names the spec in its error.
Pure Python: the CLI, saved sessions and the debugger share these values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# col_intervention_kind, in enum order
KINDS: tuple[str, ...] = ("force", "forbid", "weights", "logits", "bias", "ablate", "swap")
OPS: tuple[str, ...] = ("add", "set")   # col_intervention_op

# keys each kind takes (pos and layer aside), and the ones it needs
_OPERANDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "force": (frozenset({"experts"}), frozenset({"experts"})),
    "forbid": (frozenset({"experts"}), frozenset({"experts"})),
    "ablate": (frozenset({"experts"}), frozenset({"experts"})),
    "swap": (frozenset({"experts"}), frozenset({"experts"})),
    "weights": (frozenset({"values"}), frozenset({"values"})),
    "logits": (frozenset({"experts", "add", "set"}), frozenset({"experts"})),
    "bias": (frozenset({"experts", "add", "set"}), frozenset({"experts"})),
}
_ALIASES = {"expert": "experts", "weights": "values", "position": "pos"}


class InterventionError(ValueError):
    """A spec that does not parse: the message names the spec and the field."""


@dataclass(frozen=True)
class Intervention:
    """One intervention: `kind` (one of KINDS), its experts and values, `op` ('add' or 'set')
    for logits and bias, positions first..last (None: to the end) and a MoE layer (None: every
    MoE layer). `Intervention.parse(spec)` reads the CLI grammar; `spec` writes it back."""

    kind: str
    experts: tuple[int, ...] = ()
    values: tuple[float, ...] = ()
    op: str = ""
    first: int = 0
    last: int | None = None
    layer: int | None = None
    text: str = field(default="", compare=False)   # the spec as the user typed it, if parsed

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InterventionError(f"unknown intervention kind {self.kind!r}; expected one of "
                                    f"{', '.join(KINDS)}")
        object.__setattr__(self, "experts", tuple(int(e) for e in self.experts))
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        if self.kind in ("logits", "bias") and self.op not in OPS:
            raise InterventionError(f"{self.kind} needs op 'add' or 'set', got {self.op!r}")

    # -- the grammar ----------------------------------------------------------------------------

    @classmethod
    def parse(cls, spec: str) -> Intervention:
        """Read `KIND:key=value,...`; raises InterventionError naming the bad field."""
        text = spec.strip()
        kind, colon, rest = text.partition(":")
        kind = kind.strip().lower()

        def bad(field: str, why: str) -> InterventionError:
            return InterventionError(f"intervention {spec!r}: {field}: {why}")

        if kind not in KINDS:
            raise bad("kind", f"{kind!r} is not one of {', '.join(KINDS)}")
        if not colon or not rest.strip():
            raise bad("kind", f"{kind} needs its fields after a colon, e.g. {_EXAMPLES[kind]}")
        fields: dict[str, str] = {}
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = _ALIASES.get(key.strip().lower(), key.strip().lower())
            if not eq or not key or not value.strip():
                raise bad(key or item.strip() or "fields", f"expected key=value, got {item.strip()!r}")
            if key in fields:
                raise bad(key, "given twice")
            fields[key] = value.strip()
        takes, needs = _OPERANDS[kind]
        allowed = takes | {"layer"} | (set() if kind == "ablate" else {"pos"})
        for key in fields:
            if key not in allowed:
                why = ("ablate removes an expert at every position; forbid:pos=... forbids it at "
                       "some" if (kind, key) == ("ablate", "pos") else
                       f"{kind} takes {', '.join(sorted(allowed))}")
                raise bad(key, why)
        for key in sorted(needs - fields.keys()):
            raise bad(key, f"missing (e.g. {_EXAMPLES[kind]})")
        op, values = "", ()
        if kind in ("logits", "bias"):
            given = [k for k in OPS if k in fields]
            if len(given) != 1:
                raise bad("add/set", f"{kind} takes exactly one of add=X or set=X")
            op = given[0]
            values = (_number(fields[op], bad(op, f"{fields[op]!r} is not a number")),)
        elif "values" in fields:
            values = tuple(_number(v, bad("values", f"{v!r} is not a number"))
                           for v in fields["values"].split("+"))
        experts = ()
        if "experts" in fields:
            experts = tuple(_integer(e, bad("experts", f"{e!r} is not an expert id"))
                            for e in fields["experts"].split("+"))
        layer = None
        if "layer" in fields:
            layer = _integer(fields["layer"], bad("layer", f"{fields['layer']!r} is not a layer "
                                                           f"index"))
        first, last = 0, None
        if "pos" in fields:
            first, last = _positions(fields["pos"], bad("pos", f"{fields['pos']!r} is not N, A-B "
                                                               f"or A-"))
        return cls(kind, experts, values, op, first, last, layer, text)

    @property
    def spec(self) -> str:
        """The spec string in its canonical spelling (`parse(x.spec) == x`)."""
        parts = []
        if self.first != 0 or self.last is not None:
            parts.append("pos=" + (str(self.first) if self.last == self.first else
                                   f"{self.first}-{'' if self.last is None else self.last}"))
        if self.layer is not None:
            parts.append(f"layer={self.layer}")
        if self.experts:
            parts.append("experts=" + "+".join(map(str, self.experts)))
        if self.kind in ("logits", "bias"):
            parts.append(f"{self.op}={_fmt(self.values[0])}")
        elif self.values:
            parts.append("values=" + "+".join(_fmt(v) for v in self.values))
        return f"{self.kind}:{','.join(parts)}"

    def __str__(self) -> str:
        return self.spec

    @property
    def typed(self) -> str:
        """The spec as the user typed it (the canonical one when it was not parsed)."""
        return self.text or self.spec

    # -- what it means --------------------------------------------------------------------------

    def acts_at(self, position: int, layer: int) -> bool:
        """Whether it is in scope at (position, model layer)."""
        return (position >= self.first and (self.last is None or position <= self.last)
                and (self.layer is None or self.layer == layer))

    def where(self) -> str:
        if self.last is None:
            pos = "every position" if self.first == 0 else f"positions {self.first}-"
        else:
            pos = f"position {self.first}" if self.last == self.first else \
                f"positions {self.first}-{self.last}"
        layer = "every MoE layer" if self.layer is None else f"layer {self.layer}"
        return f"{pos}, {layer}"

    def describe(self) -> str:
        """One line in words."""
        ids = ", ".join(map(str, self.experts))
        what = {
            "force": f"force experts {ids}",
            "forbid": f"forbid expert{'s' if len(self.experts) > 1 else ''} {ids}",
            "weights": "weights " + ", ".join(_fmt(v) for v in self.values),
            "ablate": f"ablate expert{'s' if len(self.experts) > 1 else ''} {ids}",
            "swap": f"swap experts {ids}",
        }.get(self.kind)
        if what is None:
            noun = "router logit" if self.kind == "logits" else "correction bias"
            verb = "+" if self.op == "add" else "="
            what = f"{noun} of expert{'s' if len(self.experts) > 1 else ''} {ids} {verb} " \
                   f"{_fmt(self.values[0])}"
        return f"{what} at {self.where()}"


_EXAMPLES = {
    "force": "force:pos=5,layer=2,experts=1+4", "forbid": "forbid:pos=5,layer=2,experts=3",
    "weights": "weights:pos=5,layer=2,values=0.9+0.1",
    "logits": "logits:pos=5,layer=2,expert=3,add=1.5", "bias": "bias:layer=0,expert=2,add=0.5",
    "ablate": "ablate:layer=1,expert=3", "swap": "swap:layer=1,experts=2+5"}


def _fmt(value: float) -> str:
    return repr(float(value)).removesuffix(".0") if math.isfinite(value) else repr(value)


def _integer(text: str, error: InterventionError) -> int:
    text = text.strip()
    if not text.isdigit():
        raise error
    return int(text)


def _number(text: str, error: InterventionError) -> float:
    try:
        return float(text)
    except ValueError:
        raise error from None


def _positions(text: str, error: InterventionError) -> tuple[int, int | None]:
    first, dash, last = text.partition("-")
    start = _integer(first, error)
    if not dash:
        return start, start
    return start, (_integer(last, error) if last.strip() else None)


def parse_all(specs: Iterable[str]) -> tuple[Intervention, ...]:
    return tuple(Intervention.parse(s) for s in specs)


def first_position(interventions: Sequence[Intervention]) -> int | None:
    """The earliest position any of them acts at (None for none): a run's results before it do
    not depend on them."""
    return min((i.first for i in interventions), default=None)


def changed_from(old: Sequence[Intervention], new: Sequence[Intervention]) -> int | None:
    """The earliest position whose results can differ between runs under `old` and under `new`
    (None when both lists act the same): the first position of every intervention in one list
    and not the other, or of all of them when their order changed (order matters where two act on
    one decision)."""
    if list(old) == list(new):
        return None
    common = set(old) & set(new)
    if [i for i in old if i in common] != [i for i in new if i in common]:
        return first_position([*old, *new])
    return first_position([i for i in (*old, *new) if i not in common])


__all__ = ["KINDS", "OPS", "Intervention", "InterventionError", "changed_from", "first_position",
           "parse_all"]
