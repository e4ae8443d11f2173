"""The statistics of a profile: accumulated per shard from routing traces, merged across shards.

A *cell* is one (position, MoE layer) routing decision; it selects k experts with combine
weights. Per shard (`ShardAccumulator`, in the worker) and then per profile (`merge`):

  load[m, e]            cells of MoE layer m that selected expert e
  weight_sum[m, e]      sum of e's combine weights over those cells (float64)
  cosel[m, a, b]        cells that selected both a and b (a < b)
  ulp_hist[m, b]        cells by selection margin in ULPs (k-th minus (k+1)-th router logit on the
                        ordered float line, `colibri.jitter.margins`), in `colibri.jitter.ulp_bin`
                        bins shifted by one (0 = no (k+1)-th expert, 1 = a tie, 2 = 1 ULP, ...)
  abs_hist[m, b]        the same margins in absolute value, in the fixed bins of ABS_EDGES
  token (m, e, t)       how often token id t was routed to e at layer m (sparse)
  occurrences[t]        positions holding token id t
  jitter_cells/flips[v, m, b]   on the sampled windows: cells per ULP-margin bin, and those whose
                        selected set under numerics variant v differs from the profile's own
  examples              per (m, e) the EXAMPLES selections with the largest combine weight (ties:
                        earlier window, then earlier position), with the tokens around them

Every quantity is a sum of integers, except weight_sum, whose float64 sums are added shard by
shard in shard order: so any split of the shards among workers, processes or machines gives
the same bits, and a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from colibri.jitter import margins, ulp_bin_label, ulp_bins

EXAMPLES = 16                      # highest-weight selections kept per (layer, expert)
CONTEXT_BEFORE, CONTEXT_AFTER = 16, 6
CONTEXT = CONTEXT_BEFORE + 1 + CONTEXT_AFTER
N_ULP_BINS = 35                    # ulp_bin -1..33, shifted by one
ABS_EDGES = 10.0 ** (np.arange(-36, 13) / 4)   # 1e-9 .. 1e3, four bins a decade
N_ABS_BINS = ABS_EDGES.size + 3    # none, exactly 0, (0, 1e-9), the decades, >= 1e3
_REDUCE_AT = 1 << 22               # pending sparse keys before they are summed


def ulp_bin_index(ulps: np.ndarray) -> np.ndarray:
    """Histogram bin of each ULP margin (see the module docstring)."""
    return ulp_bins(ulps) + 1


def abs_bin_index(margin: np.ndarray) -> np.ndarray:
    m = np.asarray(margin, dtype=np.float64)
    idx = 2 + np.searchsorted(ABS_EDGES, m, side="right")
    return np.where(np.isinf(m), 0, np.where(m == 0, 1, idx)).astype(np.int64)


def ulp_bin_bounds(index: int) -> tuple[str, float, float]:
    """(label, lowest, highest) ULP margin of histogram bin `index`."""
    b = index - 1
    if b < 0:
        return "none", float("nan"), float("nan")
    lo = 0 if b == 0 else 1 << (b - 1)
    return ulp_bin_label(b), float(lo), float(0 if b == 0 else (1 << b) - 1)


def abs_bin_bounds(index: int) -> tuple[str, float, float]:
    """(label, lower edge, upper edge) of absolute-margin bin `index` (upper edge excluded)."""
    if index == 0:
        return "none", float("nan"), float("nan")
    if index == 1:
        return "0", 0.0, 0.0
    if index == 2:
        return f"<{ABS_EDGES[0]:.3g}", 0.0, float(ABS_EDGES[0])
    if index == N_ABS_BINS - 1:
        return f">={ABS_EDGES[-1]:.3g}", float(ABS_EDGES[-1]), float("inf")
    lo, hi = float(ABS_EDGES[index - 3]), float(ABS_EDGES[index - 2])
    return f"{lo:.3g}-{hi:.3g}", lo, hi


def sum_sparse(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equal keys merged, their int64 counts added; keys ascending."""
    if keys.size == 0:
        return keys.astype(np.int64), counts.astype(np.int64)
    order = np.argsort(keys, kind="stable")
    k, c = keys[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    return k[starts], np.add.reduceat(c, starts).astype(np.int64)


def top_examples(me: np.ndarray, weight: np.ndarray, window: np.ndarray, pos: np.ndarray,
                 n: int) -> np.ndarray:
    """Indices of the `n` largest weights of every group `me` (ties: lower window, then lower
    position), grouped by ascending `me`."""
    order = np.lexsort((pos, window, -weight, me))
    grouped = me[order]
    first = np.searchsorted(grouped, grouped, side="left")
    return order[(np.arange(order.size) - first) < n]


@dataclass(frozen=True)
class Shape:
    """What every array of a profile is sized by."""

    n_moe: int          # MoE layers
    n_experts: int
    k: int              # experts per cell (n_experts in soft routing)
    vocab: int
    n_variants: int     # jitter variants


class ShardAccumulator:
    """Statistics of the windows of one shard; `result()` is the shard's partial (a dict of
    numpy arrays, what a worker returns and a shard file holds)."""

    def __init__(self, shape: Shape) -> None:
        M, E, V = shape.n_moe, shape.n_experts, shape.n_variants
        self.shape = shape
        self.load = np.zeros(M * E, dtype=np.int64)
        self.weight_sum = np.zeros(M * E, dtype=np.float64)
        self.cosel = np.zeros(M * E * E, dtype=np.int64)
        self.ulp_hist = np.zeros(M * N_ULP_BINS, dtype=np.int64)
        self.abs_hist = np.zeros(M * N_ABS_BINS, dtype=np.int64)
        self.occurrences = np.zeros(shape.vocab, dtype=np.int64)
        self.jitter_cells = np.zeros((V, M * N_ULP_BINS), dtype=np.int64)
        self.jitter_flips = np.zeros((V, M * N_ULP_BINS), dtype=np.int64)
        self.n_tokens = self.n_windows = self.n_sampled_windows = self.n_sampled_tokens = 0
        self._token_keys: list[np.ndarray] = []     # pending, one selection each
        self._token_sum = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._pending = 0
        self._examples: list[dict[str, np.ndarray]] = []
        self._pending_examples = 0
        self._layer_me = np.arange(M, dtype=np.int64)[None, :, None] * E  # [1, M, 1]
        self._pairs = [(i, j) for i in range(shape.k) for j in range(i + 1, shape.k)]

    def add_window(self, window: int, tokens: np.ndarray, expert_ids: np.ndarray,
                   weights: np.ndarray, router_logits: np.ndarray) -> np.ndarray:
        """Count one window's trace: tokens [P], expert_ids and weights [P, M, k], router logits
        [P, M, E]. Returns the ULP-margin bin of each cell [P, M] (for `add_flips`)."""
        s = self.shape
        P = int(tokens.size)
        E = s.n_experts
        me = (self._layer_me + expert_ids).reshape(-1)                       # [P*M*k]
        self.load += np.bincount(me, minlength=s.n_moe * E)
        self.weight_sum += np.bincount(me, weights=weights.reshape(-1).astype(np.float64),
                                       minlength=s.n_moe * E)
        if s.k < E:
            for i, j in self._pairs:
                a, b = expert_ids[..., i], expert_ids[..., j]
                key = (self._layer_me[..., 0] + np.minimum(a, b)) * E + np.maximum(a, b)
                self.cosel += np.bincount(key.reshape(-1), minlength=s.n_moe * E * E)
        else:  # every cell selects every expert
            self.cosel += P
        margin_abs, margin_ulps = margins(router_logits, s.k)
        ulp_idx = ulp_bin_index(margin_ulps)                                  # [P, M]
        layer_bins = np.arange(s.n_moe, dtype=np.int64)[None, :]
        self.ulp_hist += np.bincount((layer_bins * N_ULP_BINS + ulp_idx).reshape(-1),
                                     minlength=s.n_moe * N_ULP_BINS)
        self.abs_hist += np.bincount((layer_bins * N_ABS_BINS + abs_bin_index(margin_abs))
                                     .reshape(-1), minlength=s.n_moe * N_ABS_BINS)
        self.occurrences += np.bincount(tokens, minlength=s.vocab)
        self._token_keys.append(me * s.vocab + np.repeat(tokens.astype(np.int64), s.n_moe * s.k))
        self._pending += me.size
        if self._pending >= _REDUCE_AT:
            self._reduce_tokens()
        self._add_examples(window, tokens, me, weights.reshape(-1))
        self.n_tokens += P
        self.n_windows += 1
        return ulp_idx

    def add_flips(self, variant: int, flips: np.ndarray, ulp_idx: np.ndarray) -> None:
        """Cells [P, M] of a sampled window and which of them variant `variant` flipped."""
        keys = (np.arange(self.shape.n_moe, dtype=np.int64)[None, :] * N_ULP_BINS + ulp_idx)
        n = self.shape.n_moe * N_ULP_BINS
        self.jitter_cells[variant] += np.bincount(keys.reshape(-1), minlength=n)
        self.jitter_flips[variant] += np.bincount(keys[flips], minlength=n)

    def sampled(self, n_tokens: int) -> None:
        self.n_sampled_windows += 1
        self.n_sampled_tokens += n_tokens

    def _reduce_tokens(self) -> None:
        """Fold the pending keys (one selection each) into the summed (keys, counts)."""
        keys, counts = self._token_sum
        raw = np.concatenate(self._token_keys)
        self._token_sum = sum_sparse(np.concatenate((keys, raw)),
                                     np.concatenate((counts, np.ones(raw.size, np.int64))))
        self._token_keys, self._pending = [], 0

    def _add_examples(self, window: int, tokens: np.ndarray, me: np.ndarray,
                      weights: np.ndarray) -> None:
        s = self.shape
        pos = np.repeat(np.arange(tokens.size, dtype=np.int64), s.n_moe * s.k)
        win = np.full(me.size, window, dtype=np.int64)
        keep = top_examples(me, weights, win, pos, EXAMPLES)
        padded = np.concatenate((np.full(CONTEXT_BEFORE, -1, np.int32), tokens.astype(np.int32),
                                 np.full(CONTEXT_AFTER, -1, np.int32)))
        context = padded[pos[keep][:, None] + np.arange(CONTEXT)[None, :]]
        self._examples.append({"me": me[keep], "weight": weights[keep].astype(np.float32),
                               "window": win[keep], "pos": pos[keep], "context": context})
        self._pending_examples += keep.size
        if self._pending_examples > 8 * s.n_moe * s.n_experts * EXAMPLES:
            self._examples = [reduce_examples(self._examples)]
            self._pending_examples = self._examples[0]["me"].size

    def result(self) -> dict[str, np.ndarray]:
        s = self.shape
        M, E = s.n_moe, s.n_experts
        if self._token_keys:
            self._reduce_tokens()
        token_keys, token_counts = self._token_sum
        ex = reduce_examples(self._examples) if self._examples else empty_examples()
        occ = np.flatnonzero(self.occurrences)
        return {
            "load": self.load.reshape(M, E), "weight_sum": self.weight_sum.reshape(M, E),
            "cosel": self.cosel.reshape(M, E, E),
            "ulp_hist": self.ulp_hist.reshape(M, N_ULP_BINS),
            "abs_hist": self.abs_hist.reshape(M, N_ABS_BINS),
            "jitter_cells": self.jitter_cells.reshape(s.n_variants, M, N_ULP_BINS),
            "jitter_flips": self.jitter_flips.reshape(s.n_variants, M, N_ULP_BINS),
            "token_keys": token_keys, "token_counts": token_counts,
            "occ_ids": occ.astype(np.int64), "occ_counts": self.occurrences[occ],
            **{f"ex_{k}": v for k, v in ex.items()},
            "n_tokens": np.int64(self.n_tokens), "n_windows": np.int64(self.n_windows),
            "n_sampled_windows": np.int64(self.n_sampled_windows),
            "n_sampled_tokens": np.int64(self.n_sampled_tokens),
        }


def empty_examples() -> dict[str, np.ndarray]:
    return {"me": np.zeros(0, np.int64), "weight": np.zeros(0, np.float32),
            "window": np.zeros(0, np.int64), "pos": np.zeros(0, np.int64),
            "context": np.zeros((0, CONTEXT), np.int32)}


def reduce_examples(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The EXAMPLES best selections per (layer, expert) of several candidate sets."""
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    keep = top_examples(cat["me"], cat["weight"], cat["window"], cat["pos"], EXAMPLES)
    return {k: v[keep] for k, v in cat.items()}


# ---------------------------------------------------------------------------------------------
# Merging shards

_SUMMED = ("load", "weight_sum", "cosel", "ulp_hist", "abs_hist", "jitter_cells",
           "jitter_flips", "n_tokens", "n_windows", "n_sampled_windows", "n_sampled_tokens")


def merge(partials: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One partial from the partials of every shard, taken in shard order (one at a time: the
    sparse token counts are folded every few shards, so memory stays near one shard's)."""
    out: dict[str, np.ndarray] = {}
    sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"token": [], "occ": []}
    examples: list[dict[str, np.ndarray]] = []
    names = {"token": ("token_keys", "token_counts"), "occ": ("occ_ids", "occ_counts")}
    for n, p in enumerate(partials, start=1):
        for name in _SUMMED:
            out[name] = np.array(p[name], copy=True) if name not in out else out[name] + p[name]
        for kind, (keys, counts) in names.items():
            sparse[kind].append((p[keys], p[counts]))
        examples = [reduce_examples(examples + [{k[3:]: p[k] for k in p if k.startswith("ex_")}])]
        if n % 64 == 0:
            for kind in sparse:
                sparse[kind] = [_fold(sparse[kind])]
    if not out:
        raise ValueError("no shard to merge")
    for kind, (keys, counts) in names.items():
        out[keys], out[counts] = _fold(sparse[kind])
    out.update({f"ex_{k}": v for k, v in examples[0].items()})
    return out


def _fold(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return sum_sparse(np.concatenate([k for k, _ in parts]), np.concatenate([c for _, c in parts]))
