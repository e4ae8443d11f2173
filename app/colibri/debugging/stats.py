"""Aggregates over a RoutingRecord for the routing map and latency views (no Qt, no routing math).

Routing:
  * `RoutingMatrix`     - positions x MoE layers: top-1 expert (the heatmap), with the full top-k
                          ids and weights for hover text.
  * `expert_load`       - [moe_layers, n_experts] how often each expert was chosen (any rank).
  * `load_balance`      - per layer, max load / mean load: 1.0 is perfectly even, n_experts / k
                          means one expert took every token it could. The coefficient of
                          variation (std / mean of the loads) is given alongside.
  * `co_selection`      - [moe_layers, n_experts, n_experts] positions where experts i and j were
                          both chosen (the diagonal is the load).
  * `cache_summary`     - expert caching over the record, one MoE layer or all: the LRU's hits
                          and lookups, and the decisions cached routing kept.
Latency (`LatencySeries`):
  * per position: engine time (token_ns) and per-layer phases; percentiles p50/p95/p99 of token
    time over the last `window` positions (all when None), and tokens per second
    = positions / summed time over that window (engine time, or wall time seen from Python).
  * the prompt apart: its positions were computed in pieces whose time each position shares
    evenly, so they are a prefill's rate (`prompt_tokens_per_second`), and the windows above
    leave them out once a generated position exists (given `prompt_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from colibri.debugging.run import PHASES, RoutingRecord


@dataclass(frozen=True, eq=False)
class RoutingMatrix:
    top1: np.ndarray           # [positions, moe_layers] int32, -1 when nothing was chosen
    expert_ids: np.ndarray     # [positions, moe_layers, k] int32
    expert_weights: np.ndarray  # [positions, moe_layers, k] float32
    moe_layers: np.ndarray     # [moe_layers] int32 model layer index
    token_texts: tuple[str, ...]
    n_experts: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.top1.shape[0]), int(self.top1.shape[1]))

    def hover(self, position: int, moe_index: int) -> str:
        ids = self.expert_ids[position, moe_index]
        weights = self.expert_weights[position, moe_index]
        parts = [f"{int(e)}:{float(w):.3f}" for e, w in zip(ids, weights) if e >= 0]
        return (f"pos {position} {self.token_texts[position]!r} layer "
                f"{int(self.moe_layers[moe_index])}: " + " ".join(parts))


def routing_matrix(record: RoutingRecord) -> RoutingMatrix:
    ids = record.expert_ids
    top1 = ids[:, :, 0] if ids.shape[2] else np.full(ids.shape[:2], -1, np.int32)
    return RoutingMatrix(np.array(top1, dtype=np.int32), ids, record.expert_weights,
                         record.moe_layers, tuple(record.token_texts), record.n_experts)


def expert_load(record: RoutingRecord, positions: slice | None = None) -> np.ndarray:
    """[moe_layers, n_experts] int64: times each expert was among the chosen."""
    ids = record.expert_ids[positions if positions is not None else slice(None)]
    M, E = record.n_moe_layers, record.n_experts
    load = np.zeros((M, E), np.int64)
    for m in range(M):
        col = ids[:, m, :].reshape(-1)
        load[m] = np.bincount(col[col >= 0], minlength=E)[:E]
    return load


def load_balance(load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per layer (max / mean, coefficient of variation) of an expert_load matrix; NaN for a
    layer with no tokens."""
    load = np.asarray(load, dtype=np.float64)
    mean = load.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(mean > 0, load.max(axis=1) / mean, np.nan)
        cv = np.where(mean > 0, load.std(axis=1) / mean, np.nan)
    return ratio, cv


def co_selection(record: RoutingRecord) -> np.ndarray:
    """[moe_layers, n_experts, n_experts] int64 symmetric co-selection counts."""
    ids = record.expert_ids
    P, M, E = ids.shape[0], record.n_moe_layers, record.n_experts
    onehot = np.zeros((P, M, E), np.int64)
    p, m, s = np.nonzero(ids >= 0)
    onehot[p, m, ids[p, m, s]] = 1
    return np.einsum("pmi,pmj->mij", onehot, onehot)


