"""`colibri jitter` and `colibri epsilon`: the routing-jitter lab on the command line.

    colibri jitter FILE (--prompt TEXT | --tokens ID,...) [-n/--generate N] [--variants LIST]
                   [-t/--threads N] [--json [OUT]]
    colibri epsilon FILE (--prompt TEXT | --tokens ID,...) [-n/--generate N] [--eps LIST]
                    [--variants LIST] [-t/--threads N] [--json [OUT]]

Both print a readable summary; --json OUT also writes the full report (colibri.jitter.analysis,
sorted keys, no timestamps: the same inputs give the same bytes) through a temporary file and a
rename, and --json alone prints the report instead of the summary.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from colibri.cli.common import (EXIT_OK, add_file, add_generate, add_prompt, add_threads, fail,
                                open_model, progress_line, prompt_ids, token_label,
                                tokenizer_of)
from colibri.files import atomic_write_bytes
from colibri.jitter.analysis import (BASELINE, EpsilonReport, JitterReport, Runner,
                                     analyze_epsilon, analyze_jitter, parse_eps, report_json)
from colibri.jitter.variants import DEFAULT_VARIANTS, parse_variants

VARIANT_HELP = ("comma-separated variants; each joins components with '+': seq, pairwise, "
                "blockedL (L lanes), fma, splitS, act-bf16, act-f16, w-f32, w-f16, w-bf16, "
                "noiseN[@seed] (router logits +-N ULPs), k-portable, k-avx2, k-avx512, k-amx (the "
                "engine's kernels on that path of this machine). Default: "
                + ",".join(DEFAULT_VARIANTS) + " and a k- variant for every kernel path of this "
                "machine below its best")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _report(args: argparse.Namespace, kind: str) -> tuple[JitterReport | EpsilonReport, Any]:
    """Open the file, build the fixed token sequence and run the analysis; returns the report
    and the tokenizer (None without one)."""
    variants = parse_variants(args.variants)
    eps = parse_eps(args.eps) if kind == "epsilon" else []
    if args.generate < 0:
        fail("--generate must be >= 0")
    with open_model(args.file) as model, Runner(model, threads=args.threads) as runner:
        tokenizer = tokenizer_of(model, needed=args.prompt is not None)
        prompt = prompt_ids(args, model, tokenizer)
        tokens = runner.greedy_sequence(prompt, args.generate)
        if kind == "jitter":
            return analyze_jitter(runner, tokens, variants, len(prompt), progress_line), tokenizer
        return analyze_epsilon(runner, tokens, eps, variants, len(prompt), progress_line), tokenizer


def _emit(args: argparse.Namespace, report: JitterReport | EpsilonReport,
          summary: Any) -> int:
    """--json alone: the report on stdout; --json OUT: the summary, and the report in OUT."""
    if args.json == "-":
        print(report_json(report).decode("utf-8"))
        return EXIT_OK
    summary()
    if args.json:
        atomic_write_bytes(args.json, report_json(report))
    return EXIT_OK


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
            print(f"  pos {p} token {token_label(tokenizer, report.tokens[p])} layer "
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
    report, tokenizer = _report(args, "jitter")
    assert isinstance(report, JitterReport)
    return _emit(args, report, lambda: print_jitter(report, tokenizer))


def cmd_epsilon(args: argparse.Namespace) -> int:
    report, _ = _report(args, "epsilon")
    assert isinstance(report, EpsilonReport)
    return _emit(args, report, lambda: print_epsilon(report))


def _common(p: argparse.ArgumentParser) -> None:
    add_file(p)
    add_prompt(p)
    add_generate(p, 16, "greedy tokens of the baseline appended to the prompt; every run is "
                        "teacher-forced on the same sequence")
    p.add_argument("--variants", help=VARIANT_HELP)
    add_threads(p, "threads of default-numerics runs (results are identical for any count)")
    p.add_argument("--json", nargs="?", const="-", metavar="OUT",
                   help="write the full report as JSON to OUT (alone: print it instead of the "
                        "summary)")


def add_commands(sub: Any) -> None:
    """Register `jitter` and `epsilon` on the CLI's subparsers."""
    p = sub.add_parser("jitter", help="routing jitter: which top-k decisions flip under numerics "
                       "variants (reduction order, FMA, split, precisions, router noise)")
    _common(p)
    p.set_defaults(func=cmd_jitter, eps=None)
    p = sub.add_parser("epsilon", help="stable top-k epsilon sweep: jitter left and decisions "
                       "changed per epsilon, and the recommended epsilon")
    _common(p)
    p.add_argument("--eps", help="comma-separated epsilons (default 0,1e-10,1e-9,1e-8,1e-7,1e-6,"
                   "1e-5)")
    p.set_defaults(func=cmd_epsilon)
