#!/usr/bin/env python3
"""The jitter lab's three reports made apart against together, in one process.

Apart: `analyze_jitter`, `analyze_epsilon` and `analyze_remedies` in turn, each with its own
passes. Together: `analyze_lab`, each variant's passes on one session (colibri.jitter.passes).
The two take turns, repeat by repeat, on one Runner (the variants' weight copies are written
before the first timed repeat, so neither pays for them); every repeat's reports are checked to
be the same bytes. Prints each side's times, their medians and the ratio of medians.

    python tools/bench_lab.py [--model FILE] [--tokens 64] [--variants LIST] [--eps LIST]
                              [--remedy-eps 1e-6] [--threads 2] [--repeats 3]

Model: resources/demo/demo.colibri unless --model. The token sequence is random ids (seed 0):
teacher-forced, so its content decides only where the near-ties fall.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

import numpy as np  # noqa: E402

from colibri.jitter.analysis import Runner, parse_eps, report_json  # noqa: E402
from colibri.jitter.passes import (analyze_epsilon, analyze_jitter, analyze_lab,  # noqa: E402
                                   analyze_remedies)
from colibri.jitter.variants import parse_variants  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "resources" / "demo" / "demo.colibri"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--variants", default=None, help="the lab's default list unless given")
    ap.add_argument("--eps", default=None, help="the sweep's epsilons (default list unless given)")
    ap.add_argument("--remedy-eps", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    variants = parse_variants(args.variants)
    eps = parse_eps(args.eps)

    with Runner.open(args.model, threads=args.threads) as runner:
        rng = np.random.default_rng(0)
        tokens = [int(t) for t in rng.integers(0, runner.model.hparams.vocab_size, args.tokens)]
        for v in variants:  # the weight copies, outside the timings
            runner.model_for(v)

        def apart() -> list[bytes]:
            return [report_json(r) for r in (
                analyze_jitter(runner, tokens, variants),
                analyze_epsilon(runner, tokens, eps, variants),
                analyze_remedies(runner, tokens, variants, args.remedy_eps))]

        def together() -> list[bytes]:
            lab = analyze_lab(runner, tokens, variants, eps=eps, remedy_eps=args.remedy_eps)
            return [report_json(r) for r in (lab.jitter, lab.epsilon, lab.remedies)
                    if r is not None]

        times: dict[str, list[float]] = {"apart": [], "together": []}
        for repeat in range(args.repeats):
            reports = {}
            for name, fn in (("apart", apart), ("together", together)):
                t = time.perf_counter()
                reports[name] = fn()
                times[name].append(time.perf_counter() - t)
            if reports["apart"] != reports["together"]:
                print("the reports differ", file=sys.stderr)
                return 1
            print(f"repeat {repeat + 1}: apart {times['apart'][-1]:.1f} s, together "
                  f"{times['together'][-1]:.1f} s", flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{Path(args.model).name}, {args.tokens} positions, {len(variants)} variants, "
          f"{len(eps)} epsilons, {args.threads} threads: apart {med['apart']:.1f} s, together "
          f"{med['together']:.1f} s (medians of {args.repeats}); together / apart "
          f"{med['together'] / med['apart']:.3f}; reports byte-identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
