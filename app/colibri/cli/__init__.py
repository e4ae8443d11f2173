"""`colibri`: the command line over the public Python API.

The API's first user and a debugging aid that needs no GUI. One module per command group, each
registering its commands with `add_commands(subparsers)`:

    convert                      colibri.cli.convert
    bench                        colibri.cli.bench
    validate, info, dump         colibri.cli.files
    run                          colibri.cli.run
    serve                        colibri.cli.serve
    trace                        colibri.cli.trace
    jitter, epsilon, remedies,   colibri.cli.jitter
    lab
    profile                      colibri.cli.profile
    diff                         colibri.cli.diff

What they share (exit codes, the error printer, how a path is opened, the common arguments) is
colibri.cli.common. A command returns its exit code or raises; `main` prints any engine, file or
argument error as one line (`colibri: ...`) and returns 1, or 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from colibri.cli import bench, convert, diff, files, jitter, profile, run, serve, trace
from colibri.cli.common import EXIT_OK, CommandError, failure
from colibri.errors import ColibriError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colibri", description="Colibri MoE engine: convert, validate, inspect and run "
                                    ".colibri files.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (convert, bench, files, run, serve, trace, jitter, profile, diff):
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:  # `colibri info big.colibri | head`
        sys.stderr.close()
        return EXIT_OK
    except (CommandError, ColibriError, OSError, ValueError) as exc:
        return failure(exc)
    return code


__all__ = ["build_parser", "main"]
