"""The anatomy of one routing decision: every expert's numbers through its layer's rule.

For an `Event` (one position, one MoE layer) and the model it ran on, per expert:

  logit      the router logit, router bias included                         the trace
  score      the rule's score: each logit's sigmoid, or a softmax over all  the engine's router
             (docs/format.md, "The routing rule", step 1)                   (col_routing_scores)
  bias       the correction bias added for the choice only                  the file's tensor
  selection  the selection score, what the choice ranks (score + bias, ...) the trace
  group      the expert's group (-1 without a group limit); kept or not      the trace's kept groups
  rank       its slot in the choice, 1 = best (0: not chosen)               the trace
  weight     its combine weight (NaN: not chosen)                           the trace
  fresh      under cached routing, its slot in the fresh top-k (0: not in)  the trace
  cache      with an expert cache, whether it was resident (chosen only)    the trace

and whether the correction bias changed the outcome (the trace's bias_changed: ranked without
the bias, the same rule chooses another set). Nothing here re-runs the rule: the scores are the
one step the trace does not keep, and the engine computes them. Without the model (a served
request, a session recorded on another file) scores and bias are unknown (None).

Qt-free: the debugger's token view shows an `Anatomy`; tests read it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from colibri.debugging.events import Event

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model, RoutingInfo


@dataclass(frozen=True)
class Anatomy:
    """One decision, expert by expert (see the module docstring). Arrays are [n_experts]."""

    rule: str                    # the rule in the engine's words ("" without the model)
    logits: np.ndarray           # float32
    scores: np.ndarray | None    # float32; None without the model
    bias: np.ndarray | None      # float32 correction bias; None when the rule has none (or no model)
    selection: np.ndarray        # float32
    group: np.ndarray            # int32, -1 without a group limit
    group_kept: np.ndarray       # bool: the expert's group was kept (all True without groups)
    rank: np.ndarray             # int32, 1..k for the chosen, 0 otherwise
    weight: np.ndarray           # float32, NaN for the unchosen
    bias_changed: bool
    fresh_rank: np.ndarray | None = None  # int32, 1..k in the fresh top-k; None: no cached routing
    resident: np.ndarray | None = None    # int8, 1 hit / 0 miss for the chosen, -1 for the rest;
                                          # None without an expert cache
    cache_kept: bool = False              # cached routing kept the previous experts

    @property
    def n_experts(self) -> int:
        return int(self.logits.size)

    @property
    def has_groups(self) -> bool:
        return bool((self.group >= 0).any())

    @property
    def selection_is_logit(self) -> bool:
        """The rule ranks the logits themselves (a softmax without a correction bias, or a rule
        that selects on logits): the selection column repeats the logit column."""
        return bool(np.array_equal(self.selection, self.logits, equal_nan=True))


class RuleBook:
    """The rules of one open model's MoE layers, for anatomies of its events. Holds each MoE
    layer's RoutingInfo, its wording and a copy of its correction bias ([n_experts] floats)."""

    def __init__(self, model: Model) -> None:
        self._rules: dict[int, RoutingInfo] = {}
        self._words: dict[int, str] = {}
        self._bias: dict[int, np.ndarray] = {}
        for layer in range(model.hparams.n_layers):
            info = model.routing(layer)
            if info.kind != "moe":
                continue
            self._rules[layer] = info
            self._words[layer] = info.describe()
            if info.correction_bias_tensor is not None:
                name = model.tensors[info.correction_bias_tensor].name
                self._bias[layer] = np.array(model.tensor(name), dtype=np.float32)

    def rule(self, layer: int) -> RoutingInfo:
        return self._rules[layer]

    def of(self, event: Event) -> Anatomy:
        return anatomy(event, self)

    def _parts(self, layer: int, logits: np.ndarray
               ) -> tuple[str, np.ndarray, np.ndarray | None, int]:
        info = self._rules[layer]
        return self._words[layer], info.scores(logits), self._bias.get(layer), info.n_groups


def anatomy(event: Event, rules: RuleBook | None = None) -> Anatomy:
    """The anatomy of `event`; scores, bias and the rule's words need `rules` (the model's)."""
    logits = np.asarray(event.router_logits, dtype=np.float32)
    n = logits.size
    words, scores, bias, n_groups = "", None, None, 1
    if rules is not None:
        words, scores, bias, n_groups = rules._parts(event.layer, logits)
    kept_groups = [g for g in event.chosen_groups if g >= 0]
    if n_groups > 1 and n % n_groups == 0:  # without the model the group size is unknown
        group = (np.arange(n) // (n // n_groups)).astype(np.int32)
        # soft routing keeps no group (-1s): every expert was eligible
        group_kept = np.isin(group, kept_groups) if kept_groups else np.ones(n, bool)
    else:
        group = np.full(n, -1, np.int32)
        group_kept = np.ones(n, bool)
    rank = np.zeros(n, np.int32)
    weight = np.full(n, np.nan, np.float32)
    for slot, (expert, w) in enumerate(zip(event.expert_ids, event.expert_weights)):
        rank[expert] = slot + 1
        weight[expert] = w
    fresh_rank = resident = None
    if event.fresh_ids:
        fresh_rank = np.zeros(n, np.int32)
        for slot, expert in enumerate(event.fresh_ids):
            fresh_rank[expert] = slot + 1
    if event.cache_hits:
        resident = np.full(n, -1, np.int8)
        for expert, hit in zip(event.expert_ids, event.cache_hits):
            resident[expert] = int(hit)
    return Anatomy(words, logits, scores, bias, np.asarray(event.selection_scores, np.float32),
                   group, group_kept, rank, weight, bool(event.bias_changed), fresh_rank,
                   resident, bool(event.cache_kept))


__all__ = ["Anatomy", "RuleBook", "anatomy"]
