#!/usr/bin/env python3
"""llama.cpp's own tools, built once into a cache outside the repository.

Colibri compares itself with llama.cpp (GGUF fixtures made by llama.cpp's converter and
quantiser, benchmarks against llama-bench). The network here reaches package registries only, so
llama.cpp's sources come from the `llama-cpp-python` source distribution on PyPI, which vendors
a llama.cpp tree; this module pins that distribution (version and sha256), unpacks its
`vendor/llama.cpp`, and builds the CPU-only command-line tools with cmake. Nothing here runs in
CI or in the test suite: it is for the scripts that make fixtures and benchmarks.

    python tools/llamacpp.py fetch              # download and unpack the sources (once)
    python tools/llamacpp.py build              # + build llama-quantize and llama-bench (once)
    python tools/llamacpp.py path quantize      # print a tool's path (building it if needed)

Everything lives under $COLIBRI_CACHE (default ~/.cache/colibri) in `llama.cpp-<version>/`:
`src/` (the vendored tree, convert_hf_to_gguf.py and gguf-py included) and `build/bin/`.
From Python: `from llamacpp import LlamaCpp; tools = LlamaCpp(); tools.quantize()`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

# The llama-cpp-python release whose vendored llama.cpp we build, and its sdist's sha256 (PyPI).
VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"

# Static, CPU-only, no network features: the tools must not depend on anything but libc/libm.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
)
TOOLS = {"quantize": "llama-quantize", "bench": "llama-bench"}


def log(message: str) -> None:
    print(f"[llama.cpp] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("COLIBRI_CACHE", Path.home() / ".cache" / "colibri"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class LlamaCpp:
    """The pinned llama.cpp tree and its tools under `root` (default: the cache)."""

    root: Path = cache_root() / f"llama.cpp-{VERSION}"

    @property
    def source(self) -> Path:
        return self.root / "src"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def convert_script(self) -> Path:
        """convert_hf_to_gguf.py (it imports the `gguf-py` and `conversion` beside it)."""
        return self.fetch() / "convert_hf_to_gguf.py"

    def fetch(self) -> Path:
        """Download the pinned sdist (pip, checked against SDIST_SHA256) and unpack its
        vendor/llama.cpp into `source`, atomically; a no-op when already there."""
        if (self.source / "convert_hf_to_gguf.py").is_file():
            return self.source
        downloads = self.root.parent / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        archive = downloads / SDIST
        if not archive.is_file() or _sha256(archive) != SDIST_SHA256:
            log(f"downloading llama-cpp-python {VERSION} (source distribution)")
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--no-binary", ":all:",
                            f"llama-cpp-python=={VERSION}", "-d", str(downloads)], check=True)
        got = _sha256(archive)
        if got != SDIST_SHA256:
            raise SystemExit(f"{archive}: sha256 {got}, expected {SDIST_SHA256}")
        self.root.mkdir(parents=True, exist_ok=True)
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        with tempfile.TemporaryDirectory(dir=self.root) as tmp, tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            tar.extractall(tmp, members=members, filter="data")
            os.replace(Path(tmp) / prefix, self.source)
        log(f"sources in {self.source}")
        return self.source

    def build(self, targets: tuple[str, ...] = tuple(TOOLS.values()), jobs: int | None = None
              ) -> Path:
        """Configure and build `targets` (cmake, CPU only); returns the bin directory."""
        source = self.fetch()
        bin_dir = self.build_dir / "bin"
        missing = [t for t in targets if not (bin_dir / t).is_file()]
        if not missing:
            return bin_dir
        if shutil.which("cmake") is None:
            raise SystemExit("cmake is needed to build llama.cpp (apt-get install cmake)")
        if not (self.build_dir / "CMakeCache.txt").is_file():
            log("configuring")
            subprocess.run(["cmake", "-S", str(source), "-B", str(self.build_dir),
                            *CMAKE_OPTIONS], check=True, stdout=subprocess.DEVNULL)
        log(f"building {', '.join(missing)} (about 50 minutes on two busy cores)")
        subprocess.run(["cmake", "--build", str(self.build_dir), "--target", *missing,
                        "-j", str(jobs or os.cpu_count() or 1)], check=True,
                       stdout=subprocess.DEVNULL)
        return bin_dir

    def tool(self, name: str) -> Path:
        """The path of `quantize` or `bench` (llama-quantize, llama-bench), built if needed."""
        binary = TOOLS.get(name, name)
        return self.build((binary,)) / binary

    def quantize(self) -> Path:
        return self.tool("quantize")

    def bench(self) -> Path:
        return self.tool("bench")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("fetch", help="download and unpack the pinned llama.cpp sources")
    build = sub.add_parser("build", help="build llama-quantize and llama-bench")
    build.add_argument("-j", "--jobs", type=int, default=None)
    path = sub.add_parser("path", help="print the path of a tool (building it if needed)")
    path.add_argument("name", choices=[*TOOLS, "convert", "source"])
    args = parser.parse_args(argv)
    tools = LlamaCpp()
    if args.verb == "fetch":
        print(tools.fetch())
    elif args.verb == "build":
        print(tools.build(jobs=args.jobs))
    elif args.name == "convert":
        print(tools.convert_script)
    elif args.name == "source":
        print(tools.fetch())
    else:
        print(tools.tool(args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
