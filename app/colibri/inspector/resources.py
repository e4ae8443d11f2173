"""The Inspector's resources (icons, style sheets, the demo model) and the one registry that
finds them.

Icons (`icons/<name>.svg`) and style sheets (`styles/*.qss`, applied in file-name order) are
package data beside this module, so every install has them. The demo model is data of the
source tree (`<repo>/resources/demo/demo.colibri`); a wheel installs it under
`<sys.prefix>/share/colibri/demo/`. Every icon lookup goes through `icon_path`/`icon`, which raise
`KeyError` for an unknown name instead of quietly returning an empty icon, so a typo fails in
tests, not as a blank toolbar button.
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtGui import QIcon

PACKAGE_DATA = Path(__file__).resolve().parent
_SOURCE_DEMO = Path(__file__).resolve().parents[3] / "resources" / "demo" / "demo.colibri"
_INSTALLED_DEMO = Path(sys.prefix) / "share" / "colibri" / "demo" / "demo.colibri"


def icon_names() -> list[str]:
    """Every icon the registry knows (file stems of icons/*.svg), sorted."""
    return sorted(p.stem for p in (PACKAGE_DATA / "icons").glob("*.svg"))


def icon_path(name: str) -> Path:
    """The file of icon `name`. Raises KeyError for an unknown name."""
    path = PACKAGE_DATA / "icons" / f"{name}.svg"
    if not path.is_file():
        raise KeyError(f"unknown icon {name!r}; known icons: {', '.join(icon_names())}")
    return path


def icon(name: str) -> QIcon:
    """The QIcon of icon `name`. Raises KeyError for an unknown name."""
    return QIcon(str(icon_path(name)))


def style_sheet() -> str:
    """Every styles/*.qss, concatenated in file-name order."""
    sheets = sorted((PACKAGE_DATA / "styles").glob("*.qss"))
    if not sheets:
        raise FileNotFoundError(f"no style sheets in {PACKAGE_DATA / 'styles'}: a broken install")
    return "\n".join(p.read_text(encoding="utf-8") for p in sheets)


def demo_model_path() -> Path | None:
    """The bundled demo model (source tree first, then an installed wheel's), or None."""
    for path in (_SOURCE_DEMO, _INSTALLED_DEMO):
        if path.is_file():
            return path
    return None


def demo_locations() -> list[Path]:
    """Where the demo model is looked for (for the empty state's message)."""
    return [_SOURCE_DEMO, _INSTALLED_DEMO]
