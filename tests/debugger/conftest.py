"""Fixtures for the debugger tests: small traced models and reference runs via the Python API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from colibri.engine import Model

from tiny_models import V3_RULE


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
def moe3_model(moe3_path: Path) -> Model:
    m = Model.open(moe3_path)
    yield m
    m.close()


@pytest.fixture
def model(model_path: Path) -> Model:
    m = Model.open(model_path)
    yield m
    m.close()


@pytest.fixture(scope="session")
def v3_path(tiny_model_path: Callable[..., Path]) -> Path:
    """A DeepSeek-V3-style rule in both MoE layers (a dense layer between them); its biases
    change some choices of PROMPT."""
    return tiny_model_path("mixtral", n_layers=3, n_experts=8, top_k=2, dense_layers=(1,),
                           rule=V3_RULE)


@pytest.fixture
def v3_model(v3_path: Path) -> Model:
    m = Model.open(v3_path)
    yield m
    m.close()
