"""A run under interventions beside the same run without them: what the edit changed.

`Counterfactual.between(original, changed)` compares two `RunImage`s of one prompt and settings
(the run as it was, and the run again from the first position the interventions can change,
the KV cache before it reused): per position the token processed next in each, the expert sets
of every MoE layer, the largest |logit difference| and KL(original || counterfactual) of the
output distributions. Cells where the counterfactual's own interventions acted are told apart
from the routing that changed downstream of them. Positions compared: those both runs computed;
before the first position the change could affect both runs are one (the KV cache and logits
reused), so their differences are zero without being computed, and an image need not keep those
logits (`RunImage.logits_from`): a change near the end of a long run costs what it recomputes.

`rerun(generation, interventions)` is the command line's way to make one: it takes a finished
`Generation` kept with its logits, rewinds it to the first position the interventions act at and
runs it again under them (the debugger does the same, position by position, in
`Debugger.set_interventions`). Qt-free; numbers come from the engine's traces and logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.interventions import Intervention, changed_from, parse_all
from colibri.jitter.analysis import logit_divergence

if TYPE_CHECKING:  # pragma: no cover
    from colibri.generation import Generation


@dataclass(frozen=True, eq=False)
class RunImage:
    """What a comparison needs of one run: the token sequence (prompt, then generated), logits
    [positions - logits_from, vocab] of the positions from `logits_from`, expert ids
    [positions, moe_layers, k] in selection order, the interventions' bits [positions,
    moe_layers] (Trace.intervened) and the interventions."""

    tokens: tuple[int, ...]
    logits: np.ndarray
    expert_ids: np.ndarray
    intervened: np.ndarray
    moe_layers: tuple[int, ...]
    interventions: tuple[Intervention, ...] = ()
    logits_from: int = 0

    @property
    def n_positions(self) -> int:
        return self.logits_from + int(self.logits.shape[0])

    @classmethod
    def of_generation(cls, generation: Generation, logits_from: int = 0) -> RunImage:
        """The image of a generation kept with its logits (keep_logits=True) on a traced session,
        its logits from position `logits_from` on (copied)."""
        trace = generation.session.trace
        if trace is None or generation.logits is None:
            raise ValueError("a counterfactual needs a traced session and the run's logits")
        n = generation.positions
        return cls(tuple(generation.tokens), logit_rows(generation, logits_from, n),
                   np.array(trace.expert_ids[:n]), np.array(trace.intervened[:n]),
                   tuple(int(layer) for layer in trace.moe_layers), generation.session.interventions,
                   logits_from)


def logit_rows(generation: Generation, first: int, stop: int) -> np.ndarray:
    """A copy of the kept logits of positions [first, stop) (float32 [stop - first, vocab]),
    copying only those rows."""
    parts, count = [], 0
    for rows in generation.logits or []:
        lo, hi = max(first - count, 0), min(stop - count, rows.shape[0])
        if lo < hi:
            parts.append(rows[lo:hi])
        count += rows.shape[0]
    if not parts:
        return np.zeros((0, generation.session.model.hparams.vocab_size), np.float32)
    return np.concatenate(parts).astype(np.float32, copy=False)


@dataclass(frozen=True, eq=False)
class Counterfactual:
    """The comparison, position by position (P = positions both runs computed)."""

    interventions: tuple[Intervention, ...]            # the counterfactual's
    original_interventions: tuple[Intervention, ...]   # the original's
    from_position: int             # the first position the change could affect
    n_prompt: int
    moe_layers: tuple[int, ...]    # the model layer of each MoE layer
    original_tokens: tuple[int, ...]   # prompt + generated
    tokens: tuple[int, ...]
    original_expert_ids: np.ndarray    # [P, moe_layers, k]
    expert_ids: np.ndarray             # [P, moe_layers, k]
    intervened: np.ndarray             # [P, moe_layers] uint8, the counterfactual's
    max_abs: np.ndarray                # [P] float64 max |logit difference|
    kl: np.ndarray                     # [P] float64 KL(original || counterfactual)

    @classmethod
    def between(cls, original: RunImage, changed: RunImage, from_position: int,
                n_prompt: int) -> Counterfactual:
        """Compare two images of one run whose positions before `from_position` are the same
        (each image's logits start at or before it)."""
        if from_position < max(original.logits_from, changed.logits_from):
            raise ValueError(f"the images keep logits from positions {original.logits_from} and "
                             f"{changed.logits_from}, after the change's first, {from_position}")
        P = min(original.n_positions, changed.n_positions)
        max_abs, kl = np.zeros(P), np.zeros(P)
        if from_position < P:
            max_abs[from_position:], kl[from_position:] = logit_divergence(
                original.logits[from_position - original.logits_from:P - original.logits_from],
                changed.logits[from_position - changed.logits_from:P - changed.logits_from])
        return cls(changed.interventions, original.interventions, int(from_position),
                   int(n_prompt), changed.moe_layers, tuple(original.tokens), tuple(changed.tokens),
                   np.array(original.expert_ids[:P], np.int32),
                   np.array(changed.expert_ids[:P], np.int32),
                   np.array(changed.intervened[:P], np.uint8), max_abs, kl)

    # -- derived --------------------------------------------------------------------------------

    @property
    def n_positions(self) -> int:
        return int(self.kl.shape[0])

    @property
    def routing_changed(self) -> np.ndarray:
        """[P, moe_layers] bool: the chosen expert sets differ (order ignored)."""
        empty = np.iinfo(np.int32).max  # empty slots (-1) sort last in both
        a = np.sort(np.where(self.original_expert_ids >= 0, self.original_expert_ids, empty), -1)
        b = np.sort(np.where(self.expert_ids >= 0, self.expert_ids, empty), -1)
        return (a != b).any(axis=-1)

    @property
    def downstream(self) -> np.ndarray:
        """[P, moe_layers] bool: routing that changed where no intervention acted."""
        return self.routing_changed & (self.intervened == 0)

    def next_tokens(self, original: bool = False) -> list[int | None]:
        """The token each position was followed by (its next input, or the last generated
        token); None past the run's end."""
        seq = self.original_tokens if original else self.tokens
        return [seq[p + 1] if p + 1 < len(seq) else None for p in range(self.n_positions)]

    @property
    def token_changed(self) -> np.ndarray:
        """[P] bool: the next token differs."""
        a, b = self.next_tokens(True), self.next_tokens(False)
        return np.array([x != y for x, y in zip(a, b)], bool)

    @property
    def first_token_change(self) -> int | None:
        hits = np.flatnonzero(self.token_changed)
        return int(hits[0]) if hits.size else None

    @property
    def first_routing_change(self) -> tuple[int, int] | None:
        """(position, MoE index) of the first decision whose set differs."""
        hits = np.argwhere(self.routing_changed)
        return (int(hits[0][0]), int(hits[0][1])) if hits.size else None

    def summary(self) -> dict[str, Any]:
        changed = self.routing_changed
        acted = self.intervened != 0
        return {"from_position": self.from_position, "positions": self.n_positions,
                "decisions": int(changed.size), "routing_changed": int(changed.sum()),
                "intervened": int(acted.sum()), "intervened_changed": int((changed & acted).sum()),
                "downstream_changed": int(self.downstream.sum()),
                "first_token_change": self.first_token_change,
                "first_routing_change": self.first_routing_change,
                "max_abs_max": float(self.max_abs.max()) if self.max_abs.size else 0.0,
                "kl_max": float(self.kl.max()) if self.kl.size else 0.0,
                "tokens_changed": int(self.token_changed.sum())}

    # -- JSON (saved with debugging sessions) -----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"interventions": [i.spec for i in self.interventions],
                "original_interventions": [i.spec for i in self.original_interventions],
                "from_position": self.from_position, "n_prompt": self.n_prompt,
                "moe_layers": list(self.moe_layers), "k": int(self.expert_ids.shape[2]),
                "original_tokens": list(self.original_tokens), "tokens": list(self.tokens),
                "original_expert_ids": self.original_expert_ids.tolist(),
                "expert_ids": self.expert_ids.tolist(), "intervened": self.intervened.tolist(),
                "max_abs": self.max_abs.tolist(), "kl": self.kl.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Counterfactual:
        P, M, k = len(d["kl"]), len(d["moe_layers"]), int(d["k"])
        return cls(parse_all(d["interventions"]), parse_all(d["original_interventions"]),
                   int(d["from_position"]), int(d["n_prompt"]),
                   tuple(int(x) for x in d["moe_layers"]), tuple(d["original_tokens"]),
                   tuple(d["tokens"]),
                   np.array(d["original_expert_ids"], np.int32).reshape(P, M, k),
                   np.array(d["expert_ids"], np.int32).reshape(P, M, k),
                   np.array(d["intervened"], np.uint8).reshape(P, M),
                   np.array(d["max_abs"], np.float64), np.array(d["kl"], np.float64))


def rerun(generation: Generation, interventions: Sequence[Intervention]) -> Counterfactual | None:
    """Run `generation` (finished, kept with its logits, on a traced session) again under
    `interventions` from the first position they can change, reusing the KV cache before it;
    returns the comparison with the run as it was, or None when they change none of its
    positions. The generation and its session are left as the counterfactual."""
    session = generation.session
    start = changed_from(session.interventions, interventions)
    original = RunImage.of_generation(generation, min(start or 0, generation.positions))
    session.set_interventions(interventions)   # the engine judges them before anything changes
    if start is None or start >= generation.positions:
        return None
    generation.rewind(start)
    generation.run()
    return Counterfactual.between(original, RunImage.of_generation(generation, start), start,
                                  len(generation.prompt))


__all__ = ["Counterfactual", "RunImage", "rerun"]
