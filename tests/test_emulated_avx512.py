"""The AVX-512 kernels that promise exact bits (VNNI int8 products and their dispatch, the
jitter-lab variants' loops, vdpbf16ps dot products over bf16 rows and panels; the default path's
float tiles against stepping and the portable path) on an emulated Sapphire Rapids:
tools/emulate_avx512.py runs them in BochsCPU and compares every output's bits with the portable
definitions, so a suite run on an AVX2-only machine checks the AVX-512 path too (on AVX-512
machines the kernel tests run it natively as well). And the avx512f path on an emulated Cannon
Lake, an AVX-512 CPU without VNNI: no CPU this suite runs on can show that it needs none."""

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
    assert "325 of 325 cases gave the definitions' bits" in run.stdout, run.stdout


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64" or sys.version_info[:2] != (3, 11),
                    reason="the pinned emulator wheel is CPython 3.11 on x86-64 Linux")
def test_avx512f_path_needs_no_vnni_on_an_emulated_cannon_lake() -> None:
    """The avx512f path (AVX-512 CPUs without VNNI) on an emulated Cannon Lake, which lacks VNNI
    as Skylake-SP/X do: its int8 and float kernels, and bf16 dot products without vdpbf16ps, give
    the definitions' bits, and the VNNI kernels, run as controls, fault there."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "emulate_avx512.py"), "--cpu", "cannonlake"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "98 of 98 cases gave the definitions' bits on the emulated AVX-512 CPU without VNNI" in run.stdout, run.stdout
    assert "2 VNNI kernel(s) run as controls: each must fault there" in run.stdout, run.stdout
