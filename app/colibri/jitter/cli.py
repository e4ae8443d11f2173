"""`colibri jitter` and `colibri epsilon`: the routing-jitter lab on the command line.

    colibri jitter FILE (--prompt TEXT | --tokens ID,...) [--generate N] [--variants LIST]
                   [--threads N] [--json OUT]
    colibri epsilon FILE (--prompt TEXT | --tokens ID,...) [--generate N] [--eps LIST]
                    [--variants LIST] [--threads N] [--json OUT]

Both print a readable summary; --json writes the full report (colibri.jitter.analysis, sorted
keys, no timestamps: the same inputs give the same bytes) through a temporary file and a rename.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from colibri.files import atomic_write_bytes
from colibri.errors import ColibriError
from colibri.jitter.analysis import (BASELINE, EpsilonReport, JitterReport, Runner,
                                     analyze_epsilon, analyze_jitter, parse_eps, ulp_bin_label)
from colibri.jitter.variants import DEFAULT_VARIANTS, parse_variants
from colibri.numerics import NumericsError
from colibri.tokens import token_text

EXIT_OK, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2

VARIANT_HELP = ("comma-separated variants; each joins components with '+': seq, pairwise, "
                "blockedL (L lanes), fma, splitS, act-bf16, act-f16, w-f32, w-f16, w-bf16, "
                "noiseN[@seed] (router logits +-N ULPs), k-portable, k-avx2, k-avx512, k-amx (the "
                "engine's kernels on that path of this machine). Default: "
                + ",".join(DEFAULT_VARIANTS) + " and a k- variant for every kernel path of this "
                "machine below its best")


def _err(message: str) -> None:
    print(f"colibri: {message}", file=sys.stderr)


def report_json(report: JitterReport | EpsilonReport) -> bytes:
    return json.dumps(report.to_dict(), sort_keys=True, separators=(",", ":")).encode("utf-8")


def _token_text(tokenizer: Any, token: int) -> str:
    return repr(token_text(tokenizer, token)) if tokenizer is not None else str(token)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _progress(done: int, total: int, text: str = "") -> None:
    if sys.stderr.isatty():
        print(f"\r[{done}/{total}] {text:<40}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)


def _prepare(args: argparse.Namespace) -> tuple[Runner, list[int], int, Any] | int:
    """Open the file and build the fixed token sequence; an exit code on failure."""
    from colibri.cli import _failure, _open

    try:
        model = _open(args.file)
    except (ColibriError, OSError) as exc:
        return _failure(exc)
    model.close()
    runner = Runner(args.file, threads=args.threads)
    try:
        tokenizer = None
        try:
            tokenizer = runner.model.tokenizer
        except ColibriError:
            if args.prompt is not None:
                raise
        if args.prompt is not None:
            if tokenizer is None:
                raise ValueError(f"{args.file} has no tokenizer; use --tokens ID,ID,...")
            prompt = list(tokenizer.encode(args.prompt).ids)
        else:
            prompt = args.tokens
        if args.generate < 0:
            raise ValueError("--generate must be >= 0")
        tokens = runner.greedy_sequence(prompt, args.generate)
    except (ColibriError, ValueError) as exc:
        runner.close()
        _err(str(exc))
        return EXIT_INVALID
    return runner, tokens, len(prompt), tokenizer


def _write_json(path: str, data: bytes) -> None:
    atomic_write_bytes(path, data)


def print_jitter(report: JitterReport, tokenizer: Any = None, top: int = 10) -> None:
    P, M = report.margin_ulps.shape
    print(f"jitter: {report.model}: {P} positions ({report.n_prompt} prompt) x {M} MoE layers = "
          f"{P * M} cells, top-{report.k} of {report.n_experts} experts, "
          f"{len(report.variants)} variants"
          + (f", baseline on the {report.kernels} kernels" if report.kernels else ""))
    if P * M and report.margin_ulps.min() >= 0:
        p, m = np.unravel_index(int(np.argmin(report.margin_ulps)), report.margin_ulps.shape)
        print(f"smallest baseline margin: {int(report.margin_ulps[p, m])} ULP "
              f"({report.margin_abs[p, m]:.3g}) at position {p} layer {report.moe_layers[m]}")
    print()
    print(f"{'variant':<22} {'flips':>5} {'rate':>7} {'1st experts':>11} {'1st token':>9} "
          f"{'max|dlogit|':>11} {'max KL':>9}")
    rates = report.flip_rate()
    for name in report.variants:
        d = report.downstream[name]
        print(f"{name:<22} {int(report.flips(name).sum()):>5} {rates[name]:>7.4f} "
              f"{_fmt(d.first_expert_divergence):>11} {_fmt(d.first_token_divergence):>9} "
              f"{float(d.max_abs.max()):>11.3g} {float(d.kl.max()):>9.3g}")
    s = report.summary()
    print(f"\noverall flip rate {s['overall_flip_rate']:.4f}: {s['flipped_cells']} of "
          f"{s['cells']} cells flipped by at least one variant")
    print("\nflips against baseline margin (ULP):")
    print(f"  {'margin':<12} {'cells':>6} {'flipped':>8} {'flips':>6} {'rate':>7}")
    for b in report.flips_vs_margin():
        print(f"  {b['label']:<12} {b['cells']:>6} {b['flipped_cells']:>8} {b['flips']:>6} "
              f"{b['flip_rate']:>7.4f}")
    counts = report.flip_counts()
    fragile = sorted(((int(report.margin_ulps[p, m]), p, m) for p, m in np.argwhere(counts > 0)))
    if fragile:
        print(f"\nfragile cells (flipped by some variant), smallest margin first:")
        for u, p, m in fragile[:top]:
            who = [n for n in report.variants if report.flips(n)[p, m]]
            print(f"  pos {p} token {_token_text(tokenizer, report.tokens[p])} layer "
                  f"{report.moe_layers[m]}: top-k {report.sets[BASELINE][p, m].tolist()} margin "
                  f"{u} ULP ({report.margin_abs[p, m]:.3g}); {len(who)}/{len(report.variants)} "
                  f"variants: {', '.join(who[:6])}{' ...' if len(who) > 6 else ''}")
        if len(fragile) > top:
            print(f"  ... {len(fragile) - top} more (see --json)")


def print_epsilon(report: EpsilonReport) -> None:
    P, M = report.plain_sets.shape[:2]
    print(f"epsilon sweep: {report.model}: {P} positions x {M} MoE layers = {P * M} cells, "
          f"{len(report.variants)} variants, stable top-k on logit[j] + j*eps")
    print()
    print(f"{'eps':>8} {'jitter left':>11} {'bias':>5} {'bias max|dlogit|':>16} "
          f"{'bias 1st token':>14} {'jitter max|dlogit|':>18}")
    for r in report.rows:
        print(f"{r.eps:>8.3g} {r.jitter_left:>11} {r.n_bias:>5} "
              f"{float(r.bias.max_abs.max()):>16.3g} {_fmt(r.bias.first_token_divergence):>14} "
              f"{r.jitter_max_abs:>18.3g}")
    rec = report.recommended()
    print()
    if rec is None:
        best = min(report.rows, key=lambda r: (r.jitter_left, r.eps))
        print(f"no epsilon of the list removes every flip; the fewest left: eps {best.eps:g} "
              f"({best.jitter_left} cells)")
        return
    changed = report.changed_decisions(rec)
    print(f"recommended epsilon: {rec.eps:g} (the smallest that leaves no flip across the "
          f"variants); it changes {len(changed)} decision(s) of plain top-k"
          + (":" if changed else "."))
    for c in changed[:20]:
        print(f"  pos {c['position']} layer {c['layer']}: plain {c['plain']} -> stable "
              f"{c['stable']}")


def cmd_jitter(args: argparse.Namespace) -> int:
    try:
        variants = parse_variants(args.variants)
    except NumericsError as exc:
        _err(str(exc))
        return EXIT_INVALID
    prepared = _prepare(args)
    if isinstance(prepared, int):
        return prepared
    runner, tokens, n_prompt, tokenizer = prepared
    with runner:
        try:
            report = analyze_jitter(runner, tokens, variants, n_prompt, progress=_progress)
        except (ColibriError, OSError, ValueError) as exc:
            _err(str(exc))
            return EXIT_INVALID
    print_jitter(report, tokenizer)
    if args.json:
        _write_json(args.json, report_json(report))
    return EXIT_OK


def cmd_epsilon(args: argparse.Namespace) -> int:
    try:
        variants = parse_variants(args.variants)
        eps = parse_eps(args.eps)
    except ValueError as exc:
        _err(str(exc))
        return EXIT_INVALID
    prepared = _prepare(args)
    if isinstance(prepared, int):
        return prepared
    runner, tokens, n_prompt, _ = prepared
    with runner:
        try:
            report = analyze_epsilon(runner, tokens, eps, variants, n_prompt, progress=_progress)
        except (ColibriError, OSError, ValueError) as exc:
            _err(str(exc))
            return EXIT_INVALID
    print_epsilon(report)
    if args.json:
        _write_json(args.json, report_json(report))
    return EXIT_OK


def _common(p: argparse.ArgumentParser) -> None:
    from colibri.cli import _parse_tokens

    p.add_argument("file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (the file's tokenizer)")
    src.add_argument("--tokens", type=_parse_tokens, help="prompt token ids: ID,ID,...")
    p.add_argument("--generate", type=int, default=16, metavar="N",
                   help="greedy tokens of the baseline appended to the prompt; every run is "
                        "teacher-forced on the same sequence (default 16)")
    p.add_argument("--variants", help=VARIANT_HELP)
    p.add_argument("--threads", type=int, default=1,
                   help="threads of default-numerics runs (results are identical for any count)")
    p.add_argument("--json", metavar="OUT", help="write the full report as JSON")


def add_commands(sub: Any) -> None:
    """Register `jitter` and `epsilon` on the CLI's subparsers."""
    p = sub.add_parser("jitter", help="routing jitter: which top-k decisions flip under numerics "
                       "variants (reduction order, FMA, split, precisions, router noise)")
    _common(p)
    p.set_defaults(func=cmd_jitter)
    p = sub.add_parser("epsilon", help="stable top-k epsilon sweep: jitter left and decisions "
                       "changed per epsilon, and the recommended epsilon")
    _common(p)
    p.add_argument("--eps", help="comma-separated epsilons (default 0,1e-10,1e-9,1e-8,1e-7,1e-6,"
                   "1e-5)")
    p.set_defaults(func=cmd_epsilon)


__all__ = ["add_commands", "cmd_epsilon", "cmd_jitter", "print_epsilon", "print_jitter",
           "report_json", "ulp_bin_label"]
