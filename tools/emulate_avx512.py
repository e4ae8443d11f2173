#!/usr/bin/env python3
"""The AVX-512 kernels that promise exact bits, checked on a CPU without AVX-512: an emulated
Sapphire Rapids runs them and compares every output's bits with the portable definition.

The engine's AVX-512 kernels run only where the CPU has AVX-512; on an AVX2 machine the test suite
cannot reach them. This tool builds engine_c/tests/emu_avx512.c with the engine's sources as a
freestanding static program (no C library, no threads: a kernel and its definition in one
process) and runs it on BochsCPU, Bochs's x86 interpreter as a library (PyPI `bochscpu-python`),
case by case:
  * int8: q8_0, q4_0 and their 8-row panels (VNNI, kernels_int8_avx512.c and the dispatch in
    kernels_x86.c) against col_dotq_stored; rows around 16 (the lanes) and 8 (a panel), 1 and 7
    panels; 1, 3, 5, 17, 32 and 137 blocks of columns; 1 to 40 tokens (decode, the stored panels'
    one-token tiles, and the packed batch passes); both entry points;
  * numerics: every jitter-lab variant's AVX-512 loops (seq, pairwise, blocked L, with fma and
    split partial sums) on f32, f16, bf16, q8_0 and q4_0 rows and q8_0/q4_0 8-row panels against
    the reference loops;
  * bf16dot: vdpbf16ps (AVX512-BF16), and its arithmetic in AVX-512 F/BW for CPUs without it,
    against col_rows_bf16dot_portable, whole and partial blocks, bf16 rows and bf16x16 panels;
  * float: the default path's f32, f16 and bf16 tiles, whose bits differ from the portable path's
    by design (bf16x16's do not: both are one fused chain a row), a batch against its tokens one
    at a time (bits), and against col_rows_portable within 2^-16 of the largest output.
Any output whose bits differ (or, for float, lies too far), a fault or a run that does not reach
its end fails the case. It checks bits, not speed; AMX is not covered (Bochs's Sapphire Rapids
reports no AMX).

bochscpu-python 0.4.0's wheel (pinned by sha256) is fetched with pip into a cache outside the
repository (~/.cache/colibri/bochscpu-0.4.0) and changed there in two ways, both checked byte by
byte first:
  * its Bochs emulates a Cannon Lake by default (AVX-512 without VNNI or BF16): the two immediates
    of the call that registers the CPU-model parameter (the list's length and its default) are set
    to name the next two models of Bochs's own list, tigerlake and sapphire_rapids, the default
    becoming sapphire_rapids (CPUID then reports AVX512_VNNI and AVX512_BF16);
  * it was linked against glibc 2.38 and asks for __isoc23_strtoull and __isoc23_sscanf, which
    older C libraries lack: a small shared library of the two (built here with cc) is loaded first.

With `--cpu cannonlake` the package is used as it comes (its Cannon Lake: AVX-512 F/BW/VL without
VNNI or BF16, the class of Colibri's avx512f path; Skylake-SP/X have the same AVX-512 subset but
for VBMI and IFMA, which the kernels do not use): the avx512f path's kernels (its int8 products in
their AVX-512BW form, the float tiles, the jitter-lab loops, bf16 dot products without vdpbf16ps)
must give the same bits there, and the VNNI kernels must fault (#UD), which shows the emulated CPU
lacks what the path avoids.

    python tools/emulate_avx512.py [--cpu sapphire_rapids|cannonlake] [--quick]
                                   [--case KIND:DTYPE:ROWS:COLS:TOKENS[:ENTRY]] [-v]

tests/test_emulated_avx512.py runs the whole set (about a minute) in the suite. Needs cc (gcc or clang),
nm and pip (the first run downloads 2 MB from PyPI).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine_c"
VERSION = "0.4.0"
WHEEL = f"bochscpu_python-{VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "08297de4c657fcda712c66745388cf81cd056e01083473c44868b96f6ea020ad"
LIBRARY = "bochscpu/_bochscpu.cpython-311-x86_64-linux-gnu.so"
LIBRARY_SHA256 = "a872ef067d57b4d9de17370e1e26a41e2790960518729363627adb50fbd035fe"
# The CPU-model parameter's registration: `mov $28, %r8d` (models in its list) and `mov $27,
# %r9d` (the default, corei3_cnl in Bochs's numbering) become 31 and 30 (sapphire_rapids).
MODEL_PATCH = ((0x44A6FC, bytes.fromhex("41b81c000000"), bytes.fromhex("41b81f000000")),
               (0x44A702, bytes.fromhex("41b91b000000"), bytes.fromhex("41b91e000000")))
SHIM_C = """
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
unsigned long long __isoc23_strtoull(const char *s, char **end, int base) { return strtoull(s, end, base); }
int __isoc23_sscanf(const char *s, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    int n = vsscanf(s, format, args);
    va_end(args);
    return n;
}
"""
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q8_0x8", "q4_0x8", "bf16x16")
KINDS = {"int8": 0, "numerics": 1, "bf16dot": 2, "float": 3}
REDUCTIONS = {"seq": 1, "pairwise": 2, "blocked": 3}
# the variants tests/test_numerics.c checks natively: (reduction, lanes, fma, split)
VARIANTS = {"seq": (1, 0, 0, 0), "seq+fma": (1, 0, 1, 0), "pairwise": (2, 0, 0, 0), "pairwise+fma": (2, 0, 1, 0),
            "blocked1": (3, 1, 0, 0), "blocked3": (3, 3, 0, 0), "blocked4": (3, 4, 0, 0), "blocked8+fma": (3, 8, 1, 0),
            "blocked16": (3, 16, 0, 0), "blocked32+fma": (3, 32, 1, 0), "blocked100": (3, 100, 0, 0),
            "blocked256+fma": (3, 256, 1, 0), "seq+split2": (1, 0, 0, 2), "seq+split4": (1, 0, 0, 4),
            "pairwise+split3": (2, 0, 0, 3), "blocked8+fma+split4": (3, 8, 1, 4), "blocked16+split7": (3, 16, 0, 7),
            "seq+split256": (1, 0, 0, 256)}
ENTRIES = {"dispatch": 0, "int8": 1, "avx512f": 2}
CPUS = ("sapphire_rapids", "cannonlake")
INVALID_OPCODE = 6
PAGE = 4096
STACK_TOP, STACK_PAGES = 0x7FFF0000, 64
PML4 = 0x100000
GPA_FIRST = 0x1000000
DONE = 0x600D
GENERAL_PROTECTION = 13  # the hlt that ends the program, at CPL 3


def log(message: str) -> None:
    print(f"[emulate-avx512] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("COLIBRI_CACHE", Path.home() / ".cache" / "colibri")) / f"bochscpu-{VERSION}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_emulator(cpu: str = "sapphire_rapids") -> Path:
    """The package under the cache, patched to emulate a Sapphire Rapids or as it comes (Cannon
    Lake), made once; returns the directory to import it from."""
    root = cache_dir()
    site = root / ("site" if cpu == "sapphire_rapids" else f"site-{cpu}")
    library = site / LIBRARY
    shim = root / "libisoc23.so"
    if library.exists() and shim.exists():
        return site
    downloads = root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = downloads / WHEEL
    if not wheel.exists():
        log(f"downloading bochscpu-python {VERSION}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64",
                        f"bochscpu-python=={VERSION}", "-d", str(downloads)], check=True)
    if _sha256(wheel) != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 differs from the pinned {WHEEL_SHA256}")
    tmp = Path(tempfile.mkdtemp(dir=root))
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
        unpacked = tmp / LIBRARY
        if _sha256(unpacked) != LIBRARY_SHA256:
            raise SystemExit(f"{LIBRARY}: sha256 differs from the pinned {LIBRARY_SHA256}")
        code = bytearray(unpacked.read_bytes())
        for offset, before, after in MODEL_PATCH if cpu == "sapphire_rapids" else ():
            if code[offset:offset + len(before)] != before:
                raise SystemExit(f"{LIBRARY}: unexpected bytes at {offset:#x}")
            code[offset:offset + len(after)] = after
        unpacked.write_bytes(bytes(code))
        if not shim.exists():
            (tmp / "isoc23.c").write_text(SHIM_C)
            subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", str(tmp / "isoc23.c"), "-o",
                            str(shim)], check=True)
        if site.exists():
            raise SystemExit(f"{site} exists without its library: remove it and run again")
        tmp.rename(site)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return site


def build_program(out: Path) -> Path:
    """emu_avx512.c and the engine's sources, freestanding and static, into `out`."""
    cc = os.environ.get("CC", "cc")
    flags = ["-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror",
             "-ffreestanding", "-fno-stack-protector", "-fno-pic", "-fno-pie", "-ffp-contract=off",
             "-fcf-protection=none", "-ffunction-sections", "-fdata-sections",
             "-I", str(ENGINE / "include"), "-I", str(ENGINE / "src"),
             # this Bochs raises #UD on a gather whose index is zmm16-31 (EVEX.V' set): keep
             # the compiler off those registers
             *[f"-ffixed-xmm{i}" for i in range(16, 32)]]
    sources = [ENGINE / "tests" / "emu_avx512.c", *sorted((ENGINE / "src").glob("*.c"))]
    objects = []
    for source in sources:
        obj = out.parent / (source.stem + ".o")
        subprocess.run([cc, *flags, "-c", str(source), "-o", str(obj)], check=True)
        objects.append(str(obj))
    # Only the products' code is reached; what it never calls (the C library, threads) stays
    # unresolved, and a call to it would fault in the emulator, failing the case.
    subprocess.run([cc, "-nostdlib", "-static", "-no-pie", "-o", str(out), *objects, "-Wl,-e,_start",
                    "-Wl,--gc-sections", "-Wl,--unresolved-symbols=ignore-all", "-lgcc"], check=True)
    return out


