#!/usr/bin/env python3
"""Two kernel paths of this machine on one model, in one process: prefill and decode speed of
each and their paired ratios.

One session per path (Session(kernels=...)), the same prompt and decoded tokens, repeats
alternating which path goes first, so drift in the machine's speed (other tenants, clock) hits
both alike. Prints, per path, the median prefill and decode tokens/s, and the median and range of
the per-repeat ratios B / A. Separate processes on a shared VM disagree by 10-15%; this is how
docs/performance.md compares the AMX and AVX-512 paths.

    python tools/bench_kernels.py FILE [--a avx512] [--b amx] [-p 128] [-n 32] [-t 2] [-r 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from colibri.engine import KERNEL_PATHS, Model, Session


def _one(session: Session, prompt: list[int], n: int) -> tuple[float, float]:
    """Prefill and decode tokens/s of one repeat (greedy decode of n tokens after the prompt)."""
    session.reset()
    t0 = time.perf_counter()
    logits = session.prefill(prompt)
    t1 = time.perf_counter()
    token = int(np.argmax(logits[-1]))
    for _ in range(n):
        token = int(np.argmax(session.step(token)))
    t2 = time.perf_counter()
    return len(prompt) / (t1 - t0), n / (t2 - t1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--a", default="avx512", choices=KERNEL_PATHS, help="reference path")
    ap.add_argument("--b", default="amx", choices=KERNEL_PATHS, help="path compared with it")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=32, help="decoded tokens")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=10)
    args = ap.parse_args(argv)

    model = Model.open(args.file)
    hp = model.hparams
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, hp.vocab_size, args.p)]
    ctx = min(hp.max_context, args.p + args.n + 8)
    sessions = {k: Session(model, threads=args.threads, max_context=ctx, trace=False, kernels=k)
                for k in (args.a, args.b)}
    for k, s in sessions.items():
        if s.kernels != k:
            print(f"this machine runs no {k} kernels (best below it: {s.kernels})", file=sys.stderr)
            return 1
        _one(s, prompt[:8], 4)  # warm: page the weights in, wake the workers
    runs: dict[str, list[tuple[float, float]]] = {args.a: [], args.b: []}
    for i in range(args.repeats):
        for k in (args.a, args.b) if i % 2 == 0 else (args.b, args.a):
            runs[k].append(_one(sessions[k], prompt, args.n))
    print(f"{args.file}: {args.p}-token prompt, {args.n} decoded tokens, {args.threads} thread(s), "
          f"{args.repeats} alternating repeats")
    for k in (args.a, args.b):
        pre, dec = zip(*runs[k])
        print(f"  {k:<9} prefill {statistics.median(pre):8.1f} tok/s   decode "
              f"{statistics.median(dec):7.1f} tok/s")
    for what, i in (("prefill", 0), ("decode", 1)):
        r = [b[i] / a[i] for a, b in zip(runs[args.a], runs[args.b])]
        print(f"  {what} {args.b}/{args.a}: median {statistics.median(r):.3f} "
              f"(range {min(r):.3f}-{max(r):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
