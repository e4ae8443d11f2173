"""Whether this machine can show the Inspector's window, and what to do when it cannot.

Checked before the QApplication exists, because Qt's own failures are a hang or an abort: with no
display and the `offscreen` platform the window is invisible and the program runs until killed;
with no display and `xcb`, or with `xcb` lacking a system library (Debian's desktop-less images
lack `libxcb-cursor0`, `libxcb-icccm4`, `libxcb-keysyms1`, ...), Qt aborts with a generic line.
`startup_problem()` says which of these applies, in words a user can act on; the missing
libraries come from `ldd` over PySide6's own xcb plugin, so the list is exactly what this Qt
build needs. `python -m colibri.inspector.display --missing-packages` prints the Debian packages
to install (`./dev inspect` installs them when it runs as root).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# Debian names a library package after its soname (policy 8.1: libfoo.so.1 -> libfoo1, and
# libfoo-2.0.so.0 -> libfoo-2.0-0); these are the exceptions Qt's xcb plugin can meet.
_PACKAGE_EXCEPTIONS = {"libglib-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0",
                       "libfreetype.so.6": "libfreetype6", "libdbus-1.so.3": "libdbus-1-3"}
_WINDOWLESS_PLATFORMS = ("offscreen", "minimal")


def xcb_plugin() -> Path | None:
    """PySide6's xcb platform plugin, or None when PySide6 (or the plugin) is not installed."""
    try:
        import PySide6
    except ImportError:
        return None
    path = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return path if path.is_file() else None


def missing_libraries(plugin: Path | None = None) -> list[str]:
    """Sonames the xcb plugin (and the Qt libraries it loads) need but this system lacks, sorted;
    empty when everything resolves or when it cannot be told (no plugin, no `ldd`)."""
    plugin = plugin or xcb_plugin()
    ldd = shutil.which("ldd")
    if plugin is None or ldd is None:
        return []
    try:
        out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.split()[0] for line in out.splitlines() if "not found" in line})


def debian_package(soname: str) -> str:
    """The Debian/Ubuntu package that ships `soname` ('libxcb-icccm.so.4' -> 'libxcb-icccm4')."""
    if soname in _PACKAGE_EXCEPTIONS:
        return _PACKAGE_EXCEPTIONS[soname]
    match = re.fullmatch(r"(.+)\.so\.(\d+)(?:\.\d+)*", soname)
    if match is None:
        return soname.lower()
    name, version = match.group(1).lower(), match.group(2)
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


def _platform(env: Mapping[str, str]) -> str:
    return env.get("QT_QPA_PLATFORM", "").split(":")[0].strip().lower()


def startup_problem(screenshot: bool, env: Mapping[str, str] | None = None,
                    system: str = sys.platform) -> str | None:
    """Why the Inspector's window cannot appear here, as advice to print, or None when it can.
    `screenshot` runs need no display (they render offscreen)."""
    env = os.environ if env is None else env
    if screenshot or not system.startswith("linux"):
        return None
    platform = _platform(env)
    hint = ("To render a view to a PNG without a display:\n"
            "  colibri-inspector [FILE] --screenshot out.png [--view debugger]")
    if platform in _WINDOWLESS_PLATFORMS:
        return (f"QT_QPA_PLATFORM={platform} draws no window: nothing would appear and the "
                "Inspector would run until killed. Unset it in a desktop session.\n" + hint)
    if platform in ("", "xcb", "wayland") and not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")):
        return ("no display: neither DISPLAY nor WAYLAND_DISPLAY is set, so there is no desktop "
                "session to open a window in (over ssh, connect with `ssh -X`).\n" + hint)
    if platform == "xcb" or (platform == "" and env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY")):
        missing = missing_libraries()
        if missing:
            packages = " ".join(sorted({debian_package(s) for s in missing}))
            return (f"Qt's xcb platform plugin cannot load: this system lacks {', '.join(missing)}. "
                    f"On Debian or Ubuntu install them with\n  sudo apt-get install {packages}\n"
                    "(`./dev inspect` installs them itself when run as root).")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["--missing-packages"]:
        print("usage: python -m colibri.inspector.display --missing-packages", file=sys.stderr)
        return 2
    for package in sorted({debian_package(s) for s in missing_libraries()}):
        print(package)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
