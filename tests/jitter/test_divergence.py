"""The jitter lab's and the counterfactual's measure of two runs' outputs, per position: the
largest |logit difference| and KL(softmax(a) || softmax(b)), checked against the definitions
written out in plain float64 arithmetic, a position at a time."""

from __future__ import annotations

import math

import numpy as np

from colibri.jitter.analysis import logit_divergence


def _kl_by_definition(a: np.ndarray, b: np.ndarray) -> float:
    pa = np.exp(a.astype(np.float64) - a.max())
    pa /= pa.sum()
    pb = np.exp(b.astype(np.float64) - b.max())
    pb /= pb.sum()
    return float(sum(p * (math.log(p) - math.log(q)) for p, q in zip(pa, pb) if p > 0))


def test_divergence_matches_its_definition() -> None:
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((6, 64)) * 4).astype(np.float32)
    b = a + (rng.standard_normal(a.shape) * 0.5).astype(np.float32)
    b[2] = a[2]                                            # one position unchanged
    max_abs, kl = logit_divergence(a, b)
    assert max_abs.dtype == kl.dtype == np.float64 and max_abs.shape == kl.shape == (6,)
    for p in range(6):
        assert max_abs[p] == np.abs(a[p].astype(np.float64) - b[p]).max()
        assert math.isclose(kl[p], _kl_by_definition(a[p], b[p]), rel_tol=1e-9, abs_tol=1e-15)
    assert max_abs[2] == 0.0 and kl[2] == 0.0 and (kl[[0, 1, 3, 4, 5]] > 0).all()


def test_divergence_does_not_change_its_inputs() -> None:
    a = np.arange(12, dtype=np.float32).reshape(2, 6)
    b = a[::-1].copy()
    before = a.copy(), b.copy()
    logit_divergence(a, b)
    assert a.tobytes() == before[0].tobytes() and b.tobytes() == before[1].tobytes()
