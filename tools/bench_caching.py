#!/usr/bin/env python3
"""Expert caching's cost: the same greedy decode under plain top-k, with an LRU of resident
experts, and under cached routing with the LRU, in one process.

Variants, interleaved repeat by repeat (drift in clock speed or load hits them alike), each a
fresh session with the trace off decoding the same prompt:
  plain     Session(routing="topk")
  lru       Session(routing="topk", expert_cache=C)
  cached    Session(routing="cached", cache_threshold=T, expert_cache=C)
Prints the median per-position decode time of each, the overhead against `plain` (ratio of
medians and the median of per-repeat paired ratios, robust to load that drifts) and each
variant's hit rate. The decode runs of `cached` can differ in tokens (it routes differently);
the per-position time is what is compared.

    python tools/bench_caching.py [--model FILE] [--repeats 11] [--new 64] [--threads 1]
                                  [--expert-cache C] [--threshold T]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "demo" / "demo.colibri"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEMO)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--new", type=int, default=64, help="tokens to generate per run")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--expert-cache", type=int, default=0,
                    help="LRU experts per MoE layer (default: twice the top-k, at most all)")
    ap.add_argument("--threshold", type=float, default=0.5)
    args = ap.parse_args()

    from colibri.engine import Model, Session

    model = Model.open(args.model)
    hp = model.hparams
    capacity = args.expert_cache or min(2 * hp.n_experts_active, hp.n_experts)
    prompt = [int(t) % hp.vocab_size for t in (3, 4, 5, 6, 7, 8, 9, 10)]
    new = min(args.new, hp.max_context - len(prompt) + 1)
    variants = {
        "plain": {},
        "lru": {"expert_cache": capacity},
        "cached": {"routing": "cached", "cache_threshold": args.threshold,
                   "expert_cache": capacity},
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    rates: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, kwargs in variants.items():
            with Session(model, threads=args.threads, trace=False,
                         max_context=len(prompt) + new, **kwargs) as s:
                s.prefill(prompt, all_logits=False)
                token = int(s.step(1).argmax())
                t0 = time.perf_counter_ns()
                for _ in range(new - 2):
                    token = int(s.step(token).argmax())
                times[name].append((time.perf_counter_ns() - t0) / (new - 2) / 1e3)
                rates[name] = s.cache_stats().hit_rate
    print(f"model {args.model.name}: {hp.n_moe_layers} MoE layers, top-{hp.n_experts_active} of "
          f"{hp.n_experts}; LRU of {capacity}, threshold {args.threshold:g}; {new - 2} decode "
          f"steps x {args.repeats} repeats, {args.threads} thread(s)")
    base = statistics.median(times["plain"])
    for name, values in times.items():
        median = statistics.median(values)
        paired = statistics.median(v / p for v, p in zip(values, times["plain"]))
        rate = rates[name]
        hit = "-" if rate != rate else f"{100 * rate:.1f} %"
        print(f"{name:<8} {median:9.1f} us/position  x{median / base:.3f} of plain (paired "
              f"x{paired:.3f})  hit rate {hit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
