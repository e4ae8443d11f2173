"""The jitter analysis and the numerics binding never import Qt (style point 10)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["PySide6"] = None  # any `import PySide6...` now raises ImportError
sys.modules["pyqtgraph"] = None
import colibri.numerics, colibri.jitter, colibri.jitter.analysis, colibri.cli.jitter
import colibri.jitter.variants, colibri.jitter.weights
print("ok")
"""


def test_jitter_imports_without_qt() -> None:
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
