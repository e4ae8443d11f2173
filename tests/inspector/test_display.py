"""Before a window is made: no display, a windowless Qt platform, or an xcb plugin missing system
libraries each give advice and exit status 2, never a hang or Qt's abort."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from colibri.inspector import display


@pytest.mark.parametrize("soname, package", [
    ("libxcb-icccm.so.4", "libxcb-icccm4"), ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-cursor.so.0", "libxcb-cursor0"), ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libX11-xcb.so.1", "libx11-xcb1"), ("libxcb-render-util.so.0", "libxcb-render-util0"),
    ("libglib-2.0.so.0", "libglib2.0-0"), ("libEGL.so.1", "libegl1"),
])
def test_sonames_map_to_debian_packages(soname, package):
    assert display.debian_package(soname) == package


def test_no_display_is_a_problem_unless_taking_a_screenshot():
    problem = display.startup_problem(False, {}, "linux")
    assert problem is not None and "no display" in problem and "--screenshot" in problem
    assert display.startup_problem(True, {}, "linux") is None


def test_offscreen_platform_without_screenshot_would_hang_so_it_is_refused():
    problem = display.startup_problem(False, {"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"},
                                      "linux")
    assert problem is not None and "draws no window" in problem


def test_missing_xcb_libraries_are_named_with_their_packages(monkeypatch):
    monkeypatch.setattr(display, "missing_libraries",
                        lambda plugin=None: ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    problem = display.startup_problem(False, {"DISPLAY": ":0"}, "linux")
    assert problem is not None
    assert "libxcb-icccm.so.4" in problem
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in problem


def test_missing_libraries_are_read_from_the_real_plugin():
    """Whatever this machine lacks, the answer comes from ldd over PySide6's xcb plugin and every
    name it gives is a soname."""
    if display.xcb_plugin() is None:
        pytest.skip("this PySide6 has no xcb plugin")
    assert all(".so" in name for name in display.missing_libraries())


def test_inspector_without_a_display_exits_with_advice():
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    run = subprocess.run([sys.executable, "-m", "colibri.inspector.app"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "no display" in run.stderr and "--screenshot" in run.stderr


def test_ctrl_c_closes_the_window(qtbot, tmp_path, monkeypatch):
    """SIGINT (Ctrl+C in the terminal) reaches Python while Qt's event loop waits, and closes
    the window as File > Quit would."""
    import signal

    from colibri.inspector.app import quit_on_interrupt
    from colibri.inspector.main_window import ENV_SETTINGS, MainWindow

    monkeypatch.setenv(ENV_SETTINGS, str(tmp_path))
    window = MainWindow()
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    before = signal.getsignal(signal.SIGINT)   # Python's handler, or SIG_IGN in a background job
    with quit_on_interrupt(window):
        os.kill(os.getpid(), signal.SIGINT)
        qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)
    assert (tmp_path / "Inspector.ini").exists()   # closed the way Quit closes: settings saved
    assert signal.getsignal(signal.SIGINT) is before
