"""The jitter remedies side by side: stable top-k, soft routing and expert caching (the source
articles' three), each against plain top-k on the same teacher-forced sequence and the same
numerics variants as the jitter report (colibri.jitter.analysis). Qt-free.

For each remedy R (and plain top-k itself, the first row) the baseline (default numerics) and
every variant run under R:
  * decisions changed: cells whose R-baseline set differs from the plain top-k baseline's (soft
    routing takes every expert, so every cell counts);
  * jitter left: cells where some variant's set differs from the R-baseline's;
  * flips removed: jitter cells of plain top-k that are not jitter cells under R; flips added:
    the reverse (a remedy whose state flows between positions, like cached routing, can move a
    flip rather than remove it);
  * divergence from plain top-k: the R-baseline's downstream against plain top-k's (first
    position with another set, first position with another greedy token, max |logit
    difference| and KL per position: analysis.Downstream);
  * cost and benefit: experts computed per decision (top-k, or every expert in soft routing),
    the hit rate of an LRU of `expert_cache` experts per layer over the R-baseline's decisions
    (not for soft routing, which needs every expert resident), and the decisions cached routing
    kept.
Cached routing runs once per threshold of the list (a row each; its trade-off is the point).
Unless given, the one threshold is twice the largest plain top-k margin (on the selection
score, colibri.margins) of a cell some variant flips, at least the model's default_epsilon
(that alone when nothing flips): a previous set then stays through the near-ties the variants
showed, where it is one of the two sides. Stable top-k's epsilon, unless given: the model's
default_epsilon (the epsilon sweep finds the smallest that removes every flip). The passes run
in colibri.jitter.passes (analyze_remedies).

Reports serialise like the others (schema colibri.remedies/1, sorted keys, no timestamps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colibri.jitter.analysis import (Downstream, LabReport, Run, cells_mask, from_json_floats,
                                     json_floats, json_ints)

SCHEMA_REMEDIES = "colibri.remedies/1"


@dataclass(frozen=True)
class Remedy:
    """One routing setting of the comparison: 'topk' (plain), 'stable', 'soft' or 'cached'."""

    routing: str
    epsilon: float = 0.0
    cache_threshold: float = 0.0

    @property
    def label(self) -> str:
        return {"topk": "plain top-k", "stable": f"stable top-k (eps {self.epsilon:g})",
                "soft": "soft routing",
                "cached": f"cached (threshold {self.cache_threshold:.4g})"}[self.routing]

    def session(self, expert_cache: int) -> dict[str, Any]:
        """Runner.run's routing keywords for this remedy (no LRU under soft routing)."""
        return {"routing": self.routing, "epsilon": self.epsilon,
                "cache_threshold": self.cache_threshold,
                "expert_cache": 0 if self.routing == "soft" else expert_cache}

    def to_dict(self) -> dict[str, Any]:
        return {"routing": self.routing, "epsilon": self.epsilon,
                "cache_threshold": self.cache_threshold}


@dataclass
class RemedyRow:
    remedy: Remedy
    sets: np.ndarray                       # [P][M][k'] the R-baseline's sets, sorted ascending
    jitter_cells: np.ndarray               # [P][M] bool: some variant differs from the R-baseline
    variant_flips: dict[str, int]          # cells each variant flips against the R-baseline
    changed_cells: np.ndarray              # [P][M] bool: the R-baseline differs from plain top-k
    downstream: Downstream                 # R-baseline against plain top-k
    experts_per_decision: int
    hits: int = 0                          # LRU over the R-baseline's decisions (0/0: none)
    lookups: int = 0
    kept: int = 0                          # cached routing: decisions that kept the previous set
    decisions: int = 0

    @property
    def jitter_left(self) -> int:
        return int(self.jitter_cells.sum())

    @property
    def changed(self) -> int:
        return int(self.changed_cells.sum())

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None

    def removed(self, plain_jitter: np.ndarray) -> np.ndarray:
        """[P][M] plain top-k's jitter cells this remedy has none at."""
        return plain_jitter & ~self.jitter_cells

    def added(self, plain_jitter: np.ndarray) -> np.ndarray:
        return self.jitter_cells & ~plain_jitter

    def to_dict(self, plain_jitter: np.ndarray) -> dict[str, Any]:
        return {"remedy": self.remedy.to_dict(), "label": self.remedy.label,
                "sets": json_ints(self.sets), "jitter_left": self.jitter_left,
                "jitter_cells": json_ints(np.argwhere(self.jitter_cells)),
                "variant_flips": dict(self.variant_flips),
                "changed": self.changed, "changed_cells": json_ints(np.argwhere(self.changed_cells)),
                "flips_removed": int(self.removed(plain_jitter).sum()),
                "flips_added": int(self.added(plain_jitter).sum()),
                "downstream": self.downstream.to_dict(),
                "experts_per_decision": self.experts_per_decision,
                "hits": self.hits, "lookups": self.lookups, "hit_rate": self.hit_rate,
                "kept": self.kept, "decisions": self.decisions}

    @classmethod
    def from_dict(cls, d: dict[str, Any], shape: tuple[int, int]) -> RemedyRow:
        r = d["remedy"]
        return cls(Remedy(r["routing"], r["epsilon"], r["cache_threshold"]),
                   np.asarray(d["sets"], dtype=np.int32), cells_mask(d["jitter_cells"], shape),
                   dict(d["variant_flips"]), cells_mask(d["changed_cells"], shape),
                   Downstream.from_dict(d["downstream"]), d["experts_per_decision"], d["hits"],
                   d["lookups"], d["kept"], d["decisions"])


