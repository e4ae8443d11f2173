"""`colibri-inspector FILE --screenshot PATH --view NAME` writes a non-blank PNG of the window
at that view and exits 0, in process and as a real command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from colibri.inspector import app as inspector_app
from colibri.inspector.main_window import VIEW_NAMES


pytestmark = pytest.mark.usefixtures("inspector_settings")


def _distinct_colours(path: Path) -> int:
    image = QImage(str(path))
    assert not image.isNull()
    step_x, step_y = max(1, image.width() // 97), max(1, image.height() // 61)
    return len({image.pixel(x, y) for x in range(0, image.width(), step_x)
                for y in range(0, image.height(), step_y)})


@pytest.mark.parametrize("view", VIEW_NAMES)
def test_screenshot_writes_a_non_blank_png(qtbot, tiny_model_path, tmp_path, view):
    out = tmp_path / f"{view}.png"
    assert inspector_app.main([str(tiny_model_path()), "--screenshot", str(out),
                               "--view", view]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert QImage(str(out)).size().toTuple() == inspector_app.SCREENSHOT_SIZE
    assert _distinct_colours(out) > 8


def test_screenshot_of_a_corrupt_file_shows_the_report(qtbot, tmp_path):
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"PK\x03\x04" + bytes(600))
    out = tmp_path / "bad.png"
    assert inspector_app.main([str(bad), "--screenshot", str(out)]) == 0
    assert _distinct_colours(out) > 8


def test_screenshot_leaves_settings_untouched(qtbot, tiny_model_path, tmp_path):
    inspector_app.main([str(tiny_model_path()), "--screenshot", str(tmp_path / "s.png")])
    assert not (tmp_path / "settings" / "Inspector.ini").exists()


def test_screenshot_from_the_command_line(tiny_model_path, tmp_path):
    out = tmp_path / "cli.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    run = subprocess.run([sys.executable, "-m", "colibri.inspector.app", str(tiny_model_path()),
                          "--screenshot", str(out), "--view", "header"],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert _distinct_colours(out) > 8
