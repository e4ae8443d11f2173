"""Shared fixtures: small valid .colibri files built at test time with colibri.fileformat.

`tiny_model(arch=..., dtype=...)` returns a `TinyModel` (path, header values, the float32 values
of every tensor as written, the embedded metadata); `tiny_model_path(...)` just the path;
`tiny_image(...)` the file image as a bytearray for tests that corrupt bytes. Files are built once
per distinct set of arguments and shared by the whole test session (treat them as read-only).
Tensor names and shapes follow docs/format.md for each of the four architectures.

For the Inspector's tests: `inspector_settings` (its settings in the test's own directory) and
`window` (a shown MainWindow with those settings), `debugger_panel` (a factory of debugger
panels, shut down after the test). They import Qt only when a test asks for them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tiny_models import TinyModel, make_tiny_model

if TYPE_CHECKING:
    from colibri.inspector.debugger import QtDebuggerPanel
    from colibri.inspector.main_window import MainWindow

# Qt tests never need a display: without one, Qt would abort the whole run looking for it.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session")
def _tiny_cache() -> dict[tuple[Any, ...], TinyModel]:
    return {}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory,
               _tiny_cache: dict[tuple[Any, ...], TinyModel]) -> Callable[..., TinyModel]:
    """Factory: tiny_model(arch="mixtral", dtype="f32", **make_tiny_model options)."""
    directory = tmp_path_factory.mktemp("tiny-models")

    def build(arch: str = "mixtral", dtype: str = "f32", **options: Any) -> TinyModel:
        key = (arch, dtype, tuple(sorted(options.items())))
        if key not in _tiny_cache:
            _tiny_cache[key] = make_tiny_model(directory, arch, dtype, **options)
        return _tiny_cache[key]

    return build


@pytest.fixture(scope="session")
def tiny_model_path(tiny_model: Callable[..., TinyModel]) -> Callable[..., Path]:
    """Factory: the path of a valid tiny model file (same arguments as tiny_model)."""

    def build(arch: str = "mixtral", dtype: str = "f32", **options: Any) -> Path:
        return tiny_model(arch, dtype, **options).path

    return build


@pytest.fixture
def tiny_image(tiny_model_path: Callable[..., Path]) -> Callable[..., bytearray]:
    """Factory: a fresh, mutable in-memory copy of a tiny model file."""

    def build(arch: str = "mixtral", dtype: str = "f32", **options: Any) -> bytearray:
        return bytearray(tiny_model_path(arch, dtype, **options).read_bytes())

    return build


@pytest.fixture
def write_image(tmp_path: Path) -> Callable[[bytes | bytearray, str], Path]:
    """Write bytes to a file under tmp_path and return its path."""

    def write(data: bytes | bytearray, name: str = "edited.colibri") -> Path:
        path = tmp_path / name
        path.write_bytes(bytes(data))
        return path

    return write


@pytest.fixture
def inspector_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Inspector's settings in this test's directory, never the user's (a module opts in
    with `pytestmark = pytest.mark.usefixtures("inspector_settings")`)."""
    from colibri.inspector.main_window import ENV_SETTINGS
    path = tmp_path / "settings"
    monkeypatch.setenv(ENV_SETTINGS, str(path))
    return path


@pytest.fixture
def debugger_panel(qtbot: Any) -> Iterator[Callable[..., QtDebuggerPanel]]:
    """Factory: debugger_panel(model=None), a debugger panel on `model` (None: none yet) that
    qtbot owns and that is shut down after the test. Ask for it after the fixture giving the
    model, so the panel is shut down before the model is closed."""
    from colibri.inspector.debugger import QtDebuggerPanel
    made: list[QtDebuggerPanel] = []

    def build(model: Any = None) -> QtDebuggerPanel:
        p = QtDebuggerPanel()
        qtbot.addWidget(p)
        if model is not None:
            p.set_model(model)
        made.append(p)
        return p

    yield build
    for p in reversed(made):
        p.shutdown()


@pytest.fixture
def window(qtbot: Any, inspector_settings: Path) -> MainWindow:
    """A shown Inspector main window; qtbot closes it (shutting its views down) at the end."""
    from colibri.inspector.main_window import MainWindow
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    return w