def dtype_numbers() -> dict[str, int]:
    """The dtypes' numbers, from the public header's enum."""
    header = (ENGINE / "include" / "colibri.h").read_text()
    return {name: int(re.search(rf"^\s*COL_DTYPE_{name.upper()}\s*=\s*(\d+)", header, re.M).group(1))
            for name in DTYPES}


@dataclass
class Case:
    kind: str
    dtype: str
    rows: int
    cols: int
    tokens: int
    entry: str = "dispatch"  # int8: "dispatch", "int8" or "avx512f"; numerics: the variant's name
    seed: int = 1
    faults: bool = False  # a control: the CPU lacks an instruction the kernel uses (#UD)

    def __str__(self) -> str:
        return f"{self.kind} {self.dtype} {self.rows} x {self.cols}, {self.tokens} token(s), {self.entry}"

    def fields(self, dtypes: dict[str, int]) -> tuple[int, ...]:
        variant = VARIANTS[self.entry] if self.kind == "numerics" else (0, 0, 0, 0)
        entry = ENTRIES.get(self.entry, 0)
        return (KINDS[self.kind], dtypes[self.dtype], self.rows, self.cols, self.tokens, self.seed, entry, *variant)


class Machine:
    """One emulated CPU with the program's segments mapped (identity virtual addresses)."""

    def __init__(self, program: Path, site: Path) -> None:
        ctypes.CDLL(str(site.parent / "libisoc23.so"), mode=ctypes.RTLD_GLOBAL)
        sys.path.insert(0, str(site))
        import bochscpu
        import bochscpu.cpu
        import bochscpu.memory

        self.bochscpu = bochscpu
        self.symbols = {}
        for line in subprocess.run(["nm", str(program)], capture_output=True, text=True, check=True).stdout.splitlines():
            fields = line.split()
            if len(fields) == 3:
                self.symbols[fields[2]] = int(fields[0], 16)
        data = program.read_bytes()
        self.entry, phoff = struct.unpack_from("<QQ", data, 0x18)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        self.session = bochscpu.Session()

        def missing_page(gpa: int) -> None:
            raise RuntimeError(f"the program touched unmapped memory at {gpa:#x}")

        self.session.missing_page_handler = missing_page
        self.tables = bochscpu.memory.PageMapLevel4Table()
        self._next_gpa = GPA_FIRST
        self._mapped: set[int] = set()
        segments = []
        for i in range(phnum):
            kind, _, offset, vaddr, _, filesz, memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
            if kind != 1:  # PT_LOAD
                continue
            self._map(vaddr, vaddr + memsz)
            segments.append((vaddr, data[offset:offset + filesz] + bytes(memsz - filesz)))
        self._map(STACK_TOP - STACK_PAGES * PAGE, STACK_TOP)
        for hva, gpa in self.tables.commit(PML4):
            bochscpu.memory.page_insert(gpa, hva)
        for vaddr, blob in segments:
            for at in range(0, len(blob), 1 << 16):
                self.write(vaddr + at, blob[at:at + (1 << 16)])

    def _map(self, lo: int, hi: int) -> None:
        for gva in range(lo & ~(PAGE - 1), hi, PAGE):
            if gva in self._mapped:
                continue
            hva = self.bochscpu.memory.allocate_host_page()
            self.bochscpu.memory.page_insert(self._next_gpa, hva)
            self.tables.insert(gva, self._next_gpa, 1)
            self._mapped.add(gva)
            self._next_gpa += PAGE

    def write(self, address: int, blob: bytes) -> None:
        if not self.bochscpu.memory.virt_write(PML4, address, bytearray(blob)):
            raise RuntimeError(f"cannot write {len(blob)} bytes at {address:#x}")

    def read(self, address: int, size: int) -> bytes:
        return bytes(self.bochscpu.memory.virt_read(PML4, address, size))

    def run(self) -> dict[str, Any]:
        """From _start to the hlt (or the first fault): the exception's vector and where."""
        bochscpu = self.bochscpu
        state = bochscpu.State()
        bochscpu.cpu.set_long_mode(state)
        state.cr3 = PML4
        state.cr4 = state.cr4 | (1 << 9) | (1 << 10) | (1 << 18)  # OSFXSR, OSXMMEXCPT, OSXSAVE
        state.xcr0 = 0xE7  # x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
        state.mxcsr = 0x1F80  # every SIMD floating-point exception masked, as Linux starts a process
        state.fpcw = 0x37F
        state.rsp, state.rip = STACK_TOP - 8, self.entry
        code, data = bochscpu.Segment(), bochscpu.Segment()
        for segment, selector, attr in ((code, 0x33, 0x22FB), (data, 0x2B, 0xCF3)):
            segment.present, segment.selector, segment.base, segment.limit, segment.attr = True, selector, 0, 0xFFFFFFFF, attr
        state.cs = code
        state.ds = state.ss = state.es = state.fs = state.gs = data
        self.session.cpu.state = state
        stop: dict[str, Any] = {}

        def exception(session: Any, cpu: int, vector: int, error: int) -> None:
            stop.update(vector=vector, error=error, rip=session.cpu.rip)
            session.stop()

        hook = bochscpu.Hook()
        hook.exception = exception
        self.session.run([hook])
        return stop

    def run_case(self, case: Case, dtypes: dict[str, int]) -> tuple[bool, str]:
        self.write(self.symbols["emu_case"], struct.pack("<11Q", *case.fields(dtypes)))
        self.write(self.symbols["emu_result"], bytes(32))
        began = time.time()
        stop = self.run()
        differ, outputs, nonzero, done = struct.unpack("<4Q", self.read(self.symbols["emu_result"], 32))
        took = time.time() - began
        if case.faults:
            if done != DONE and stop.get("vector") == INVALID_OPCODE:
                return True, f"faulted (#UD at {stop.get('rip', 0):#x}), as it must without the instruction ({took:.1f} s)"
            return False, f"ran to exception {stop.get('vector')} (done {done:#x}) where it should fault with #UD"
        if done != DONE or stop.get("vector") != GENERAL_PROTECTION:
            return False, f"stopped by exception {stop.get('vector')} at {stop.get('rip', 0):#x} before its end ({took:.1f} s)"
        if outputs != case.rows * case.tokens or nonzero == 0 or differ:
            return False, f"{differ} of {outputs} outputs differ from the definition ({nonzero} not zero)"

        return True, f"{outputs} outputs, bits equal ({took:.1f} s)"


