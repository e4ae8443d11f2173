"""Saving what the user sees: a widget as a PNG, written atomically (colibri.files), so an
interrupted export never leaves half a picture over a previous one."""

from __future__ import annotations

import os

from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtWidgets import QWidget

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
