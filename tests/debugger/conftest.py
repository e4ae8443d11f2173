"""Fixtures for the debugger tests: small traced models and reference runs via the Python API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from colibri.engine import Model


# qwen2_moe: a shared expert with a gate, a dense layer between two MoE layers, 8 experts top-2.
MODEL_OPTIONS: dict[str, Any] = dict(n_layers=3, n_experts=8, top_k=2, dense_layers=(1,))


@pytest.fixture(scope="session")
def model_path(tiny_model_path: Callable[..., Path]) -> Path:
    return tiny_model_path("qwen2_moe", **MODEL_OPTIONS)


@pytest.fixture(scope="session")
def moe3_path(tiny_model_path: Callable[..., Path]) -> Path:
    """Three MoE layers, mixtral, no dense layer."""
    return tiny_model_path("mixtral", n_layers=3, n_experts=8, top_k=2)


@pytest.fixture
def model(model_path: Path) -> Model:
    m = Model.open(model_path)
    yield m
    m.close()
