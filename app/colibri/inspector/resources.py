"""The Inspector's resources (icons, style sheets) and the one registry that finds them.

Resources are plain files under `<repo>/resources/` (`icons/<name>.svg`, `styles/*.qss` applied
in file-name order), or under `<sys.prefix>/share/colibri/` when installed there. Every lookup
goes through `icon_path`/`icon`, which raise `KeyError` for an unknown name instead of quietly
returning an empty icon, so a typo fails in tests, not as a blank toolbar button.
"""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

from PySide6.QtGui import QIcon

ENV_RESOURCES = "COLIBRI_RESOURCES"


def _candidates() -> list[Path]:
    here = Path(__file__).resolve()
    found = []
    if os.environ.get(ENV_RESOURCES):
        found.append(Path(os.environ[ENV_RESOURCES]))
    found.append(here.parents[3] / "resources")            # <repo>/app/colibri/inspector/...
    found.append(Path(sys.prefix) / "share" / "colibri")   # an installed data location
    return found


@cache
def resource_root() -> Path:
    """The first resources directory that has icons; raises FileNotFoundError when none does."""
    for root in _candidates():
        if (root / "icons").is_dir():
            return root
    raise FileNotFoundError("Colibri Inspector resources not found; looked in "
                            + ", ".join(str(p) for p in _candidates()))


def icon_names() -> list[str]:
    """Every icon the registry knows (file stems of icons/*.svg), sorted."""
    return sorted(p.stem for p in (resource_root() / "icons").glob("*.svg"))


def icon_path(name: str) -> Path:
    """The file of icon `name`. Raises KeyError for an unknown name."""
    path = resource_root() / "icons" / f"{name}.svg"
    if not path.is_file():
        raise KeyError(f"unknown icon {name!r}; known icons: {', '.join(icon_names())}")
    return path


def icon(name: str) -> QIcon:
    """The QIcon of icon `name`. Raises KeyError for an unknown name."""
    return QIcon(str(icon_path(name)))


def style_sheet() -> str:
    """Every styles/*.qss, concatenated in file-name order ("" when there are none)."""
    styles = resource_root() / "styles"
    if not styles.is_dir():
        return ""
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(styles.glob("*.qss")))


def demo_model_path() -> Path | None:
    """The bundled demo model (`demo/demo.colibri` beside the resources), or None if absent."""
    for root in _candidates():
        path = root / "demo" / "demo.colibri"
        if path.is_file():
            return path
    return None


def expected_demo_path() -> Path:
    """Where the demo model should be in a source checkout (for the empty-state message)."""
    return Path(__file__).resolve().parents[3] / "resources" / "demo" / "demo.colibri"
