"""`colibri jitter`, `colibri epsilon`, `colibri remedies` and `colibri lab`: the routing-jitter
lab on the command line.

    colibri jitter FILE (--prompt TEXT | --tokens ID,...) [-n/--generate N] [--variants LIST]
                   [-t/--threads N] [--json [OUT]]
    colibri epsilon FILE (--prompt TEXT | --tokens ID,...) [-n/--generate N] [--eps LIST]
                    [--variants LIST] [-t/--threads N] [--json [OUT]]
    colibri remedies FILE (--prompt TEXT | --tokens ID,...) [-n/--generate N] [--eps E]
                     [--cache-threshold LIST] [--expert-cache N] [--variants LIST]
                     [-t/--threads N] [--json [OUT]]
    colibri lab FILE (--prompt TEXT | --tokens ID,...) [-n/--generate N] [--eps LIST]
                [--remedy-eps E] [--cache-threshold LIST] [--expert-cache N] [--variants LIST]
                [-t/--threads N] [--json [OUT]]

Each prints a readable summary; --json OUT also writes the full report (colibri.jitter.analysis,
sorted keys, no timestamps: the same inputs give the same bytes) through a temporary file and a
rename, and --json alone prints the report instead of the summary. `lab` makes all three
reports, their passes shared (colibri.jitter.passes), and its JSON is the Inspector jitter lab's
saved state.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.cli.common import (EXIT_OK, add_file, add_generate, add_prompt, add_threads, fail,
                                open_model, progress_line, prompt_ids, token_label,
                                tokenizer_of)
from colibri.files import atomic_write_bytes
from colibri.jitter.variants import DEFAULT_VARIANTS

if TYPE_CHECKING:
    from colibri.jitter.analysis import EpsilonReport, JitterReport, Reportable
    from colibri.jitter.passes import LabReports
    from colibri.jitter.remedies import RemedyReport

VARIANT_HELP = ("comma-separated variants; each joins components with '+': seq, pairwise, "
                "blockedL (L lanes), fma, splitS, act-bf16, act-f16, kv-f16, w-f32, w-f16, w-bf16, "
                "noiseN[@seed] (router logits +-N ULPs), k-portable, k-avx2, k-avx512f, k-avx512, k-amx (the "
                "engine's kernels on that path of this machine). Default: "
                + ",".join(DEFAULT_VARIANTS) + " and a k- variant for every kernel path of this "
                "machine below its best")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _reports(args: argparse.Namespace, kinds: tuple[str, ...]) -> tuple[LabReports, Any]:
    """Open the file, build the fixed token sequence and run the analyses of `kinds` (their
    passes shared); returns the reports and the tokenizer (None without one)."""
    from colibri.jitter.analysis import Runner, parse_eps
    from colibri.jitter.passes import analyze_lab
    from colibri.jitter.remedies import parse_thresholds
    from colibri.jitter.variants import parse_variants

    variants = parse_variants(args.variants)
    eps = parse_eps(args.eps) if "epsilon" in kinds else None
    # `remedies` spells its one epsilon --eps; where --eps is the sweep's list, --remedy-eps
    remedy_eps = args.remedy_eps if "epsilon" in kinds else args.eps
    thresholds = parse_thresholds(args.cache_threshold) if "remedies" in kinds else None
    if args.generate < 0:
        fail("--generate must be >= 0")
    with open_model(args.file) as model, Runner(model, threads=args.threads) as runner:
        tokenizer = tokenizer_of(model, needed=args.prompt is not None)
        prompt = prompt_ids(args, model, tokenizer)
        tokens = runner.greedy_sequence(prompt, args.generate)
        return analyze_lab(runner, tokens, variants, kinds=kinds, eps=eps, remedy_eps=remedy_eps,
                           cache_thresholds=thresholds, expert_cache=args.expert_cache,
                           n_prompt=len(prompt), progress=progress_line), tokenizer


def _emit(args: argparse.Namespace, report: Reportable, summary: Any) -> int:
    """--json alone: the report on stdout; --json OUT: the summary, and the report in OUT."""
    from colibri.jitter.analysis import report_json

    if args.json == "-":
        print(report_json(report).decode("utf-8"))
        return EXIT_OK
    summary()
    if args.json:
        atomic_write_bytes(args.json, report_json(report))
    return EXIT_OK


def print_jitter(report: JitterReport, tokenizer: Any = None, top: int = 10) -> None:
    from colibri.jitter.analysis import BASELINE

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


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def print_remedies(report: RemedyReport) -> None:
    P, M = report.plain_jitter.shape
    print(f"remedies: {report.model}: {P} positions x {M} MoE layers = {P * M} cells, top-"
          f"{report.k} of {report.n_experts} experts, {len(report.variants)} variants; plain "
          f"top-k has {report.plain.jitter_left} cells of jitter")
    print(f"cached routing's threshold: {report.threshold_rule}")
    if report.expert_cache:
        print(f"hit rate: an LRU of {report.expert_cache} experts per MoE layer over each "
              f"baseline's decisions")
    print()
    print(f"{'remedy':<30} {'changed':>7} {'jitter':>6} {'removed':>7} {'added':>5} "
          f"{'1st token':>9} {'max|dlogit|':>11} {'max KL':>9} {'experts':>7} {'hit rate':>8} "
          f"{'kept':>5}")
    for r in report.rows:
        d = r.downstream
        kept = str(r.kept) if r.remedy.routing == "cached" else "-"
        print(f"{r.remedy.label:<30} {r.changed:>7} {r.jitter_left:>6} "
              f"{int(r.removed(report.plain_jitter).sum()):>7} "
              f"{int(r.added(report.plain_jitter).sum()):>5} "
              f"{_fmt(d.first_token_divergence):>9} {float(d.max_abs.max()):>11.3g} "
              f"{float(d.kl.max()):>9.3g} {r.experts_per_decision:>7} {_rate(r.hit_rate):>8} "
              f"{kept:>5}")
    print("\nchanged: decisions that differ from plain top-k's; jitter: cells some variant "
          "flips; removed/added: plain top-k's jitter cells gone / new; 1st token, max|dlogit|, "
          "max KL: against plain top-k; experts: computed per decision")


def cmd_jitter(args: argparse.Namespace) -> int:
    reports, tokenizer = _reports(args, ("jitter",))
    report = reports.jitter
    assert report is not None
    return _emit(args, report, lambda: print_jitter(report, tokenizer))


def cmd_epsilon(args: argparse.Namespace) -> int:
    report = _reports(args, ("epsilon",))[0].epsilon
    assert report is not None
    return _emit(args, report, lambda: print_epsilon(report))


def cmd_remedies(args: argparse.Namespace) -> int:
    report = _reports(args, ("remedies",))[0].remedies
    assert report is not None
    return _emit(args, report, lambda: print_remedies(report))


def cmd_lab(args: argparse.Namespace) -> int:
    from colibri.jitter.passes import KINDS

    reports, tokenizer = _reports(args, KINDS)
    jitter, epsilon, remedies = reports.jitter, reports.epsilon, reports.remedies
    assert jitter is not None and epsilon is not None and remedies is not None

    def summary() -> None:
        print_jitter(jitter, tokenizer)
        print()
        print_epsilon(epsilon)
        print()
        print_remedies(remedies)

    return _emit(args, reports, summary)


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


def _remedy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-threshold", metavar="LIST",
                   help="comma-separated thresholds of cached routing, a row each (default: 2x "
                        "the largest margin of a decision the variants flip)")
    p.add_argument("--expert-cache", type=int, default=0, metavar="N",
                   help="measure the hit rate of an LRU of N experts per MoE layer")


def add_commands(sub: Any) -> None:
    """Register `jitter`, `epsilon`, `remedies` and `lab` on the CLI's subparsers."""
    p = sub.add_parser("jitter", help="routing jitter: which top-k decisions flip under numerics "
                       "variants (reduction order, FMA, split, precisions, router noise)")
    _common(p)
    p.set_defaults(func=cmd_jitter, eps=None, expert_cache=0)
    p = sub.add_parser("epsilon", help="stable top-k epsilon sweep: jitter left and decisions "
                       "changed per epsilon, and the recommended epsilon")
    _common(p)
    p.add_argument("--eps", help="comma-separated epsilons (default 0,1e-10,1e-9,1e-8,1e-7,1e-6,"
                   "1e-5)")
    p.set_defaults(func=cmd_epsilon, expert_cache=0, remedy_eps=None)
    p = sub.add_parser("remedies", help="the jitter remedies side by side: stable top-k, soft "
                       "routing and cached routing against plain top-k (decisions changed, "
                       "flips removed, divergence, expert-cache hit rate)")
    _common(p)
    p.add_argument("--eps", type=float, default=None,
                   help="stable top-k's epsilon (default: the model's default_epsilon)")
    _remedy_options(p)
    p.set_defaults(func=cmd_remedies)
    p = sub.add_parser("lab", help="the jitter report, the epsilon sweep and the remedies "
                       "comparison in one go, their passes shared; --json writes the lab state "
                       "the Inspector's jitter lab loads")
    _common(p)
    p.add_argument("--eps", help="the sweep's comma-separated epsilons (default 0,1e-10,1e-9,"
                   "1e-8,1e-7,1e-6,1e-5)")
    p.add_argument("--remedy-eps", type=float, default=None,
                   help="stable top-k's epsilon in the remedies comparison (default: the "
                        "model's default_epsilon)")
    _remedy_options(p)
    p.set_defaults(func=cmd_lab)
