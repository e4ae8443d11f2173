"""What the atheris targets share (run by tools/run_fuzz.sh): a scratch file per process for the
readers that take a path, and running one target under libFuzzer."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable

import atheris


def scratch_path(name: str) -> str:
    """A file in the temporary directory only this process writes: `colibri-fuzz-{name}-{pid}`."""
    return os.path.join(tempfile.gettempdir(), f"colibri-fuzz-{name}-{os.getpid()}")


def run(test_one_input: Callable[[bytes], None], scratch: str) -> None:
    """libFuzzer on `test_one_input` with this process's command line, `scratch` removed after
    each input: libFuzzer ends the process without returning, so nothing after Fuzz() runs. The
    recursion limit is raised so deeply nested JSON reaches the code under test."""
    def one_input(data: bytes) -> None:
        try:
            test_one_input(data)
        finally:
            if os.path.exists(scratch):
                os.unlink(scratch)

    sys.setrecursionlimit(2000)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