def cases(quick: bool) -> list[Case]:
    out = []
    shapes = [(16, 1024), (40, 544), (24, 4384)] if not quick else [(16, 1024), (40, 544)]
    tokens = [1, 2, 8, 9, 13, 40] if not quick else [1, 9, 13]
    for dtype in ("q8_0", "q4_0", "q8_0x8", "q4_0x8"):
        for rows, cols in shapes:
            for nt in tokens:
                out.append(Case("int8", dtype, rows, cols, nt))
    out += [Case("int8", "q8_0", 40, 1024, 13, "int8"), Case("int8", "q4_0", 40, 544, 9, "int8")]
    # the stored panels' one-token kernel: one panel (a lone 8-lane tile) and 7 (tiles of 2 and 1),
    # one block, three (a partial q4_0 group), five
    out += [Case("int8", "q4_0x8", 8, 96, 1), Case("int8", "q8_0x8", 8, 96, 3, "int8"),
            Case("int8", "q8_0x8", 56, 160, 1), Case("int8", "q4_0x8", 56, 32, 5, "int8")]
    few = ["seq", "pairwise+fma", "blocked8+fma", "blocked100", "seq+split4"]
    variants = list(VARIANTS) if not quick else few
    numerics_shapes = {"q8_0": ((37, 1056, 5), (7, 96, 1)), "q4_0": ((37, 1056, 5), (7, 96, 1)),
                       # panels: a group of two halves (40 rows: 32, then 8 with 24 missing), one panel
                       "q8_0x8": ((40, 1056, 5), (8, 96, 1)), "q4_0x8": ((40, 1056, 5), (8, 96, 1))}
    for dtype in ("f32", "f16", "bf16", "q8_0", "q4_0", "q8_0x8", "q4_0x8"):
        for rows, cols, nt in numerics_shapes.get(dtype, ((37, 100, 5), (16, 1056, 1))):
            # the panels' own code is their fill; the reductions after it are every dtype's
            for variant in variants if dtype in ("f32", "f16", "bf16", "q8_0", "q4_0") else few:
                out.append(Case("numerics", dtype, rows, cols, nt, variant))
    for cols in ((7, 32, 45, 100, 1056) if not quick else (45, 1056)):
        for rows, nt in ((7, 1), (37, 1), (37, 5), (37, 9)):
            out.append(Case("bf16dot", "bf16", rows, cols, nt))
    # bf16x16 panels: one panel, tiles of 3 and the 2 left over (80 rows), 4 decode streams and 1
    for rows, cols, nt in ((16, 2, 3), (48, 100, 1), (80, 30, 17), (80, 1056, 9)):
        out.append(Case("bf16dot", "bf16x16", rows, cols, nt))
        out.append(Case("float", "bf16x16", rows, cols, nt))
    for rows, cols, nt in ((48, 1056, 5), (16, 96, 1)):
        for variant in few:
            out.append(Case("numerics", "bf16x16", rows, cols, nt, variant))
    for dtype in ("f32", "f16", "bf16"):
        for rows, cols, nt in ((37, 100, 1), (37, 100, 9), (80, 4384, 13)) if not quick else ((37, 100, 9),):
            out.append(Case("float", dtype, rows, cols, nt))
    return out


