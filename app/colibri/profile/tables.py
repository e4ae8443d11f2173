"""A merged profile as Parquet tables (pyarrow), and the names of its files.

One table a file in the profile directory; layers are the model's layer indices, experts 0-based,
token classes named as in `colibri.profile.classes.CLASS_NAMES`:

  experts.parquet      layer, expert, load, load_share (load / cells: the layer's shares add up
                       to k), weight_sum, mean_weight (weight_sum / load; NaN for an unused expert)
  layers.parquet       layer, cells, load_cv (population std / mean of the experts' loads),
                       load_min, load_max, max_over_mean, sampled_cells (cells the jitter
                       variants re-ran)
  classes.parquet      layer, expert, token_class, count: selections of e at m by token class
  tokens.parquet       layer, expert, token_id, count: selections by token id (non-zero only)
  vocab.parquet        token_id, text, token_class, occurrences: every token id that occurred
  coselection.parquet  layer, expert_a, expert_b (a < b), count: cells that selected both
  margins.parquet      layer, unit ('ulp' or 'abs'), bin, label, lo, hi (null for the 'none'
                       bin: no (k+1)-th expert), cells
  jitter.parquet       variant, layer, bin, label (ULP-margin bin), cells, flips
  examples.parquet     layer, expert, rank, weight, window, record, offset (token index in the
                       record), token_id, before, token, after (text): the selections of each
                       expert with the largest combine weights
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from colibri.profile.classes import CLASS_NAMES, token_classes
from colibri.profile.dataset import Corpus
from colibri.profile.stats import (CONTEXT_BEFORE, N_ABS_BINS, N_ULP_BINS, Shape,
                                   abs_bin_bounds, ulp_bin_bounds)
from colibri.tokens import token_text

TABLES = ("experts", "layers", "classes", "tokens", "vocab", "coselection", "margins", "jitter",
          "examples")


def _decode(tokenizer: Any, ids: np.ndarray) -> str:
    ids = [int(t) for t in ids if t >= 0]
    if not ids:
        return ""
    if tokenizer is None:
        return " ".join(str(t) for t in ids)
    return str(tokenizer.decode(ids))


def _null_nan(x: float) -> float | None:
    return None if x != x else x


def build_tables(merged: dict[str, np.ndarray], shape: Shape, layers: list[int],
                 variants: list[str], tokenizer: Any, corpus: Corpus) -> dict[str, pa.Table]:
    """Every table of the profile from the merged partial of all shards."""
    M, E, V = shape.n_moe, shape.n_experts, shape.vocab
    layer_ids = np.asarray(layers, dtype=np.int32)
    load = merged["load"]
    weight_sum = merged["weight_sum"]
    cells = int(merged["n_tokens"])
    grid_m = np.repeat(layer_ids, E)
    grid_e = np.tile(np.arange(E, dtype=np.int32), M)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_weight = np.where(load > 0, weight_sum / np.maximum(load, 1), np.nan)
        mean = load.mean(axis=1)
        cv = np.where(mean > 0, load.std(axis=1) / np.where(mean > 0, mean, 1), np.nan)
    t: dict[str, pa.Table] = {}
    mw = mean_weight.reshape(-1)
    t["experts"] = pa.table({
        "layer": grid_m, "expert": grid_e, "load": load.reshape(-1),
        "load_share": load.reshape(-1) / max(cells, 1), "weight_sum": weight_sum.reshape(-1),
        "mean_weight": pa.array(mw, mask=np.isnan(mw))})
    sampled = merged["jitter_cells"][0].sum(axis=1) if shape.n_variants else np.zeros(M, np.int64)
    t["layers"] = pa.table({
        "layer": layer_ids, "cells": np.full(M, cells, dtype=np.int64), "load_cv": cv,
        "load_min": load.min(axis=1), "load_max": load.max(axis=1),
        "max_over_mean": np.where(mean > 0, load.max(axis=1) / np.where(mean > 0, mean, 1),
                                  np.nan),
        "sampled_cells": sampled.astype(np.int64)})

    # tokens, vocab and classes
    keys, counts = merged["token_keys"], merged["token_counts"]
    me, tok = keys // V, keys % V
    occ_ids, occ_counts = merged["occ_ids"], merged["occ_counts"]
    occ_class = token_classes(tokenizer, occ_ids)
    cls = occ_class[np.searchsorted(occ_ids, tok)] if tok.size else np.zeros(0, np.int8)
    t["tokens"] = pa.table({"layer": layer_ids[me // E], "expert": (me % E).astype(np.int32),
                            "token_id": tok.astype(np.int32), "count": counts})
    t["vocab"] = pa.table({
        "token_id": occ_ids.astype(np.int32),
        "text": [token_text(tokenizer, int(i)) for i in occ_ids],
        "token_class": [CLASS_NAMES[c] for c in occ_class], "occurrences": occ_counts})
    C = len(CLASS_NAMES)
    by_class = np.bincount(me * C + cls, weights=counts.astype(np.float64),
                           minlength=M * E * C).round().astype(np.int64)
    t["classes"] = pa.table({
        "layer": np.repeat(layer_ids, E * C), "expert": np.tile(np.repeat(np.arange(E, dtype=np.int32), C), M),
        "token_class": list(CLASS_NAMES) * (M * E), "count": by_class})

    a, b = np.triu_indices(E, k=1)
    t["coselection"] = pa.table({
        "layer": np.repeat(layer_ids, a.size), "expert_a": np.tile(a.astype(np.int32), M),
        "expert_b": np.tile(b.astype(np.int32), M),
        "count": merged["cosel"][:, a, b].reshape(-1)})

    rows: dict[str, list[Any]] = {k: [] for k in ("layer", "unit", "bin", "label", "lo", "hi",
                                                  "cells")}
    for unit, hist, n_bins, bounds in (("ulp", merged["ulp_hist"], N_ULP_BINS, ulp_bin_bounds),
                                       ("abs", merged["abs_hist"], N_ABS_BINS, abs_bin_bounds)):
        for m in range(M):
            for i in range(n_bins):
                label, lo, hi = bounds(i)
                for key, value in (("layer", int(layer_ids[m])), ("unit", unit), ("bin", i),
                                   ("label", label), ("lo", _null_nan(lo)),
                                   ("hi", _null_nan(hi)),
                                   ("cells", int(hist[m, i]))):
                    rows[key].append(value)
    t["margins"] = pa.table(rows, schema=pa.schema([
        ("layer", pa.int32()), ("unit", pa.string()), ("bin", pa.int32()), ("label", pa.string()),
        ("lo", pa.float64()), ("hi", pa.float64()), ("cells", pa.int64())]))

    jrows: dict[str, list[Any]] = {k: [] for k in ("variant", "layer", "bin", "label", "cells",
                                                   "flips")}
    for v, name in enumerate(variants):
        for m in range(M):
            for i in range(N_ULP_BINS):
                n = int(merged["jitter_cells"][v, m, i])
                if n == 0:
                    continue
                for key, value in (("variant", name), ("layer", int(layer_ids[m])), ("bin", i),
                                   ("label", ulp_bin_bounds(i)[0]), ("cells", n),
                                   ("flips", int(merged["jitter_flips"][v, m, i]))):
                    jrows[key].append(value)
    t["jitter"] = pa.table(jrows, schema=pa.schema([
        ("variant", pa.string()), ("layer", pa.int32()), ("bin", pa.int32()),
        ("label", pa.string()), ("cells", pa.int64()), ("flips", pa.int64())]))

    ex_me, window, pos = merged["ex_me"], merged["ex_window"], merged["ex_pos"]
    context = merged["ex_context"]
    first = np.searchsorted(ex_me, ex_me, side="left")
    t["examples"] = pa.table({
        "layer": layer_ids[ex_me // E] if ex_me.size else np.zeros(0, np.int32),
        "expert": (ex_me % E).astype(np.int32),
        "rank": (np.arange(ex_me.size) - first).astype(np.int32),
        "weight": merged["ex_weight"].astype(np.float32), "window": window,
        "record": corpus.records[window] if window.size else np.zeros(0, np.int64),
        "offset": corpus.starts[window] + pos if window.size else np.zeros(0, np.int64),
        "token_id": context[:, CONTEXT_BEFORE].astype(np.int32),
        "before": [_decode(tokenizer, c[:CONTEXT_BEFORE]) for c in context],
        "token": [token_text(tokenizer, int(c[CONTEXT_BEFORE])) for c in context],
        "after": [_decode(tokenizer, c[CONTEXT_BEFORE + 1:]) for c in context]})
    return t
