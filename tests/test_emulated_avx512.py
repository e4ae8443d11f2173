"""The AVX-512 kernels that promise exact bits (VNNI int8 products and their dispatch, the
jitter-lab variants' loops, vdpbf16ps dot products; the default path's float tiles against
stepping and the portable path) on an emulated Sapphire Rapids:
tools/emulate_avx512.py runs them in BochsCPU and compares every output's bits with the portable
definitions, so a suite run on an AVX2-only machine checks the AVX-512 path too (on AVX-512
machines the kernel tests run it natively as well)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64" or sys.version_info[:2] != (3, 11),
                    reason="the pinned emulator wheel is CPython 3.11 on x86-64 Linux")
def test_avx512_kernels_give_the_definitions_bits_on_an_emulated_cpu() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "emulate_avx512.py")], capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "282 of 282 cases gave the definitions' bits" in run.stdout, run.stdout