def cannonlake_cases(quick: bool) -> list[Case]:
    """The avx512f path's kernels, and the VNNI kernels as controls that must fault."""
    out = []
    shapes = [(16, 1024), (24, 544), (40, 4384)] if not quick else [(24, 544)]
    for dtype in ("q8_0x8", "q4_0x8", "q8_0", "q4_0"):
        for rows, cols in shapes:
            for nt in ((1, 2, 3, 12, 13, 40) if not quick else (1, 13)):
                out.append(Case("int8", dtype, rows, cols, nt, "avx512f"))
    for dtype in ("f32", "f16", "bf16"):
        for rows, cols, nt in ((37, 100, 1), (37, 100, 9), (80, 4384, 13)) if not quick else ((37, 100, 9),):
            out.append(Case("float", dtype, rows, cols, nt))
    out += [Case("float", "bf16x16", 80, 1056, 9), Case("float", "bf16x16", 48, 100, 1)]
    # bf16 dot products without vdpbf16ps: rows with a partial block, decode and batches; panels
    for dtype, rows, cols, nt in (("bf16", 7, 45, 1), ("bf16", 37, 1056, 1), ("bf16", 37, 100, 9),
                                  ("bf16x16", 80, 1056, 9), ("bf16x16", 48, 100, 1), ("bf16x16", 80, 30, 17)):
        out.append(Case("bf16dot", dtype, rows, cols, nt, "avx512f"))
    for dtype in ("bf16", "q8_0", "q4_0x8"):
        for variant in ("seq", "blocked8+fma", "pairwise+split3"):
            out.append(Case("numerics", dtype, 40 if dtype == "q4_0x8" else 37, 1056, 5, variant))
    out += [Case("int8", "q8_0x8", 16, 1024, 13, "dispatch", faults=True),
            Case("int8", "q4_0", 16, 544, 9, "int8", faults=True)]
    return out


