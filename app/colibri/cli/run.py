"""`colibri run`: one prompt (text, token ids, or embedding rows), its routing printed or dumped;
generation through `Session.generate`, with the model file hot-reloaded between tokens on SIGUSR1
(colibri.reload). `colibri serve` is colibri.cli.serve."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from colibri.cli.common import (EXIT_OK, add_file, add_generate, add_intervene, add_numerics,
                                add_prompt,
                                add_routing, add_threads, caching_options, error, fail,
                                open_model, prompt_ids, token_label, tokenizer_of, unreadable)
from colibri.errors import ColibriIOError, ColibriValueError
from colibri.files import atomic_write
from colibri.interventions import KINDS, Intervention

RUN_EPILOG = """\
positions: the prompt's tokens are processed first, then every generated token except the last
one (its logits are never needed), so a run producing M tokens processes len(prompt) + M - 1
positions (len(prompt) when M is 0). --embedding X.npy is the prompt as rows fed instead of the
token embedding lookup's, float32 [positions, hidden] (scaled by the file's embedding_scale as
looked-up rows are; the rows of the model's own token_embd give the same bits as the token
ids). --dump-logits writes float32 [positions, vocab], row i being the logits after position i
(the distribution of token i+1); --dump-trace holds the same positions: expert_ids int32 [positions, moe_layers, k],
expert_weights float32 [positions, moe_layers, k], router_logits float32 [positions,
moe_layers, n_experts], selection_scores float32 [positions, moe_layers, n_experts] (the values
the choice ranked: the logits for a softmax without a correction bias, sigmoid + bias for
DeepSeek-V3), chosen_groups int32 [positions, moe_layers, groups] (the kept groups, best first,
-1 in layers without groups; only when a layer routes within groups), bias_changed bool
[positions, moe_layers] (the correction bias changed the choice; only when it did somewhere),
moe_layers int32 [moe_layers] (the layer index of each MoE layer) and tokens int32 [positions]
(-1 for embedding rows). With --routing cached: cache_kept bool [positions, moe_layers] (the
previous position's experts were kept over a different new top-k), cache_margin float32
[positions, moe_layers] (the new top-k's margin over them; NaN at position 0) and fresh_ids
int32 [positions, moe_layers, k] (the new top-k itself). With --expert-cache N: cache_hits bool
[positions, moe_layers, k] (the slot's expert was resident in the layer's LRU of N). With
--intervene: interventions (their specs) and intervened uint8 [positions, moe_layers] (bit 1 << k
for each kind k that acted: force 0, forbid 1, weights 2, logits 3, bias 4, ablate 5, swap 6).
Decoding is greedy (argmax, lowest id on ties); it stops early after the model's eos token.

interventions (--intervene SPEC, repeatable; docs/interventions.md):
  force:pos=5,layer=2,experts=1+4        the choice itself, weighted by the rule
  forbid:pos=5-9,layer=2,experts=3       not chosen there; the rule picks among the rest
  weights:pos=5,layer=2,values=0.9+0.1   the first chosen slots' combine weights
  logits:pos=5,layer=2,expert=3,add=1.5  (or set=X) a router logit
  bias:layer=0,expert=2,add=0.5          (or set=X) a correction bias
  ablate:layer=1,expert=3                removed from the layer at every position
  swap:layer=1,experts=2+5               each runs the other's weights
pos is N, A-B or A- (every position without it), layer a MoE layer (every one without it). The
run without them is computed first and compared (the KV cache before the first intervened
position is reused): changed tokens, routing, max |logit difference| and KL per position;
--no-compare runs under the interventions only."""


def print_routing(trace: Any, tokenizer: Any, position: int) -> None:
    """One line per MoE layer of `position`: the chosen experts and their weights, then the kept
    groups when the layer routes within groups, a mark when its correction bias changed the
    choice, what cached routing kept, the expert cache's hits, and the kinds of intervention that
    acted on the decision."""
    token = int(trace.tokens[position])
    for m, layer in enumerate(trace.moe_layers):
        ids = ",".join(str(int(e)) for e in trace.expert_ids[position, m])
        weights = ",".join(f"{float(w):.2f}" for w in trace.expert_weights[position, m])
        kept = [int(g) for g in trace.chosen_groups[position, m] if g >= 0]
        groups = f" groups [{','.join(map(str, kept))}]" if kept else ""
        changed = " (the correction bias changed the choice)" \
            if trace.bias_changed[position, m] else ""
        bits = int(trace.intervened[position, m])
        edited = f" [intervened: {'+'.join(k for i, k in enumerate(KINDS) if bits >> i & 1)}]" \
            if bits else ""
        cached = ""
        if trace.cache_kept[position, m]:
            fresh = ",".join(str(int(e)) for e in trace.fresh_ids[position, m])
            cached = (f" (kept the previous experts over top-k [{fresh}], margin "
                      f"{float(trace.cache_margin[position, m]):.4g})")
        lru = ""
        if trace.cache_hits.shape[2]:
            lru = " lru [" + ",".join("hit" if h else "miss" for e, h in zip(
                trace.expert_ids[position, m], trace.cache_hits[position, m]) if e >= 0) + "]"
        print(f"pos {position} token {token_label(tokenizer, token)} layer {int(layer)}: "
              f"experts [{ids}] weights [{weights}]{groups}{changed}{cached}{lru}{edited}")


def print_counterfactual(cf: Any, tokenizer: Any, original_text: str | None) -> None:
    """The comparison of the run under the interventions with the run without them."""
    s = cf.summary()
    label = lambda t: "-" if t is None else token_label(tokenizer, t)  # noqa: E731
    print(f"counterfactual from position {cf.from_position}: {s['routing_changed']} of "
          f"{s['decisions']} routing decisions changed ({s['intervened_changed']} of the "
          f"{s['intervened']} made under an intervention, {s['downstream_changed']} downstream), "
          f"{s['tokens_changed']} next token(s) changed, max |dlogit| {s['max_abs_max']:.3g}, "
          f"max KL {s['kl_max']:.3g}")
    if original_text is not None:
        print(f"without them: {original_text!r}")
    changed = cf.routing_changed
    before, after = cf.next_tokens(original=True), cf.next_tokens()
    print(f"{'pos':>4}  {'next without':<16}{'next with':<16}{'layers changed':<16}"
          f"{'max|dlogit|':>11}  {'KL':>9}")
    for p in range(cf.from_position, cf.n_positions):
        layers = ",".join(f"{int(layer)}{'*' if cf.intervened[p, m] else ''}"
                          for m, layer in enumerate(cf.moe_layers) if changed[p, m]) or "-"
        mark = "" if before[p] == after[p] else "  <- token"
        print(f"{p:>4}  {label(before[p]):<16}{label(after[p]):<16}{layers:<16}"
              f"{cf.max_abs[p]:>11.3g}  {cf.kl[p]:>9.3g}{mark}")
    print("(* = a decision made under an intervention)")



def load_embedding(path: str, d_model: int) -> np.ndarray:
    """The rows of --embedding (colibri.engine.load_embeddings); a file that cannot be read is
    an I/O error, anything else it holds an invalid argument, each naming the file."""
    from colibri.engine import load_embeddings

    reason = unreadable(path)
    if reason is not None:
        raise ColibriIOError(reason, 1)
    try:
        return load_embeddings(path, d_model)
    except ColibriValueError as exc:
        fail(exc.message)


def print_caching(stats: Any, routing: str, threshold: float | None, n_experts: int) -> None:
    """The run summary's expert-caching lines (colibri.engine.CacheStats)."""
    if stats.expert_cache:
        lookups = stats.hits + stats.misses
        rate = f"{100 * stats.hit_rate:.1f} %" if lookups else "-"
        print(f"expert cache: {stats.hits} hits, {stats.misses} misses of {lookups} lookups "
              f"({rate} hit rate; {stats.expert_cache} of {n_experts} experts resident per MoE "
              f"layer)")
    if routing == "cached":
        print(f"cached routing: kept the previous experts in {stats.kept} of {stats.decisions} "
              f"decisions (threshold {threshold:g})")


def cmd_run(args: argparse.Namespace) -> int:
    from colibri.debugging.counterfactual import rerun
    from colibri.engine import Session
    from colibri.reload import HotModel, on_sigusr1, session_swapper

    caching = caching_options(args)
    with open_model(args.file) as model:
        if args.embedding is not None:
            tokenizer = tokenizer_of(model, needed=False)
            prompt: Any = load_embedding(args.embedding, model.hparams.d_model)
        else:
            tokenizer = tokenizer_of(model, needed=args.prompt is not None)
            prompt = prompt_ids(args, model, tokenizer)
        if args.generate < 0:
            fail("-n must be >= 0")
        interventions = tuple(args.intervene)
        compare = bool(interventions) and not args.no_compare
        want_trace = args.debug_routing or args.dump_trace is not None or compare
        positions = len(prompt) + max(args.generate - 1, 0)

        def new_session(m: Any, edits: tuple[Intervention, ...] = interventions) -> Any:
            s = Session(m, routing=args.routing, epsilon=args.epsilon, seed=args.seed,
                        threads=args.threads, max_context=positions, trace=want_trace,
                        numerics=args.numerics, **caching)
            s.set_interventions(edits)   # the engine names a refused spec's bad field
            return s

        def show(generation: Any, position: int) -> None:
            print_routing(generation.session.trace, tokenizer, position)

        hot = HotModel(args.file, model)
        restore = on_sigusr1(hot)  # `kill -USR1`: reopen, validate and swap between tokens
        counterfactual, original_text = None, None
        try:
            if compare:  # the run without them first, then again from where they act
                new_session(model)   # refuses bad specs before the first run
                session = new_session(model, ())
                generation = session.generate(prompt, args.generate, keep_logits=True)
                if tokenizer is not None:
                    original_text = tokenizer.decode(generation.generated)
                counterfactual = rerun(generation, interventions)
                if args.debug_routing:
                    for position in range(generation.positions):
                        show(generation, position)
            else:
                session = new_session(model)
                generation = session.generate(
                    prompt, args.generate, keep_logits=args.dump_logits is not None,
                    on_position=show if args.debug_routing else None,
                    swap=session_swapper(hot, new_session, error))
            session = generation.session
            trace = session.trace.copy() if want_trace and session.trace is not None else None
            stats = session.cache_stats()
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
                  "selection_scores": trace.selection_scores.astype(np.float32),
                  "moe_layers": trace.moe_layers.astype(np.int32),
                  "tokens": trace.tokens.astype(np.int32)}
        if trace.chosen_groups.shape[2]:
            arrays["chosen_groups"] = trace.chosen_groups.astype(np.int32)
        if trace.bias_changed.any():
            arrays["bias_changed"] = trace.bias_changed.astype(np.bool_)
        if interventions:
            arrays["interventions"] = np.array([i.spec for i in interventions], dtype=np.str_)
            arrays["intervened"] = trace.intervened.astype(np.uint8)
        if args.routing == "cached":
            arrays["cache_kept"] = trace.cache_kept.astype(np.bool_)
            arrays["cache_margin"] = trace.cache_margin.astype(np.float32)
            arrays["fresh_ids"] = trace.fresh_ids.astype(np.int32)
        if trace.cache_hits.shape[2]:
            arrays["cache_hits"] = trace.cache_hits.astype(np.bool_)
        if args.numerics is not None:  # the trace of another computation says which
            arrays["numerics"] = np.array(args.numerics)
        atomic_write(args.dump_trace, lambda f: np.savez(f, **arrays))
    if args.embedding is not None:
        print(f"prompt: {len(prompt)} embedding rows from {os.path.basename(args.embedding)}")
    elif tokenizer is not None:
        print(f"prompt: {tokenizer.decode(prompt)}")
    if tokenizer is not None:
        print(f"text: {tokenizer.decode(generated)}")
    if args.numerics is not None:
        print(f"numerics: {args.numerics}")
    if args.embedding is None:
        print("prompt tokens: " + ",".join(map(str, prompt)))
    print("tokens: " + ",".join(map(str, generated)))
    for i in interventions:
        print(f"intervention: {i.spec} ({i.describe()})")
    if compare:
        if counterfactual is None:
            print("the interventions act after the run's last position: nothing changed")
        else:
            print_counterfactual(counterfactual, tokenizer, original_text)
    print_caching(stats, args.routing, args.cache_threshold, model.hparams.n_experts)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("run", help="greedy generation", epilog=RUN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_file(p)
    add_prompt(p, embedding=True)
    add_generate(p, 16)
    add_routing(p, seed="Gumbel routing seed", caching=True)
    add_threads(p)
    add_numerics(p, "; named in the output and in --dump-trace")
    p.add_argument("--debug-routing", action="store_true",
                   help="print the experts and weights chosen per position and MoE layer")
    p.add_argument("--dump-logits", metavar="OUT.npy", help="save float32 [positions, vocab]")
    p.add_argument("--dump-trace", metavar="OUT.npz", help="save the routing trace")
    add_intervene(p, "edit routing decisions (repeatable; see below)")
    p.add_argument("--no-compare", action="store_true",
                   help="with --intervene: run under the interventions only, without the "
                        "comparison with the run without them")
    p.set_defaults(func=cmd_run)
