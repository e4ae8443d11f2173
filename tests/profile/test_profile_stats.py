"""The profile's histogram bins and sparse sums: the jitter lab's ULP bins, vectorised; fixed
absolute bins; sums that do not depend on how the counts were split."""

from __future__ import annotations

import numpy as np

from colibri.jitter import ulp_bin, ulp_bins
from colibri.profile.classes import CLASS_NAMES, classify
from colibri.profile.stats import (ABS_EDGES, N_ABS_BINS, N_ULP_BINS, abs_bin_bounds,
                                   abs_bin_index, sum_sparse, ulp_bin_bounds, ulp_bin_index)


def test_vectorised_ulp_bins_are_the_jitter_labs() -> None:
    ulps = np.array([-1, 0, 1, 2, 3, 4, 7, 8, 1000, 2**31 - 1, 2**31, 2**32, 2**33 - 1])
    assert ulp_bins(ulps).tolist() == [ulp_bin(int(u)) for u in ulps]
    idx = ulp_bin_index(ulps)
    assert idx.max() < N_ULP_BINS
    for u, i in zip(ulps[1:], idx[1:]):
        _, lo, hi = ulp_bin_bounds(int(i))
        assert lo <= u <= hi


def test_absolute_margin_bins() -> None:
    values = np.array([np.inf, 0.0, 1e-12, 1e-9, 2e-9, 0.5, 1.0, 999.0, 1e3, 1e6])
    idx = abs_bin_index(values)
    assert idx.tolist()[:3] == [0, 1, 2]
    assert idx.max() == N_ABS_BINS - 1
    for v, i in zip(values[2:], idx[2:]):
        _, lo, hi = abs_bin_bounds(int(i))
        assert lo <= v < hi, (v, lo, hi)
    assert ABS_EDGES[0] == 1e-9 and ABS_EDGES[-1] == 1e3


def test_sparse_sums_do_not_depend_on_the_split() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 50, 1000)
    whole = sum_sparse(keys, np.ones(1000, np.int64))
    parts = [sum_sparse(k, np.ones(k.size, np.int64)) for k in np.array_split(keys, 7)]
    folded = sum_sparse(np.concatenate([k for k, _ in parts]),
                        np.concatenate([c for _, c in parts]))
    assert whole[0].tolist() == folded[0].tolist() and whole[1].tolist() == folded[1].tolist()
    assert whole[1].sum() == 1000


def test_token_classes() -> None:
    names = {text: CLASS_NAMES[classify(text)] for text in
             (" the", "42", " (", "\n    ", " def", "return", "x1", "_", "caf\ufffd")}
    assert names == {" the": "letters", "42": "digits", " (": "punctuation",
                     "\n    ": "whitespace", " def": "keyword", "return": "keyword",
                     "x1": "other", "_": "punctuation", "caf\ufffd": "other"}
    assert CLASS_NAMES[classify("<|endoftext|>", special=True)] == "special"
