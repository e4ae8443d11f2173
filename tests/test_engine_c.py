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
    targets = [f"build/tests/{name}" for name in C_TESTS] + ["build/colibri-c"]
    subprocess.run(["make", "-s", "-C", str(ENGINE), *targets], check=True)
    return ENGINE / "build" / "tests"


@pytest.mark.parametrize("name", C_TESTS)
def test_c_unit_tests_pass(built: Path, name: str) -> None:
    result = subprocess.run([str(built / name)], capture_output=True, text=True, timeout=300)
    tally = re.search(r"(\d+) passed, (\d+) failed", result.stdout)
    assert tally, result.stdout + result.stderr
    assert result.returncode == 0 and tally.group(2) == "0", result.stdout + result.stderr
    assert int(tally.group(1)) > 0


def test_bench_products_prints_the_seconds_of_each_pass() -> None:
    """engine_c/build/bench_products: one JSON line with a time per repeat and the path that ran;
    a wrong command line is refused with status 2."""
    import json

    subprocess.run(["make", "-s", "-C", str(ENGINE), "build/bench_products"], check=True)
    binary = ENGINE / "build" / "bench_products"
    for dtype in ("f32", "bf16", "q4_0"):
        result = subprocess.run([str(binary), dtype, "48", "64", "5", "--threads", "2", "--megabytes", "1",
                                 "--repeats", "3"], capture_output=True, text=True, timeout=120, check=True)
        report = json.loads(result.stdout)
        assert (report["dtype"], report["rows"], report["cols"], report["tokens"]) == (dtype, 48, 64, 5)
        assert report["kernels"] in ("portable", "avx2", "avx512f", "avx512", "amx") and report["copies"] >= 2
        assert len(report["seconds"]) == 3 and all(s > 0 for s in report["seconds"])
    for wrong in (["f64", "8", "8", "1"], ["q8_0", "8", "40", "1"], ["f32", "8", "8", "0"],
                  ["f32", "8", "8", "1", "--kernels", "sse"]):
        assert subprocess.run([str(binary), *wrong], capture_output=True).returncode == 2
