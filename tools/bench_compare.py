"""Colibri against Hugging Face transformers on the same model, weights and dtype, CPU, same
thread count, in one process: the two take turns (A B, then B A) for every repeat of the prefill
and of the decode, and each ratio is the median of the per-turn ratios. On a shared VM whose
speed moves by 10-50 % from one minute to the next, only such pairs compare like with like; the
medians of each engine's own runs are printed too.

Both do the same work: the prefill asks each for the last position's logits only (transformers'
`logits_to_keep=1`, as its `generate` does; Colibri's `prefill(..., all_logits=False)`). The LM
head over every prompt position adds a fifth to the multiply-adds of a 128-token prefill of the
0.64 B bench model (Colibri 1.07-1.20x slower with it), so asking one engine for more logits than
the other skews the ratio. Decode feeds both the same fixed tokens, so neither's choice of token
changes the other's work.

    python tools/bench_compare.py HF_DIR FILE.colibri [--dtype f32|bf16] [--numerics act-bf16]
                                  [-p 128] [-n 32] [-t 2] [-r 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from colibri.cli.common import numerics_spec

SETTLE_S = 0.02  # between turns: the other engine's spinning worker threads go to sleep


def hf_runner(hf_dir: str, dtype: str, threads: int) -> tuple[Callable[[np.ndarray], Any],
                                                               Callable[[Any, np.ndarray], None]]:
    """(prefill(tokens) -> cache, decode(cache, tokens)) for transformers on the CPU."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch_dtype).eval()

    def prefill(tokens: np.ndarray) -> Any:
        with torch.inference_mode():
            ids = torch.tensor(tokens[None, :], dtype=torch.long)
            return model(ids, use_cache=True, logits_to_keep=1).past_key_values

    def decode(past: Any, tokens: np.ndarray) -> None:
        with torch.inference_mode():
            for t in tokens:
                past = model(torch.tensor([[int(t)]]), past_key_values=past, use_cache=True,
                             logits_to_keep=1).past_key_values

    return prefill, decode


def colibri_runner(path: str, threads: int, max_context: int, numerics: str | None
                   ) -> tuple[Callable[[np.ndarray], Any], Callable[[Any, np.ndarray], None], str]:
    from colibri.engine import Model, Session

    session = Session(Model.open(path), threads=threads, max_context=max_context, trace=False,
                      numerics=numerics)

    def prefill(tokens: np.ndarray) -> Any:
        session.reset()
        session.prefill(tokens, all_logits=False)
        return session

    def decode(s: Any, tokens: np.ndarray) -> None:
        for t in tokens:
            s.step(int(t))

    return prefill, decode, f"{session.kernels}, numerics {session.numerics.spec}"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    time.sleep(SETTLE_S)
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def compare(hf: tuple[Callable[..., Any], Callable[..., None]],
            colibri: tuple[Callable[..., Any], Callable[..., None]], prompt: np.ndarray,
            continuation: np.ndarray, repeats: int) -> dict[str, list[float]]:
    """Seconds of every prefill and decode of each engine, taking turns."""
    runners = {"transformers": hf, "colibri": colibri}
    for prefill, decode in runners.values():  # warm: weights paged in, threads started
        decode(prefill(prompt[:8]), continuation[:2])
    times: dict[str, list[float]] = {f"{e} {p}": [] for e in runners for p in ("prefill", "decode")}
    for rep in range(repeats):
        for engine in (("colibri", "transformers") if rep % 2 == 0 else ("transformers", "colibri")):
            prefill, decode = runners[engine]
            t, cache = timed(lambda: prefill(prompt))
            times[f"{engine} prefill"].append(t)
            t, _ = timed(lambda: decode(cache, continuation))
            times[f"{engine} decode"].append(t)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hf_dir")
    p.add_argument("colibri_file")
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    p.add_argument("--numerics", type=numerics_spec, default=None, metavar="SPEC",
                   help="Colibri's numerics variant, e.g. act-bf16 (activations rounded to bf16, "
                        "as transformers computes in bf16); default: exact")
    p.add_argument("-p", type=int, default=128, help="prompt tokens")
    p.add_argument("-n", type=int, default=32, help="decoded tokens")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-r", "--repeats", type=int, default=9, help="turns of each engine")
    args = p.parse_args(argv)
    from colibri.engine import Model

    vocab = Model.open(args.colibri_file).hparams.vocab_size
    tokens = np.random.default_rng(0).integers(0, vocab, size=args.p + args.n)
    prompt, continuation = tokens[: args.p], tokens[args.p:]
    colibri_prefill, colibri_decode, kernels = colibri_runner(
        args.colibri_file, args.threads, args.p + args.n + 8, args.numerics)
    hf = hf_runner(args.hf_dir, args.dtype, args.threads)
    times = compare(hf, (colibri_prefill, colibri_decode), prompt, continuation, args.repeats)

    print(f"{args.p}-token prefill and {args.n} decoded tokens, {args.threads} thread(s), "
          f"{args.repeats} turns each; colibri: {kernels}; transformers: {args.dtype}")
    for phase, count in (("prefill", args.p), ("decode", args.n)):
        ours, theirs = times[f"colibri {phase}"], times[f"transformers {phase}"]
        ratios = sorted(t / o for o, t in zip(ours, theirs))
        print(f"{phase:8s} colibri {count / statistics.median(ours):8.1f} tok/s, transformers "
              f"{count / statistics.median(theirs):8.1f} tok/s; ratio colibri / transformers "
              f"{statistics.median(ratios):.2f}x (per turn, quartiles {np.quantile(ratios, 0.25):.2f}-"
              f"{np.quantile(ratios, 0.75):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
