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
import sys
import time
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

from colibri.inspector import resources
from colibri.inspector.export import save_png
from colibri.inspector.main_window import VIEW_NAMES, FileView, MainWindow

SCREENSHOT_SIZE = (1600, 900)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="colibri-inspector",
        description="Inspect .colibri model files: validation report, header, tensors, "
                    "hexdump and tensor values.")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="model files to open (default: the bundled demo model)")
    parser.add_argument("--screenshot", metavar="PATH",
                        help="render the window to a PNG at PATH once loaded, then exit")
    parser.add_argument("--view", choices=VIEW_NAMES, default=None,
                        help="the view to show first (with --screenshot: the view captured)")
    parser.add_argument("--size", metavar="WxH", default=None,
                        help="window size for --screenshot (default 1400x860)")
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
    return ("No model open.\n\nThe bundled demo model is not here yet: it is expected at\n"
            f"{resources.expected_demo_path()}\n(it is produced by tools/train_demo.py).\n\n"
            "Open a .colibri file with File > Open (Ctrl+O) or drop one on this window.")


def build_window(files: Sequence[str], view: str | None = None,
                 persist: bool = True) -> MainWindow:
    """A MainWindow with `files` open (the demo model when empty, or the empty state).
    `persist` False leaves the settings untouched (screenshots)."""
    window = MainWindow()
    window.persist = persist
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


def _settle(app: QApplication, ms: int = 150) -> None:
    """Let layouts, first paints and queued signals run for `ms` milliseconds."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()
    app.processEvents()


def screenshot(window: MainWindow, path: str, view: str | None,
               size: tuple[int, int] = SCREENSHOT_SIZE) -> bool:
    """Render `window` at `view` to a PNG at `path`; True on success."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    window.resize(*size)
    window.show()
    current = window.current_view()
    if current is not None and view is not None:
        current.set_view(view)
        model = current.doc.model
        if view in ("values", "tensors") and model is not None and model.tensors:
            # Show something meaningful: the first routed expert matrix, else the first tensor.
            name = next((t.name for t in model.tensors if t.name.endswith("moe_w1")),
                        model.tensors[0].name)
            current.show_tensor(name)
            current.set_view(view)
            deadline = time.monotonic() + 10
            while current.values.is_busy() and time.monotonic() < deadline:
                _settle(app, 20)
        if view == "debugger" and model is not None and model.tokenizer is not None:
            _demo_debug_run(app, current, model)
        if view == "jitter" and model is not None and model.tokenizer is not None:
            _demo_jitter_run(app, current)
    _settle(app)
    return save_png(window, path)


SCREENSHOT_PROMPT = "def read_header(self, data):\n    "


def _wait(app: QApplication, busy: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while busy() and time.monotonic() < deadline:
        _settle(app, 20)


def _demo_debug_run(app: QApplication, view: FileView, model: Any) -> None:
    """A short greedy run so the debugger picture shows routing, not an empty form."""
    from colibri.values import RunSettings

    panel = view.debugger
    panel.run_panel.prompt.setText(SCREENSHOT_PROMPT)
    panel.start_run(RunSettings(model.tokenizer.encode(SCREENSHOT_PROMPT).ids, 24))
    _settle(app, 100)
    _wait(app, lambda: panel.controller.running)
    if panel.events is not None and len(panel.events):
        panel.select_event(len(panel.events) // 2)


def _demo_jitter_run(app: QApplication, view: FileView) -> None:
    lab = view.jitter
    lab.prompt.setText(SCREENSHOT_PROMPT)
    lab.start("jitter")
    _settle(app, 100)
    _wait(app, lab.runner.is_running, 120)


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
    app = application()
    window = build_window(args.files, args.view, persist=not args.screenshot)
    if args.screenshot:
        ok = screenshot(window, args.screenshot, args.view, size)
        window.close()
        if not ok:
            print(f"colibri-inspector: could not write {args.screenshot}", file=sys.stderr)
            return 1
        return 0
    window.show()
    return int(app.exec())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
