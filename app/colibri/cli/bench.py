"""`colibri bench`: prefill and decode speed of a file against this machine's read bandwidth,
measured in the same run (colibri.bench)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from colibri.cli.common import (EXIT_OK, add_file, add_generate, add_json, add_numerics, add_threads,
                                positive_int)
from colibri.values import KERNEL_PATHS


def cmd_bench(args: argparse.Namespace) -> int:
    from colibri import bench

    r = bench.run_bench(args.file, args.p, args.generate, args.threads, args.repeats,
                        args.probe_mb << 20, not args.no_trace_check, args.kernels, args.numerics)
    print(json.dumps(r.to_dict(), indent=2) if args.json else bench.format_result(r))
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("bench", help="prefill/decode speed against this machine's measured "
                                     "read bandwidth")
    add_file(p)
    p.add_argument("-p", type=positive_int, default=128, metavar="N",
                   help="prompt tokens (default 128)")
    # a decode of at least one token: the report is against the bandwidth limit of a decode step
    add_generate(p, 64, "decoded tokens", at_least_one=True)
    add_threads(p)
    p.add_argument("-r", "--repeats", type=positive_int, default=3)
    p.add_argument("--probe-mb", type=int, default=1024, help="bandwidth probe buffer (MiB)")
    p.add_argument("--no-trace-check", action="store_true", help="skip the trace-on decode run")
    p.add_argument("--kernels", choices=KERNEL_PATHS, default=None,
                   help="most capable kernel path to use (default: the best this machine has)")
    add_numerics(p, "; timed against the exact computation in turns")
    add_json(p)
    p.set_defaults(func=cmd_bench)
