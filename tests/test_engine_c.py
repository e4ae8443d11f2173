"""The engine's C unit tests (engine_c/tests/test_*.c), built with `make` and run through pytest,
one test binary per pytest case. Each binary ends with the harness's "N passed, N failed" line."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "engine_c"
C_TESTS = sorted(p.stem for p in (ENGINE / "tests").glob("test_*.c"))


@pytest.fixture(scope="module")
def built() -> Path:
    targets = [f"build/tests/{name}" for name in C_TESTS] + ["build/colibri"]
    subprocess.run(["make", "-s", "-C", str(ENGINE), *targets], check=True)
    return ENGINE / "build" / "tests"


@pytest.mark.parametrize("name", C_TESTS)
def test_c_unit_tests_pass(built: Path, name: str) -> None:
    result = subprocess.run([str(built / name)], capture_output=True, text=True, timeout=300)
    tally = re.search(r"(\d+) passed, (\d+) failed", result.stdout)
    assert tally, result.stdout + result.stderr
    assert result.returncode == 0 and tally.group(2) == "0", result.stdout + result.stderr
    assert int(tally.group(1)) > 0
