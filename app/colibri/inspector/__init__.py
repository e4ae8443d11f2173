"""Colibri Inspector: the Qt desktop application (views, windows, workers). Model logic lives in
`colibri.inspection` and the engine; nothing here computes what it shows.

`main` is the `colibri-inspector` entry point: it says how to install the `gui` extra when
PySide6 or pyqtgraph is missing (a plain `pip install colibri-moe` has neither) instead of
failing with an import traceback, then runs `colibri.inspector.app.main`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        import pyqtgraph  # noqa: F401
        import PySide6  # noqa: F401
    except ImportError as exc:
        print(f"colibri-inspector: the Inspector needs the `gui` extra (PySide6 and pyqtgraph), "
              f"and this Python lacks it ({exc}). Install it with\n"
              "  pip install 'colibri-moe[gui]'      (from a clone: pip install '.[gui]')",
              file=sys.stderr)
        return 2
    from colibri.inspector.app import main as run

    return run(argv)
