"""Colibri: a pure-C Mixture-of-Experts inference engine, its file format and its tools.

`Model`, `Session`, `validate` (and the rest of `colibri.engine`) need the compiled extension and
are imported on first use, so the pure-Python modules (`colibri.fileformat`, `colibri.errors`,
the converter) work before the engine is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from colibri import errors
from colibri.lazy import lazy_exports

if TYPE_CHECKING:
    from colibri.engine import Model, Session, validate

    __version__: str

_engine_names = lazy_exports(__name__, {"colibri.engine": ("Model", "Session", "validate")})


def __getattr__(name: str) -> Any:
    if name == "__version__":  # on first use: importlib.metadata costs every command ~40 ms
        from importlib import metadata
        try:
            return metadata.version("colibri-moe")
        except metadata.PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    return _engine_names(name)


__all__ = ["Model", "Session", "__version__", "errors", "validate"]