def parse_case(text: str) -> Case:
    parts = text.split(":")
    if len(parts) not in (5, 6) or parts[0] not in KINDS or parts[1] not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text}: KIND:DTYPE:ROWS:COLS:TOKENS[:ENTRY]")
    entry = parts[5] if len(parts) == 6 else ("seq" if parts[0] == "numerics" else "dispatch")
    if entry not in ENTRIES and entry not in VARIANTS:
        raise argparse.ArgumentTypeError(f"{text}: unknown entry or variant {entry}")
    return Case(parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4]), entry)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", choices=CPUS, default="sapphire_rapids",
                    help="the emulated CPU: AVX-512 with VNNI and BF16, or without them (the avx512f path)")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and token counts")
    ap.add_argument("--case", type=parse_case, action="append", default=[], metavar="KIND:DTYPE:ROWS:COLS:TOKENS[:ENTRY]")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case, not only failures")
    args = ap.parse_args(argv)
    site = ensure_emulator(args.cpu)
    dtypes = dtype_numbers()
    with tempfile.TemporaryDirectory(prefix="colibri-emu-") as tmp:
        program = build_program(Path(tmp) / "emu_int8_avx512")
        machine = Machine(program, site)
        failed = 0
        todo = args.case or (cases(args.quick) if args.cpu == "sapphire_rapids" else cannonlake_cases(args.quick))
        for case in todo:
            if case.rows > 80 or case.cols > 4384 or case.tokens > 40:
                raise SystemExit(f"{case}: beyond the program's buffers (80 rows, 4384 columns, 40 tokens)")
            if case.dtype.startswith("q") and case.cols % 32 or case.dtype.endswith("x8") and case.rows % 8:
                raise SystemExit(f"{case}: quantised rows hold whole blocks of 32, panels whole 8 rows")
            ok, detail = machine.run_case(case, dtypes)
            failed += not ok
            if args.verbose or not ok:
                print(f"{'ok  ' if ok else 'FAIL'} {case}: {detail}", flush=True)
        controls = sum(case.faults for case in todo)
        print(f"{len(todo) - controls - failed} of {len(todo) - controls} cases gave the definitions' bits on the "
              f"emulated AVX-512 CPU" + (" without VNNI" if args.cpu == "cannonlake" else ""))
        if controls:
            print(f"{controls} VNNI kernel(s) run as controls: each must fault there")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
