"""`colibri trace`: run a prompt under the debugger and write its Chrome Trace Event JSON.

Registered in colibri/cli.py; returns the CLI's exit codes (0 ok, 1 bad input, 2 unreadable).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

TRACE_EPILOG = """\
The trace opens in ui.perfetto.dev and chrome://tracing: one slice per position ("token 17
'the'") on a prefill or decode thread, nested slices per layer and per phase (attention, router,
experts, combine), the routing decision in the router slice's args, a tokens-per-second counter.
--csv also writes the routing trace as CSV; --session saves the whole debugging session."""


def add_trace_parser(sub: Any) -> None:
    p = sub.add_parser("trace", help="run a prompt and export a Chrome/Perfetto trace",
                       epilog=TRACE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", metavar="TEXT", help="text, encoded by the embedded tokenizer")
    source.add_argument("--tokens", metavar="ID,ID,...", help="comma-separated token ids")
    p.add_argument("-n", type=int, default=16, metavar="N", help="tokens to generate (default 16)")
    p.add_argument("--routing", choices=("topk", "stable", "soft", "gumbel"), default="topk")
    p.add_argument("--epsilon", type=float, default=None,
                   help="stable-routing epsilon (default: the model's default_epsilon)")
    p.add_argument("--seed", type=int, default=0, help="sampling and Gumbel routing seed")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True, metavar="TRACE.json", help="trace file to write")
    p.add_argument("--csv", metavar="ROUTING.csv", help="also write the routing trace as CSV")
    p.add_argument("--session", metavar="FILE.colibri-session",
                   help="also save the debugging session")
    p.set_defaults(func=cmd_trace)


def _err(message: str) -> None:
    print(f"colibri: {message}", file=sys.stderr)


def cmd_trace(args: argparse.Namespace) -> int:
    from colibri.debugging.run import Debugger, RunSettings
    from colibri.debugging.session_file import save_session
    from colibri.debugging.trace_export import write_chrome_trace, write_routing_csv
    from colibri.engine import Model
    from colibri.errors import ColibriError, ColibriIOError

    if not os.path.isfile(args.file):
        _err(f"{args.file}: no such file" if not os.path.exists(args.file)
             else f"{args.file}: is a directory")
        return 2
    try:
        model = Model.open(args.file)
    except ColibriIOError as exc:
        _err(str(exc))
        return 2
    except ColibriError as exc:
        _err(str(exc))
        return 1
    with model:
        try:
            if args.prompt is not None:
                tokenizer = model.tokenizer
                if tokenizer is None:
                    _err(f"{args.file} has no tokenizer; use --tokens ID,ID,...")
                    return 1
                prompt = list(tokenizer.encode(args.prompt).ids)
            else:
                prompt = [int(t) for t in args.tokens.replace(" ", "").split(",") if t]
            settings = RunSettings(tuple(prompt), args.n,
                                   "sample" if args.sample else "greedy", args.seed,
                                   args.temperature, args.routing, args.epsilon, args.threads)
            dbg = Debugger(model, settings)
            dbg.run()
            other = {"model_name": os.path.basename(model.path), "model_path": model.path,
                     "model_size": model.size, "arch": model.arch,
                     "generated": dbg.generated, "text": dbg.generated_text()}
            write_chrome_trace(args.out, dbg.events, settings, other=other)
            if args.csv:
                write_routing_csv(args.csv, dbg.events)
            if args.session:
                save_session(args.session, dbg)
            dbg.close()
        except (ColibriError, ValueError) as exc:
            _err(str(exc))
            return 1
        except OSError as exc:
            _err(str(exc))
            return 2
    print(f"{dbg.position} positions, {len(dbg.events)} routing events; wrote {args.out}")
    return 0
