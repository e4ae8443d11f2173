"""One weight product of a prefill, Colibri's kernels against torch's (MKL / oneDNN), on the same
shapes, dtype and thread count, in turns: for every shape and token count the two alternate
(A B, then B A) and the ratio is the median of the per-turn ratios, as in bench_compare.py.

Each side multiplies the same number of tokens by copies of a random weight matrix, at least
--megabytes of them, one after the other, so the weights come from memory as a prefill's expert
products' do. Colibri's side is engine_c/build/bench_products (`make` in engine_c builds it), one
process per turn; torch's runs in this process with torch.set_num_threads. torch computes bf16
products with bf16 activations; Colibri's default (exact) numerics keep them in f32.

    python tools/bench_products.py [--dtype f32|bf16] [--shapes 2816x1024,1024x2816]
                                   [--tokens 1,4,8,16,32,64,128] [-t 2] [-r 5] [--megabytes 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BENCH_BINARY = ROOT / "engine_c" / "build" / "bench_products"
REPEATS_PER_TURN = 3  # passes over the copies per turn; the turn counts their median


def colibri_turn(dtype: str, rows: int, cols: int, tokens: int, threads: int, megabytes: int
                 ) -> tuple[float, str]:
    """Seconds per product (median of this turn's passes) and the kernel path that ran."""
    out = subprocess.run([str(BENCH_BINARY), dtype, str(rows), str(cols), str(tokens),
                          "--threads", str(threads), "--megabytes", str(megabytes),
                          "--repeats", str(REPEATS_PER_TURN)],
                         check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    return statistics.median(result["seconds"]), result["kernels"]


class TorchProducts:
    """Copies of one random matrix in torch, multiplied in turn by the same activations."""

    def __init__(self, dtype: str, rows: int, cols: int, tokens: int, megabytes: int) -> None:
        import torch

        self.torch = torch
        torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
        matrix = rows * cols * torch_dtype.itemsize
        weight = torch.rand(rows, cols, dtype=torch.float32).sub_(0.5).to(torch_dtype)
        self.copies = [weight.clone() for _ in range(megabytes * 2**20 // matrix + 1)]
        self.x = torch.rand(tokens, cols, dtype=torch.float32).sub_(0.5).to(torch_dtype)
        self.turn()  # warm: oneDNN picks and caches its kernels on first use

    def turn(self) -> float:
        """Seconds per product, median of this turn's passes."""
        linear = self.torch.nn.functional.linear
        passes = []
        with self.torch.inference_mode():
            for _ in range(REPEATS_PER_TURN):
                t0 = time.perf_counter()
                for w in self.copies:
                    linear(self.x, w)
                passes.append((time.perf_counter() - t0) / len(self.copies))
        return statistics.median(passes)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        rows, _, cols = item.partition("x")
        shapes.append((int(rows), int(cols)))
    return shapes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    p.add_argument("--shapes", default="2816x1024,1024x2816", type=parse_shapes,
                   help="ROWSxCOLS of the weight matrices (default: the bench model's experts)")
    p.add_argument("--tokens", default="1,4,8,16,32,64,128",
                   type=lambda s: [int(v) for v in s.split(",")])
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-r", "--turns", type=int, default=5, help="turns of each side per product")
    p.add_argument("--megabytes", type=int, default=1024, help="weight copies per side (MiB)")
    args = p.parse_args(argv)
    if not BENCH_BINARY.exists():
        print(f"{BENCH_BINARY} is missing: run `make` in engine_c", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    print(f"{args.dtype} products from memory, {args.threads} thread(s), {args.turns} turns each; "
          f"G multiply-adds/s (median of turns), ratio colibri / torch (median of per-turn ratios, "
          f"quartiles)")
    kernels = "?"
    for rows, cols in args.shapes:
        for tokens in args.tokens:
            theirs = TorchProducts(args.dtype, rows, cols, tokens, args.megabytes)
            ours_s, theirs_s = [], []
            for turn in range(args.turns):
                order = ("colibri", "torch") if turn % 2 == 0 else ("torch", "colibri")
                for side in order:
                    if side == "colibri":
                        seconds, kernels = colibri_turn(args.dtype, rows, cols, tokens, args.threads,
                                                        args.megabytes)
                        ours_s.append(seconds)
                    else:
                        theirs_s.append(theirs.turn())
            del theirs
            macs = rows * cols * tokens
            ratios = sorted(t / o for o, t in zip(ours_s, theirs_s))
            print(f"{rows:6d} x {cols:<6d} {tokens:4d} tokens  colibri ({kernels}) "
                  f"{macs / statistics.median(ours_s) / 1e9:7.1f}  torch "
                  f"{macs / statistics.median(theirs_s) / 1e9:7.1f}  ratio {statistics.median(ratios):5.2f}x "
                  f"({np.quantile(ratios, 0.25):.2f}-{np.quantile(ratios, 0.75):.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
