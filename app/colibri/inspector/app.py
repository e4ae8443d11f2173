"""`colibri-inspector`: the command line, the QApplication, and the screenshot mode.

`main(argv)` parses `colibri-inspector [FILE ...] [--screenshot PATH] [--view NAME]`, creates
(or reuses) the QApplication, applies the style sheets, and opens the files in a `MainWindow`;
with no FILE it opens the bundled demo model (resources/demo/demo.colibri) and, when that is not
there yet, shows an empty state that says so. `--screenshot PATH` renders the window offscreen
to a PNG once loaded and exits: tests and the README's pictures use it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from PySide6.QtCore import QCoreApplication, QSocketNotifier
from PySide6.QtWidgets import QApplication

from colibri.inspector import resources
from colibri.inspector.display import startup_problem
from colibri.inspector.examples import prepare, settle, wait_while
from colibri.inspector.foreign_view import QtForeignFileView
from colibri.inspector.export import save_png
from colibri.inspector.main_window import VIEW_NAMES, MainWindow, freeze_long_lived_objects

SCREENSHOT_SIZE = (1280, 800)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="colibri-inspector",
        description="Inspect .colibri model files, GGUF files and safetensors checkpoints: "
                    "validation report, header, tensors, hexdump and tensor values.")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="model files to open (default: the bundled demo model)")
    parser.add_argument("--screenshot", metavar="PATH",
                        help="render the window to a PNG at PATH once loaded, then exit")
    parser.add_argument("--view", choices=VIEW_NAMES, default=None,
                        help="the view to show first (with --screenshot: the view captured)")
    parser.add_argument("--size", metavar="WxH", default=None,
                        help="window size for --screenshot (default "
                             f"{SCREENSHOT_SIZE[0]}x{SCREENSHOT_SIZE[1]})")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="open a `colibri profile` directory in the Corpus view")
    parser.add_argument("--compare", metavar="DIR", default=None,
                        help="with --profile: a second profile, shown as differences")
    return parser.parse_args(list(argv) if argv is not None else None)


def application(argv: Sequence[str] | None = None) -> QApplication:
    """The QApplication (created once, reused by tests), named and styled."""
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        app = QApplication([sys.argv[0] if sys.argv else "colibri-inspector",
                            *(argv or [])])
    QCoreApplication.setOrganizationName("Colibri")
    QCoreApplication.setApplicationName("Inspector")
    app.setApplicationDisplayName("Colibri Inspector")
    app.setWindowIcon(resources.icon("colibri"))
    app.setStyleSheet(resources.style_sheet())
    return app


def demo_missing_message() -> str:
    places = "\n".join(str(p) for p in resources.demo_locations())
    return ("No model open.\n\nThe bundled demo model was not found; it is looked for at\n"
            f"{places}\n(a source checkout has it; tools/train_demo.py makes it).\n\n"
            "Open a .colibri file with File > Open (Ctrl+O) or drop one on this window.")


def build_window(files: Sequence[str], view: str | None = None,
                 persist: bool = True) -> MainWindow:
    """A MainWindow with `files` open (the demo model when empty, or the empty state).
    `persist` False leaves the settings untouched (screenshots)."""
    window = MainWindow()
    window.persist = persist
    freeze_long_lived_objects()   # the window's objects live as long as the process too
    paths = list(files)
    if not paths:
        demo = resources.demo_model_path()
        if demo is not None:
            paths = [str(demo)]
        else:
            window.set_empty_message(demo_missing_message())
    for path in paths:
        window.open_path(path)
    if view is not None:
        window.set_view(view)
    return window


def screenshot(window: MainWindow, path: str, view: str | None,
               size: tuple[int, int] = SCREENSHOT_SIZE) -> bool:
    """Render `window` at `view` (after real work on its model: colibri.inspector.examples) to
    a PNG at `path`; True on success."""
    window.resize(*size)
    window.show()
    current = window.file_tab()
    if isinstance(current, QtForeignFileView):
        wait_while(lambda: not current.is_open())   # its first view follows what it holds
    if current is not None:
        prepare(current, view or current.current_view())
    settle()
    return save_png(window, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    size = SCREENSHOT_SIZE
    if args.size:
        try:
            w, h = (int(x) for x in args.size.lower().split("x"))
            size = (w, h)
        except ValueError:
            print(f"colibri-inspector: bad --size {args.size!r}, expected WxH", file=sys.stderr)
            return 2
    if args.screenshot and "QT_QPA_PLATFORM" not in os.environ and sys.platform.startswith(
            "linux") and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    if QApplication.instance() is None:
        problem = startup_problem(bool(args.screenshot))
        if problem is not None:
            print(f"colibri-inspector: {problem}", file=sys.stderr)
            return 2
    app = application()
    window = build_window(args.files, args.view, persist=not args.screenshot)
    current = window.current_view()
    if args.profile and current is not None:
        current.set_view("corpus")
        current.corpus.open_profile(args.profile, "A")
        if args.compare:
            current.corpus.open_profile(args.compare, "B")
    if args.screenshot:
        ok = screenshot(window, args.screenshot, args.view, size)
        window.close()
        if not ok:
            print(f"colibri-inspector: could not write {args.screenshot}", file=sys.stderr)
            return 1
        return 0
    window.show()
    with quit_on_interrupt(window):
        return int(app.exec())


@contextmanager
def quit_on_interrupt(window: MainWindow) -> Iterator[None]:
    """Ctrl+C in the terminal closes `window` as File > Quit would (settings and the debugger's
    autosave are written), then the event loop ends. Python runs signal handlers only between
    bytecodes and Qt's event loop is C++, so the handler's wake-up byte on a socket pair, watched
    by a QSocketNotifier, gets the interpreter back in control at once."""

    def interrupted(_signum: int, _frame: Any) -> None:
        print("colibri-inspector: interrupted, closing", file=sys.stderr)
        window.close()
        QCoreApplication.quit()

    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(lambda: reader.recv(64))
    previous_fd = signal.set_wakeup_fd(writer.fileno())
    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.set_wakeup_fd(previous_fd)
        notifier.setEnabled(False)
        reader.close()
        writer.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
