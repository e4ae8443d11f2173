"""`colibri trace`: run a prompt under the debugger and write its Chrome Trace Event JSON."""

from __future__ import annotations

import argparse
import os
from typing import Any

from colibri.cli.common import (EXIT_OK, add_file, add_generate, add_intervene, add_numerics,
                                add_prompt,
                                add_routing, add_threads, caching_options, open_model,
                                prompt_ids, tokenizer_of)

TRACE_EPILOG = """\
The trace opens in ui.perfetto.dev and chrome://tracing: one slice per position ("token 17
'the'") on a prefill or decode thread, nested slices per layer and per phase (attention, router,
experts, combine), the routing decision in the router slice's args, a tokens-per-second counter.
--csv also writes the routing trace as CSV; --session saves the whole debugging session.
--embedding X.npy runs float32 [positions, hidden] rows as the prompt (as colibri run does);
--intervene SPEC (repeatable; docs/interventions.md) runs under interventions: the router slices
name the kinds that acted, the CSV has an interventions column, and the session keeps them."""


def cmd_trace(args: argparse.Namespace) -> int:
    from colibri.debugging.run import Debugger
    from colibri.debugging.session_file import save_session
    from colibri.debugging.trace_export import write_chrome_trace, write_routing_csv
    from colibri.values import RunSettings

    from colibri.cli.run import load_embedding

    caching = caching_options(args)
    with open_model(args.file) as model:
        rows = None
        if args.embedding is not None:
            rows = load_embedding(args.embedding, model.hparams.d_model)
            prompt: list[int] = []
        else:
            prompt = prompt_ids(args, model, tokenizer_of(model, needed=args.prompt is not None))
        settings = RunSettings(tuple(prompt), args.generate,
                               "sample" if args.sample else "greedy", args.seed,
                               args.temperature, args.routing, args.epsilon, args.threads,
                               cache_threshold=float(caching["cache_threshold"]),
                               expert_cache=int(caching["expert_cache"]),
                               interventions=tuple(args.intervene), prompt_embeddings=rows,
                               numerics=args.numerics or "default")
        dbg = Debugger(model, settings)
        try:
            dbg.run()
            other = {"model_name": os.path.basename(model.path), "model_path": model.path,
                     "model_size": model.size, "arch": model.arch,
                     "generated": dbg.generated, "text": dbg.generated_text()}
            write_chrome_trace(args.out, dbg.events, settings, other=other)
            if args.csv:
                write_routing_csv(args.csv, dbg.events)
            if args.session:
                save_session(args.session, dbg)
        finally:
            dbg.close()
    print(f"{dbg.position} positions, {len(dbg.events)} routing events; wrote {args.out}")
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("trace", help="run a prompt and export a Chrome/Perfetto trace",
                       epilog=TRACE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_file(p)
    add_prompt(p, embedding=True)
    add_generate(p, 16)
    add_routing(p, seed="sampling and Gumbel routing seed", caching=True)
    add_intervene(p, "run under an intervention (repeatable; docs/interventions.md)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    add_threads(p)
    add_numerics(p, "; recorded in the trace's settings")
    p.add_argument("--out", required=True, metavar="TRACE.json", help="trace file to write")
    p.add_argument("--csv", metavar="ROUTING.csv", help="also write the routing trace as CSV")
    p.add_argument("--session", metavar="FILE.colibri-session",
                   help="also save the debugging session")
    p.set_defaults(func=cmd_trace)
