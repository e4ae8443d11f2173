"""The debugger core never imports Qt (style point 10)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["PySide6"] = None  # any `import PySide6...` now raises ImportError
import colibri.debugging
import colibri.debugging.run, colibri.debugging.events, colibri.debugging.breakpoints
import colibri.debugging.stats, colibri.debugging.trace_export, colibri.debugging.session_file
import colibri.cli.trace
assert not any(m.startswith(("PySide6", "pyqtgraph")) for m in sys.modules if sys.modules[m])
print("ok")
"""


def test_debugging_imports_without_qt() -> None:
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
