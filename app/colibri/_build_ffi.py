"""Out-of-line, API-mode cffi build of the engine: produces the extension `colibri._colibri_cffi`.

This is the first of the binding's three layers (build script, typed wrappers in `engine.py`, the
applications). It owns nothing but the build: the declarations come verbatim from the block
between `/* COL_CDEF_BEGIN */` and `/* COL_CDEF_END */` of `engine_c/include/colibri.h`, so the
header stays the single source of the API (the header's `#define COL_*` constants are declared
too, values taken from the header by the compiler), and every `engine_c/src/*.c` is compiled into the
extension (globbed at build time, so a new engine file needs no change here).

API mode (not ABI mode) because the C compiler then checks every declaration against the real
header, and because cffi releases the GIL around each call it generates, so a long prefill on a
worker thread leaves the interpreter (and a GUI) free.

Used by setuptools through `setup(cffi_modules=["app/colibri/_build_ffi.py:ffibuilder"])`; run it
directly (`python app/colibri/_build_ffi.py`) to build the module in place under `app/colibri/`.
"""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI

MODULE_NAME = "colibri._colibri_cffi"
CDEF_BEGIN = "/* COL_CDEF_BEGIN */"
CDEF_END = "/* COL_CDEF_END */"

# cffi executes this file with `__file__` relative to setup.py's directory; resolve it once.
REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO_ROOT / "engine_c"
HEADER = ENGINE_DIR / "include" / "colibri.h"


def read_cdef(header: Path = HEADER) -> str:
    """The declaration block of colibri.h, exactly as written between the two markers."""
    text = header.read_text(encoding="utf-8")
    begin = text.find(CDEF_BEGIN)
    end = text.find(CDEF_END)
    if begin < 0 or end < 0 or end < begin:
        raise RuntimeError(f"{header}: cannot find the {CDEF_BEGIN} ... {CDEF_END} block")
    return text[begin + len(CDEF_BEGIN):end]


def read_constants(header: Path = HEADER) -> str:
    """`#define COL_X ...` declarations for the integer constants the header defines outside the
    block (COL_ABI_VERSION, COL_NO_TENSOR, ...), so Python reads the compiled values from `lib`
    instead of restating them. In API mode cffi takes each value from the real header."""
    names = re.findall(r"^#define\s+(COL_[A-Z0-9_]+)\s+\S", header.read_text(encoding="utf-8"),
                       flags=re.MULTILINE)
    return "".join(f"#define {name} ...\n" for name in names)


def _as_build_path(path: Path, absolute: bool) -> str:
    """setuptools refuses absolute source paths (they must be relative to setup.py's directory,
    the working directory of a pip build); cffi's own `compile()` changes directory, so it needs
    absolute ones."""
    if absolute or not path.is_relative_to(Path.cwd()):
        return str(path)
    return path.relative_to(Path.cwd()).as_posix()


def engine_sources(absolute: bool = False) -> list[str]:
    """Every C source of the engine, sorted for a reproducible build."""
    return [_as_build_path(p, absolute) for p in sorted((ENGINE_DIR / "src").glob("*.c"))]


def make_builder(absolute: bool = False, sanitize: bool = False) -> FFI:
    """The cffi builder. `sanitize` adds AddressSanitizer + UBSan to compile and link (the second
    build CI tests, see tools/asan_python.sh; load it with libasan preloaded)."""
    san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
           "-fno-sanitize-recover=all", "-g"] if sanitize else []
    builder = FFI()
    builder.cdef(read_cdef())
    builder.cdef(read_constants())
    builder.set_source(
        MODULE_NAME,
        '#include "colibri.h"\n',
        sources=engine_sources(absolute),
        include_dirs=[_as_build_path(ENGINE_DIR / d, absolute) for d in ("include", "src")],
        extra_compile_args=["-std=c11", "-O1" if sanitize else "-O2", "-ffp-contract=off",
                            "-D_POSIX_C_SOURCE=200809L", *san],
        extra_link_args=san,
        libraries=["m", "pthread"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    # Development build without pip: compile under build/cffi, then copy the extension next to
    # the package sources (app/colibri/_colibri_cffi.*.so, ignored by git).
    import shutil

    built = make_builder(absolute=True).compile(tmpdir=str(REPO_ROOT / "build" / "cffi"), verbose=True)
    shutil.copy2(built, REPO_ROOT / "app" / "colibri" / Path(built).name)
