#!/usr/bin/env python3
"""Two kernel paths of this machine on one model, in one process: prefill and decode speed of
each and their paired ratios.

One session per path (Session(kernels=...)), the same prompt, repeats alternating which path
goes first, so drift in the machine's speed (other tenants, clock) hits both alike. Prefill: one
pair of prompts per repeat. Decode: after both prefill, the paths take turns every --block steps
(A B, then B A, ...) on the same fixed tokens, so each pair of blocks sees the machine within a
few milliseconds; a whole run of greedy decoding per path varies by 10-20% between repeats on a
shared VM, pairs of 4-step blocks by a few percent, which is what makes 2% visible. Prints, per
path, the median tokens/s, and the median and range of the paired ratios B / A (decode: also the
mean and its standard error). This is how docs/performance.md compares the AMX and AVX-512 paths.

    python tools/bench_kernels.py FILE [--a avx512] [--b amx] [-p 128] [-n 32] [--block 4] [-t 2] [-r 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from colibri.engine import KERNEL_PATHS, Model, Session


def _prefill(session: Session, prompt: list[int]) -> float:
    """Tokens/s of one prefill of the prompt from position 0."""
    session.reset()
    t0 = time.perf_counter()
    session.prefill(prompt, all_logits=False)
    return len(prompt) / (time.perf_counter() - t0)


def _steps(session: Session, tokens: list[int]) -> float:
    """Seconds to step through the tokens (fixed tokens, not the argmax: the paths differ in the
    last bits, so their greedy choices could part and the two would not do the same work)."""
    t0 = time.perf_counter()
    for token in tokens:
        session.step(token)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--a", default="avx512", choices=KERNEL_PATHS, help="reference path")
    ap.add_argument("--b", default="amx", choices=KERNEL_PATHS, help="path compared with it")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=32, help="decoded tokens per repeat")
    ap.add_argument("--block", type=int, default=4, help="decode steps per turn")
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
        _prefill(s, prompt[:8])  # warm: page the weights in, wake the workers
        _steps(s, prompt[:4])
    block = max(1, min(args.block, args.n))
    decoded = [int(t) for t in np.random.default_rng(1).integers(0, hp.vocab_size, args.n)]
    prefill: dict[str, list[float]] = {args.a: [], args.b: []}
    step_s: dict[str, list[float]] = {args.a: [], args.b: []}  # per block
    turn = 0
    for i in range(args.repeats):
        order = (args.a, args.b) if i % 2 == 0 else (args.b, args.a)
        for k in order:
            prefill[k].append(_prefill(sessions[k], prompt))
        for start in range(0, args.n - block + 1, block):
            for k in (args.a, args.b) if turn % 2 == 0 else (args.b, args.a):
                step_s[k].append(_steps(sessions[k], decoded[start:start + block]))
            turn += 1
    print(f"{args.file}: {args.p}-token prompt, {args.n} decoded tokens in turns of {block}, "
          f"{args.threads} thread(s), {args.repeats} alternating repeats")
    for k in (args.a, args.b):
        print(f"  {k:<9} prefill {statistics.median(prefill[k]):8.1f} tok/s   decode "
              f"{block / statistics.median(step_s[k]):7.1f} tok/s")
    r = [b / a for a, b in zip(prefill[args.a], prefill[args.b])]
    print(f"  prefill {args.b}/{args.a}: median {statistics.median(r):.3f} (range {min(r):.3f}-{max(r):.3f})")
    r = [a / b for a, b in zip(step_s[args.a], step_s[args.b])]
    sem = statistics.stdev(r) / len(r) ** 0.5 if len(r) > 1 else float("nan")
    print(f"  decode {args.b}/{args.a}: median {statistics.median(r):.3f} (range {min(r):.3f}-{max(r):.3f}), "
          f"mean {statistics.mean(r):.3f} +- {sem:.3f} over {len(r)} pairs of {block}-step turns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
