"""The profile job and its reader never import Qt (style point 10): `colibri profile` runs on
machines without the GUI extra, and the Corpus view's model is testable without a display."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["PySide6"] = None  # any `import PySide6...` now raises ImportError
sys.modules["pyqtgraph"] = None
import colibri.profile, colibri.profile.cli, colibri.profile.job, colibri.profile.results
import colibri.profile.ray_backend, colibri.profile.shard, colibri.profile.tables
print("ok")
"""


def test_profile_imports_without_qt() -> None:
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
