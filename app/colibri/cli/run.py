"""`colibri run`: one prompt, its routing printed or dumped; generation through
`Session.generate`, with the model file hot-reloaded between tokens on SIGUSR1 (colibri.reload).
`colibri serve` is colibri.cli.serve."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from colibri.cli.common import (EXIT_OK, add_file, add_generate, add_prompt, add_routing,
                                add_threads, error, fail, open_model, prompt_ids, token_label,
                                tokenizer_of)
from colibri.files import atomic_write

RUN_EPILOG = """\
positions: the prompt's tokens are processed first, then every generated token except the last
one (its logits are never needed), so a run producing M tokens processes len(prompt) + M - 1
positions (len(prompt) when M is 0). --dump-logits writes float32 [positions, vocab], row i being
the logits after position i (the distribution of token i+1); --dump-trace holds the same
positions: expert_ids int32 [positions, moe_layers, k], expert_weights float32 [positions,
moe_layers, k], router_logits float32 [positions, moe_layers, n_experts], moe_layers int32
[moe_layers] (the layer index of each MoE layer) and tokens int32 [positions].
Decoding is greedy (argmax, lowest id on ties); it stops early after the model's eos token."""


def print_routing(trace: Any, tokenizer: Any, position: int) -> None:
    """One line per MoE layer of `position`: the chosen experts and their weights."""
    token = int(trace.tokens[position])
    for m, layer in enumerate(trace.moe_layers):
        ids = ",".join(str(int(e)) for e in trace.expert_ids[position, m])
        weights = ",".join(f"{float(w):.2f}" for w in trace.expert_weights[position, m])
        print(f"pos {position} token {token_label(tokenizer, token)} layer {int(layer)}: "
              f"experts [{ids}] weights [{weights}]")


def cmd_run(args: argparse.Namespace) -> int:
    from colibri.engine import Session
    from colibri.reload import HotModel, on_sigusr1, session_swapper

    with open_model(args.file) as model:
        tokenizer = tokenizer_of(model, needed=args.prompt is not None)
        prompt = prompt_ids(args, model, tokenizer)
        if args.generate < 0:
            fail("-n must be >= 0")
        want_trace = args.debug_routing or args.dump_trace is not None
        positions = len(prompt) + max(args.generate - 1, 0)

        def new_session(m: Any) -> Any:
            return Session(m, routing=args.routing, epsilon=args.epsilon, seed=args.seed,
                           threads=args.threads, max_context=positions, trace=want_trace)

        def show(generation: Any, position: int) -> None:
            print_routing(generation.session.trace, tokenizer, position)

        hot = HotModel(args.file, model)
        restore = on_sigusr1(hot)  # `kill -USR1`: reopen, validate and swap between tokens
        try:
            session = new_session(model)
            generation = session.generate(
                prompt, args.generate, keep_logits=args.dump_logits is not None,
                on_position=show if args.debug_routing else None,
                swap=session_swapper(hot, new_session, error))
            session = generation.session
            trace = session.trace.copy() if want_trace and session.trace is not None else None
            session.close()
        finally:
            restore()
    generated = generation.generated
    if args.dump_logits is not None:
        assert generation.logits is not None
        stacked = np.ascontiguousarray(np.concatenate(generation.logits), dtype=np.float32)
        atomic_write(args.dump_logits, lambda f: np.save(f, stacked))
    if args.dump_trace is not None and trace is not None:
        arrays = {"expert_ids": trace.expert_ids.astype(np.int32),
                  "expert_weights": trace.expert_weights.astype(np.float32),
                  "router_logits": trace.router_logits.astype(np.float32),
                  "moe_layers": trace.moe_layers.astype(np.int32),
                  "tokens": trace.tokens.astype(np.int32)}
        atomic_write(args.dump_trace, lambda f: np.savez(f, **arrays))
    if tokenizer is not None:
        print(f"prompt: {tokenizer.decode(prompt)}")
        print(f"text: {tokenizer.decode(generated)}")
    print("prompt tokens: " + ",".join(map(str, prompt)))
    print("tokens: " + ",".join(map(str, generated)))
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("run", help="greedy generation", epilog=RUN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_file(p)
    add_prompt(p)
    add_generate(p, 16)
    add_routing(p, seed="Gumbel routing seed")
    add_threads(p)
    p.add_argument("--debug-routing", action="store_true",
                   help="print the experts and weights chosen per position and MoE layer")
    p.add_argument("--dump-logits", metavar="OUT.npy", help="save float32 [positions, vocab]")
    p.add_argument("--dump-trace", metavar="OUT.npz", help="save the routing trace")
    p.set_defaults(func=cmd_run)
