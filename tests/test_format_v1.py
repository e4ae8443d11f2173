"""Files written before format version 2 still open, validate and run unchanged.

tests/v1/ holds a version-1 file made by the version-1 converter, and what that engine computed
on it (tests/v1/README.md). The engine of today must read its header and routing section as
version 1 and give the same routing and the same logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import colibri

V1 = Path(__file__).parent / "v1"
FILE = V1 / "qwen2_moe-v1.colibri"


def test_a_version_1_file_validates_clean() -> None:
    assert colibri.validate(FILE, checksums=True, nan_check=True) == []


def test_a_version_1_file_runs_as_it_did() -> None:
    expected = np.load(V1 / "qwen2_moe-v1.expected.npz")
    with colibri.Model.open(FILE) as model:
        assert model.hparams.version == 1
        session = colibri.Session(model, kernels="portable")
        logits = session.prefill(expected["tokens"])
        trace = session.trace
        np.testing.assert_array_equal(trace.expert_ids, expected["expert_ids"])
        np.testing.assert_array_equal(trace.router_logits, expected["router_logits"])
        np.testing.assert_allclose(trace.expert_weights, expected["expert_weights"], rtol=1e-6, atol=0)
        np.testing.assert_allclose(trace.shared_gate, expected["shared_gate"], rtol=1e-6, atol=0)
        np.testing.assert_allclose(logits, expected["logits"], rtol=1e-5, atol=1e-6)
