"""What `pip install '.[gui]'` puts on a machine is enough to run the Inspector: the icons and
style sheets travel as package data, the demo model as data files under <prefix>/share/colibri,
and a Python without the `gui` extra gets an install hint instead of a traceback. The package
is laid out by setuptools' own build_py / install_data commands (what a wheel build runs),
without compiling the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setup(*args: str) -> None:
    run = subprocess.run([sys.executable, "setup.py", "-q", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr


def test_built_package_carries_icons_and_style_sheets(tmp_path):
    _setup("build_py", "--build-lib", str(tmp_path))
    code = ("from colibri.inspector import resources\n"
            "print(resources.PACKAGE_DATA)\n"
            "print(len(resources.icon_names()), resources.icon_path('colibri').stat().st_size > 0)\n"
            "print('Base look' in resources.style_sheet())\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    where, icons, sheet = run.stdout.splitlines()
    assert Path(where).is_relative_to(tmp_path)
    assert icons == f"{len(list((REPO / 'app/colibri/inspector/icons').glob('*.svg')))} True"
    assert sheet == "True"


def test_install_puts_the_demo_model_under_share(tmp_path):
    _setup("install_data", "--install-dir", str(tmp_path))
    installed = tmp_path / "share" / "colibri" / "demo" / "demo.colibri"
    assert installed.read_bytes() == (REPO / "resources" / "demo" / "demo.colibri").read_bytes()


def test_without_the_gui_extra_the_entry_point_says_what_to_install():
    code = ("import sys; sys.modules['PySide6'] = None\n"
            "from colibri.inspector import main\n"
            "sys.exit(main([]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 2
    assert "pip install 'colibri-moe[gui]'" in run.stderr and "Traceback" not in run.stderr


def test_dev_without_a_verb_prints_its_usage():
    run = subprocess.run([str(REPO / "dev")], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 2
    assert run.stderr.startswith("usage: ./dev VERB") and "set -euo" not in run.stderr
    assert all(verb in run.stderr for verb in ("inspect", "test", "setup", "run"))
