"""Fixtures for the server tests: real servers on loopback, stopped at the end of each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from server_helpers import MODEL, RunningServer, start_server
from tiny_models import TinyModel, live_copy


@pytest.fixture
def models(tiny_model: Callable[..., TinyModel], tmp_path: Path) -> tuple[Path, Path, Path]:
    """(live path, model A, model B): same shape, different weights; live starts as A."""
    a = tiny_model("mixtral", seed=1, **MODEL).path
    b = tiny_model("mixtral", seed=2, **MODEL).path
    return live_copy(a, tmp_path), a, b


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """Factory: serve(path, *extra CLI args) -> a running server."""
    servers: list[RunningServer] = []

    def start(path: Path | str, *args: str) -> RunningServer:
        server = start_server(path, *args, log_dir=tmp_path / "logs")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
