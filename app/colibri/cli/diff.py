"""`colibri diff`: a .colibri file against the Hugging Face checkpoint it came from.

    colibri diff FILE HF_DIR (--prompt TEXT | --tokens ID,...) [--dtype f32|bf16]
                 [--tolerance T] [-t/--threads N] [--json [OUT]]

Runs the prompt in Colibri and in transformers (the `reference` extra: torch, transformers) and
prints, per layer, the largest hidden-state difference (absolute, and relative to the
reference's largest value at that position), the largest router-logit difference (max|dlogit|)
and the decisions whose expert sets differ, then the first layer over the tolerance and the
first (layer, position) where routing diverges (colibri.reference.diff says how each
divergence is explained).
--json alone prints the whole diff as JSON; --json OUT writes it to OUT (what the Inspector's
reference diff opens) and prints the summary.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from colibri.cli.common import (EXIT_OK, add_file, add_prompt, add_threads, fail, open_model,
                                progress_line, prompt_ids, token_label, tokenizer_of)
from colibri.files import atomic_write_bytes

if TYPE_CHECKING:
    from colibri.reference.diff import ReferenceDiff

DIFF_EPILOG = """\
The hidden state of a layer is the residual stream after it, at every prompt position. The
relative difference of a cell is max|h_colibri - h_transformers| / max|h_transformers| over the
cell's hidden vector. The default tolerance follows the file's expert dtype and --dtype: 1e-4
for f32 against f32, 1e-2 f16, 3e-2 bf16, 5e-2 q8_0, 0.2 q4_0.
A routing divergence is a decision whose expert sets differ; its cause compares transformers'
margin there with the engines' largest selection-score difference d: 'rule differs' when the
margin exceeds 2d (the scores agree, the choice does not); otherwise 'near tie' when d is
within tolerance, 'router logits differ' when the logits differ by more (the router's weights
or its input), 'selection scores differ' when only the scores do (scoring, correction bias).
Exit status 0 whether or not the engines agree (read the report or --json)."""


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def _shown(path: str) -> str:
    """A path as a reader of the output wants it: relative to here when below here."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def print_diff(diff: ReferenceDiff, tokenizer: Any = None) -> None:
    moe = len(diff.moe_layers)
    print(f"diff: {_shown(diff.model)} ({diff.arch}, {diff.file_dtype} experts, {diff.kernels} "
          f"kernels)")
    print(f"  vs: {_shown(diff.reference)} in transformers ({diff.reference_class}, "
          f"{diff.checkpoint_dtype} weights, computed in {diff.reference_dtype})")
    print(f"{diff.n_positions} positions, {diff.n_layers} layers ({moe} MoE), relative "
          f"tolerance {diff.tolerance:g}")
    print()
    print(f"{'layer':>6}  {'kind':<5} {'max|dh|':>9} {'relative':>9} {'at pos':>6} "
          f"{'max|dlogit|':>11} {'diverged':>9}")
    over = diff.first_layer_over()
    for row in diff.layers():
        diverged = "-" if row.diverged is None else f"{row.diverged}/{diff.n_positions}"
        mark = "  <- first over tolerance" if row.layer == over else ""
        print(f"{row.layer:>6}  {row.kind:<5} {_g(row.hidden_abs):>9} {_g(row.hidden_rel):>9} "
              f"{row.worst_position:>6} {_g(row.router_abs):>11} {diverged:>9}{mark}")
    s = diff.summary()
    print(f"{'logits':>6}  {'':<5} {_g(s['max_logit_difference']):>9} "
          f"{_g(float(diff.logits_rel.max(initial=0.0))):>9}  next token differs at "
          f"{s['next_token_differs']} of {diff.n_positions} positions")
    print()
    if over is None:
        print(f"first layer over tolerance: none (every hidden state within {diff.tolerance:g})")
    else:
        row = diff.layers()[over]
        p = row.worst_position
        print(f"first layer over tolerance: layer {over} ({row.kind}): relative difference "
              f"{row.hidden_rel:.3g} at position {p} (token "
              f"{token_label(tokenizer, diff.tokens[p])})")
    first = diff.first_divergence()
    if first is None:
        print(f"first routing divergence: none ({s['decisions']} decisions, the same expert sets)")
    else:
        print(f"first routing divergence: {first.describe()}")
        print(f"  {s['diverged_decisions']} of {s['decisions']} decisions differ")


def cmd_diff(args: argparse.Namespace) -> int:
    from colibri.reference.diff import reference_diff

    if args.tolerance is not None and not args.tolerance > 0:
        fail("--tolerance must be > 0")
    with open_model(args.file) as model:
        tokenizer = tokenizer_of(model, needed=args.prompt is not None)
        tokens = prompt_ids(args, model, tokenizer)
        texts = [token_label(tokenizer, t) for t in tokens]
        diff = reference_diff(model, args.hf_dir, tokens, dtype=args.dtype, threads=args.threads,
                              tolerance=args.tolerance, token_texts=texts,
                              progress=progress_line)
    if args.json == "-":
        print(diff.to_json())
        return EXIT_OK
    print_diff(diff, tokenizer)
    if args.json:
        atomic_write_bytes(args.json, diff.to_json().encode("utf-8"))
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("diff", help="compare a .colibri file with its Hugging Face checkpoint "
                       "run in transformers, layer by layer", epilog=DIFF_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_file(p)
    p.add_argument("hf_dir", metavar="HF_DIR", help="the Hugging Face checkpoint directory")
    add_prompt(p)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                   help="the precision transformers computes in (default f32)")
    p.add_argument("--tolerance", type=float, default=None, metavar="T",
                   help="relative hidden-state tolerance (default: by the file's dtype)")
    add_threads(p)
    p.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="write the whole diff as JSON to OUT (alone: print it instead of the "
                        "summary)")
    p.set_defaults(func=cmd_diff)
