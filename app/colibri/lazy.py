"""Names a package exports but imports only on first use (PEP 562's module `__getattr__`), so that
importing the package, or one light module of it, does not load what only some commands need
(the compiled engine, the analyses, the converter).

    __getattr__ = lazy_exports(__name__, {"colibri.jitter.variants": ("Variant", ...)})

with the same names under `if TYPE_CHECKING:` imports for type checkers and in `__all__`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name of `homes[module]` is read from `module`,
    imported when the name is first asked for; any other name is an AttributeError."""
    home_of = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module), name)

    return __getattr__
