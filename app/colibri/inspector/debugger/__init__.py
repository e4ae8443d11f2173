"""Qt panels of the routing debugger (views over `colibri.debugging`, which never imports Qt).

`QtDebuggerPanel` (panel.py) is the composite the main window docks; the pieces are `QtRunPanel`
(run_panel.py), the views in views.py, and the engine thread (`DebuggerController` /
`DebuggerWorker`, worker.py)."""

from __future__ import annotations

from colibri.inspector.debugger.panel import QtDebuggerPanel
from colibri.inspector.debugger.worker import DebuggerController, DebuggerSnapshot, DebuggerWorker

__all__ = ["DebuggerController", "DebuggerSnapshot", "DebuggerWorker", "QtDebuggerPanel"]