@dataclass
class RemedyReport(LabReport):
    expert_cache: int                      # LRU experts per layer of the hit rates (0: none)
    threshold_rule: str                    # how cached routing's thresholds were chosen
    plain_jitter: np.ndarray               # [P][M] bool
    rows: list[RemedyRow]                  # plain top-k first, then stable, soft, cached
    margin_abs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # plain [P][M]

    @property
    def plain(self) -> RemedyRow:
        return self.rows[0]

    def row(self, routing: str) -> RemedyRow:
        """The first row of a routing ('topk', 'stable', 'soft', 'cached')."""
        return next(r for r in self.rows if r.remedy.routing == routing)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_REMEDIES, **self.run_dict(),
            "expert_cache": self.expert_cache, "threshold_rule": self.threshold_rule,
            "plain_jitter": json_ints(np.argwhere(self.plain_jitter)),
            "margin_abs": json_floats(self.margin_abs),
            "rows": [r.to_dict(self.plain_jitter) for r in self.rows],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RemedyReport:
        if d.get("schema") != SCHEMA_REMEDIES:
            raise ValueError(f"not a remedies report (schema {d.get('schema')!r})")
        shape = (len(d["tokens"]), len(d["moe_layers"]))
        plain = np.zeros(shape, dtype=bool)
        for p, layer in d["plain_jitter"]:
            plain[p, layer] = True
        margin = from_json_floats(d["margin_abs"]).reshape(shape)
        return cls(**cls.run_fields_of(d), expert_cache=d["expert_cache"],
                   threshold_rule=d["threshold_rule"], plain_jitter=plain,
                   rows=[RemedyRow.from_dict(r, shape) for r in d["rows"]], margin_abs=margin)


def default_threshold(margin_abs: np.ndarray, plain_jitter: np.ndarray,
                      default_epsilon: float) -> tuple[float, str]:
    """Cached routing's threshold when none is given (see the module docstring), and the rule
    in words for the report."""
    flipped = margin_abs[plain_jitter & np.isfinite(margin_abs)]
    if not flipped.size:
        return float(default_epsilon), "the model's default_epsilon (no decision flips)"
    largest = float(flipped.max())
    return (max(2.0 * largest, float(default_epsilon)),
            f"2 x the largest margin of a flipped decision ({largest:.4g}), at least the "
            f"model's default_epsilon")


def remedy_row(remedy: Remedy, base: Run, variant_sets: dict[str, np.ndarray], plain: Run,
         n_experts: int) -> RemedyRow:
    jitter = np.zeros(base.sets.shape[:2], dtype=bool)
    flips: dict[str, int] = {}
    for name, sets in variant_sets.items():
        diff = (sets != base.sets).any(axis=-1)
        jitter |= diff
        flips[name] = int(diff.sum())
    if remedy.routing == "soft":
        changed = np.ones(base.sets.shape[:2], dtype=bool)
        per_decision = n_experts
    else:
        changed = (base.sets != plain.sets).any(axis=-1)
        per_decision = int(base.sets.shape[2])
    c = base.cache
    return RemedyRow(remedy, base.sets, jitter, flips, changed, Downstream.between(plain, base),
                     per_decision, c.hits if c else 0, (c.hits + c.misses) if c else 0,
                     c.kept if c and remedy.routing == "cached" else 0,
                     c.decisions if c and remedy.routing == "cached" else 0)


def parse_thresholds(text: str | None) -> list[float] | None:
    """'0.01,0.1' -> sorted unique floats; None or '' = None (the derived threshold). Whether the
    engine takes each one is its to say (Runner.check)."""
    if not text or not text.strip():
        return None
    try:
        out = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"expected comma-separated cache thresholds, got {text!r}") from None
    if not out:
        raise ValueError("empty cache threshold list")
    return out


__all__ = ["SCHEMA_REMEDIES", "Remedy", "RemedyReport", "RemedyRow", "default_threshold",
           "parse_thresholds", "remedy_row"]