@dataclass(frozen=True)
class CacheSummary:
    """Expert caching over a record's positions: LRU hits of `lookups` (both 0 without an
    expert cache), and the routing decisions cached routing kept of `decisions`."""

    lru: bool
    hits: int
    lookups: int
    cached: bool
    kept: int
    decisions: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else float("nan")

    def describe(self) -> str:
        """One line: the hit rate and the kept decisions ('' without expert caching)."""
        parts = []
        if self.lru:
            rate = f"{100 * self.hit_rate:.1f} %" if self.lookups else "-"
            parts.append(f"expert cache: {rate} hits ({self.hits}/{self.lookups})")
        if self.cached:
            parts.append(f"cached routing kept {self.kept} of {self.decisions}")
        return "   ".join(parts)


def cache_summary(record: RoutingRecord, moe_index: int | None = None) -> CacheSummary:
    """Expert caching at one MoE layer (all when None) over every position of the record."""
    cols = slice(None) if moe_index is None else slice(moe_index, moe_index + 1)
    ids = record.expert_ids[:, cols]
    hits = record.cache_hits[:, cols]
    looked = ids[..., :hits.shape[2]] >= 0
    kept = record.cache_kept[:, cols]
    return CacheSummary(record.k_hits > 0, int(hits[looked].sum()), int(looked.sum()),
                        record.k_fresh > 0, int(kept.sum()), int(kept.size))


def tokens_by_expert(record: RoutingRecord, moe_index: int) -> list[tuple[str, int]]:
    """The text of each position with its top-1 expert at one MoE layer (prompt colouring)."""
    ids = record.expert_ids
    return [(record.token_text(p), int(ids[p, moe_index, 0])) for p in range(len(record))]


class LatencySeries:
    """Timing views over a record (nanoseconds). With `prompt_positions`, the percentiles and
    windowed rates are of the positions after the prompt (of the prompt's until one exists)."""

    def __init__(self, record: RoutingRecord, prompt_positions: int = 0) -> None:
        self.record = record
        self.prompt_positions = max(int(prompt_positions), 0)

    @property
    def decode_start(self) -> int:
        """The first position the windows look at: after the prompt once one was generated."""
        return self.prompt_positions if self.record.n_positions > self.prompt_positions else 0

    @property
    def token_ns(self) -> np.ndarray:
        return self.record.token_ns

    def phase(self, name: str) -> np.ndarray:
        """[positions, n_layers] durations of one phase ('attention', ..., 'layer')."""
        return self.record.phase_ns[:, :, PHASES.index(name)]

    def per_layer_phases(self, position: int) -> np.ndarray:
        """[n_layers, 4] attention, router, experts, combine of one position."""
        return self.record.phase_ns[position, :, :4]

    def percentiles(self, window: int | None = None,
                    q: tuple[float, ...] = (50, 95, 99)) -> dict[str, float]:
        t = self._window(self.token_ns[self.decode_start:], window).astype(np.float64)
        if not t.size:
            return {f"p{int(x)}": float("nan") for x in q}
        values = np.percentile(t, q)
        return {f"p{int(x)}": float(v) for x, v in zip(q, values)}

    def rolling_percentiles(self, window: int, q: tuple[float, ...] = (50, 95, 99)
                            ) -> np.ndarray:
        """[positions, len(q)] percentiles of token time over the `window` positions ending at
        each position (the live timeline's bands)."""
        t = self.token_ns.astype(np.float64)
        window = max(int(window), 1)
        out = np.full((t.size, len(q)), np.nan)
        for i in range(min(window - 1, t.size)):  # the first, shorter windows
            out[i] = np.percentile(t[:i + 1], q)
        if t.size >= window:
            full = np.lib.stride_tricks.sliding_window_view(t, window)
            out[window - 1:] = np.percentile(full, q, axis=1).T
        return out

    def tokens_per_second(self, window: int | None = None, wall: bool = False) -> float:
        times = self.record.wall_ns if wall else self.token_ns
        return self._rate(self._window(times[self.decode_start:], window))

    def prompt_tokens_per_second(self, wall: bool = False) -> float:
        """The prompt's positions (those computed) over their summed time: the prefill's rate."""
        times = self.record.wall_ns if wall else self.token_ns
        return self._rate(times[:self.prompt_positions])

    @staticmethod
    def _rate(t: np.ndarray) -> float:
        total = float(t.astype(np.float64).sum())
        return t.size * 1e9 / total if total > 0 else float("nan")

    @staticmethod
    def _window(a: np.ndarray, window: int | None) -> np.ndarray:
        return a if window is None else a[max(a.size - window, 0):]


__all__ = ["CacheSummary", "LatencySeries", "RoutingMatrix", "cache_summary", "co_selection",
           "expert_load", "load_balance", "routing_matrix", "tokens_by_expert"]
