#!/usr/bin/env python3
"""Tracing overhead: the same greedy decode with the routing trace off and on, in one process.

Three variants, interleaved repeat by repeat (so drift in clock speed or cache state hits all of
them alike), each a fresh session decoding the same tokens (greedy decoding is deterministic and
tracing changes no bit):
  off       Session(trace=False), Session.generate
  on        Session(trace=True), the same (the engine's trace recording and phase timing)
  debugger  colibri.debugging.Debugger.run(): trace on, the prompt in pieces and then one
            position per step, each position's rows copied into the RoutingRecord and its
            events derived (what the Inspector pays)
  capture   `on` plus the hidden state after every layer captured (capture_hidden: what the
            reference diff runs with)
Prints the median per-position time of each and the overhead against `off` (ratio of medians,
and the median of per-repeat paired ratios, which is robust to a machine whose load drifts).
Target (issue): `on` within 3% of `off`.

Model: resources/demo/demo.colibri when it exists, else --model, else a random mixtral-style
model built with the test fixtures' code at a larger size.

    python tools/bench_tracing.py [--model FILE] [--repeats 15] [--prompt 8] [--new 48] [--threads 1]

A longer `--prompt` measures what the debugger's run pays for the prompt against one prefill.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "demo" / "demo.colibri"


def build_model(directory: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_tiny_model  # the fixtures' builder, at a bigger size

    return make_tiny_model(directory, "mixtral", n_layers=6, n_experts=16, top_k=4, d_model=256,
                           vocab_size=2048, seed=1).path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens per run")
    ap.add_argument("--new", type=int, default=48, help="tokens to generate per run")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    from colibri.debugging import Debugger
    from colibri.values import RunSettings
    from colibri.engine import Model, Session

    tmp = tempfile.TemporaryDirectory()
    path = args.model or (DEMO if DEMO.exists() else build_model(Path(tmp.name)))
    model = Model.open(path)
    hp = model.hparams
    prompt = [(3 + i) % hp.vocab_size for i in range(args.prompt)]
    new = min(args.new, hp.max_context - len(prompt) + 1)
    positions = len(prompt) + new - 1

    def engine(trace: bool, capture: bool = False) -> float:
        session = Session(model, threads=args.threads, max_context=positions, trace=trace,
                          capture_hidden=capture)
        t0 = time.perf_counter_ns()
        generation = session.generate(prompt, new, eos=None)
        dt = time.perf_counter_ns() - t0
        assert generation.positions == positions
        session.close()
        return dt / positions

    def debugger() -> float:
        dbg = Debugger(model, RunSettings(tuple(prompt), new, threads=args.threads))
        t0 = time.perf_counter_ns()
        dbg.run()
        dt = time.perf_counter_ns() - t0
        assert dbg.position == positions
        dbg.close()
        return dt / positions

    variants = {"off": lambda: engine(False), "on": lambda: engine(True), "debugger": debugger,
                "capture": lambda: engine(True, True)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        fn()
    names = list(variants)
    for r in range(args.repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order each repeat
            times[name].append(variants[name]())

    print(f"model {path} ({model.arch}, {hp.n_layers} layers, {hp.n_experts} experts, "
          f"top-{hp.n_experts_active}, d_model {hp.d_model}); {positions} positions per run, "
          f"{args.repeats} interleaved repeats, {args.threads} thread(s)")
    base = statistics.median(times["off"])
    for name in names:
        med = statistics.median(times[name])
        print(f"  {name:<9} median {med / 1e3:9.1f} us/position  "
              f"({(med / base - 1) * 100:+6.2f}% vs off)")
    # paired: each repeat's on/off ratio (both measured back to back), then the median
    paired = statistics.median(a / b for a, b in zip(times["on"], times["off"])) - 1
    overhead = statistics.median(times["on"]) / base - 1
    print(f"tracing overhead (on vs off): {overhead * 100:+.2f}% of medians, "
          f"{paired * 100:+.2f}% median paired  "
          f"[{'within' if min(overhead, paired) < 0.03 else 'ABOVE'} the 3% target]")
    capture = statistics.median(a / b for a, b in zip(times["capture"], times["on"])) - 1
    print(f"hidden-state capture (capture vs on): {capture * 100:+.2f}% median paired")
    debugger = statistics.median(a / b for a, b in zip(times["debugger"], times["on"]))
    print(f"the debugger's run (debugger vs on): {debugger:.3f}x the time, median paired")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
