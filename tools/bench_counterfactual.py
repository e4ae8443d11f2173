#!/usr/bin/env python3
"""What reusing the KV cache saves a counterfactual: the run again under an intervention at
position P, from scratch (a fresh session: prompt and generation) against from the truncation
point (Generation.rewind to P: the positions after it only), in turns, for several P.

    python tools/bench_counterfactual.py [FILE] [-p 256] [-n 32] [-t 2] [--turns 5]
        [--cache-threshold T] [--expert-cache N] [--truncations N]

Prints per P the median milliseconds of each way, their ratio, and the median microseconds of the
rewind itself (the truncation: with expert caching it replays the decisions before P to rebuild
the caching state). --cache-threshold runs cached routing, --expert-cache an LRU.
--truncations N instead times the engine's truncation alone after N positions (best of 20,
to several positions), with the caching settings given and without any. The figures in
docs/interventions.md's decision table come from here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from colibri.engine import Model, Session
from colibri.generation import Generation
from colibri.interventions import Intervention

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"


def truncations(path: str, n: int, threads: int, caching: dict[str, object]) -> None:
    """Microseconds of Session.truncate(P) after n positions (best of 20), with the caching
    settings (the state is rebuilt by replaying the decisions before P) and without."""
    with Model.open(path) as model:
        tokens = [int(t) for t in np.random.default_rng(0).integers(0, model.hparams.vocab_size, n)]
        print(f"{Path(path).name}: col_session_truncate after {n} positions, {threads} threads, "
              f"best of 20 (us)")
        print(f"{'P':>6} {'caching':>9} {'none':>9}")
        times: dict[str, list[float]] = {}
        for name, settings in (("caching", caching), ("none", {})):
            with Session(model, threads=threads, max_context=n, **settings) as s:  # type: ignore[arg-type]
                s.prefill(tokens, all_logits=False)
                for position in (n - 1, n // 2, 1):
                    best = float("inf")
                    for _ in range(20):   # each call rebuilds the state the positions left
                        t0 = time.perf_counter()
                        s.truncate(position)
                        best = min(best, time.perf_counter() - t0)
                    times.setdefault(name, []).append(best * 1e6)
        for i, position in enumerate((n - 1, n // 2, 1)):
            print(f"{position:>6} {times['caching'][i]:>9.1f} {times['none'][i]:>9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=str(DEMO))
    ap.add_argument("-p", "--prompt-tokens", type=int, default=256)
    ap.add_argument("-n", "--generate", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--cache-threshold", type=float, default=None, metavar="T",
                    help="cached routing with this threshold")
    ap.add_argument("--expert-cache", type=int, default=0, metavar="N",
                    help="an LRU of N resident experts per MoE layer")
    ap.add_argument("--truncations", type=int, default=0, metavar="N",
                    help="time col_session_truncate after N positions instead")
    args = ap.parse_args()
    caching = {"routing": "topk" if args.cache_threshold is None else "cached",
               "cache_threshold": args.cache_threshold or 0.0, "expert_cache": args.expert_cache}
    if args.truncations:
        truncations(args.file, args.truncations, args.threads, caching)
        return
    with Model.open(args.file) as model:
        hp = model.hparams
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(0, hp.vocab_size, args.prompt_tokens)]
        layer = int(next(r.layer for r in map(model.routing, range(hp.n_layers))
                         if r.kind == "moe"))
        total = args.prompt_tokens + args.generate - 1
        starts = sorted({0, args.prompt_tokens // 2, args.prompt_tokens, (args.prompt_tokens + total) // 2,
                         total - 8})
        positions = total
        print(f"{Path(args.file).name}: {args.prompt_tokens}-token prompt + {args.generate} "
              f"generated ({total} positions), {args.threads} threads, {args.turns} turns; "
              f"an intervention at position P (forbid the first choice of layer {layer}); "
              f"routing {caching['routing']}, expert cache {args.expert_cache}")
        with Session(model, threads=args.threads, max_context=positions, **caching) as s:  # warm up
            Generation(s, prompt, args.generate, keep_logits=True).run()
        print(f"{'P':>6} {'positions again':>16} {'from scratch ms':>16} {'rewound ms':>11} "
              f"{'ratio':>7} {'rewind us':>10}")
        for start in starts:
            scratch, rewound, rewinds = [], [], []
            for _ in range(args.turns):
                with Session(model, threads=args.threads, max_context=positions, **caching) as s:
                    g = Generation(s, prompt, args.generate, keep_logits=True)
                    g.run()
                    first = int(s.trace.expert_ids[start, 0, 0])
                    edit = [Intervention("forbid", (first,), first=start, last=start,
                                         layer=layer)]
                    t0 = time.perf_counter()
                    s.set_interventions(edit)
                    t1 = time.perf_counter()
                    g.rewind(start)
                    rewinds.append(time.perf_counter() - t1)
                    g.run()
                    rewound.append(time.perf_counter() - t0)
                with Session(model, threads=args.threads, max_context=positions, **caching) as s:
                    t0 = time.perf_counter()
                    s.set_interventions(edit)
                    Generation(s, prompt, args.generate, keep_logits=True).run()
                    scratch.append(time.perf_counter() - t0)
            a, b = statistics.median(scratch) * 1e3, statistics.median(rewound) * 1e3
            print(f"{start:>6} {total - start:>16} {a:>16.1f} {b:>11.1f} {a / b:>7.2f} "
                  f"{statistics.median(rewinds) * 1e6:>10.1f}")


if __name__ == "__main__":
    main()
