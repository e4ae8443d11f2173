"""Saving what the user sees: a widget as a PNG, written atomically (colibri.files), so an
interrupted export never leaves half a picture over a previous one; and the save/load file
dialogs of the panels whose results are JSON files."""

from __future__ import annotations

import os
from collections.abc import Callable

from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtWidgets import QFileDialog, QWidget

from colibri.files import atomic_write_bytes


def png_bytes(widget: QWidget) -> bytes:
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not widget.grab().save(buffer, "PNG"):
        raise OSError("could not encode the view as PNG")
    buffer.close()
    return bytes(data.data())


def save_png(widget: QWidget, path: str | os.PathLike[str]) -> bool:
    """Render `widget` to `path` as a PNG; True on success, raises OSError on a write error."""
    atomic_write_bytes(path, png_bytes(widget))
    return True


JSON_FILTER = "JSON (*.json)"


def save_with_dialog(parent: QWidget, title: str, save: Callable[[str], object],
                     pattern: str = JSON_FILTER, name: str = "") -> None:
    """Ask where to save (offering file name `name`) and call save(path); nothing when the user
    cancels."""
    path, _ = QFileDialog.getSaveFileName(parent, title, name, pattern)
    if path:
        save(path)


def load_with_dialog(parent: QWidget, title: str, load: Callable[[str], object],
                     tell: Callable[[str], object], pattern: str = JSON_FILTER) -> None:
    """Ask for a file and call load(path); a file that cannot be read or is not the expected
    document is told through tell(message), so a bad file never raises into the event loop."""
    path, _ = QFileDialog.getOpenFileName(parent, title, "", pattern)
    if path:
        try:
            load(path)
        except (OSError, ValueError, KeyError) as exc:
            tell(f"cannot load {path}: {exc}")
