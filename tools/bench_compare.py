"""Colibri against Hugging Face transformers on the same model, weights and dtype, CPU, same
thread count, in one process and one run, interleaved so both see the same (possibly shared)
machine. Prints prefill and decode tokens/s of each and the ratios.

Both do the same work: the prefill asks transformers for the last position's logits only
(`logits_to_keep=1`, as its `generate` does), since Colibri's prefill computes only those. With
every position's logits, transformers would also run the LM head over the whole prompt (bf16
prefill measured 1.20x slower that way, f32 1.02x), and the ratio would flatter Colibri.

    python tools/bench_compare.py HF_DIR FILE.colibri [--dtype f32|bf16] [-p 128] [-n 32] [-t 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def hf_bench(hf_dir: str, dtype: str, tokens: np.ndarray, n: int, threads: int,
             repeats: int) -> tuple[float, float]:
    import torch
    import transformers

    torch.set_num_threads(threads)
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch_dtype).eval()
    ids = torch.tensor(tokens[None, :], dtype=torch.long)
    pre, dec = [], []
    with torch.inference_mode():
        model(ids[:, :8])  # warm
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            pre.append(time.perf_counter() - t0)
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(n):
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
            dec.append(time.perf_counter() - t0)
    return len(tokens) / statistics.median(pre), n / statistics.median(dec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hf_dir")
    p.add_argument("colibri_file")
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    p.add_argument("-p", type=int, default=128)
    p.add_argument("-n", type=int, default=32)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-r", "--repeats", type=int, default=3)
    p.add_argument("--probe-mb", type=int, default=512, help="size of Colibri's bandwidth probe")
    p.add_argument("--numerics", default=None, metavar="SPEC",
                   help="Colibri's numerics variant, e.g. act-bf16 (activations rounded to bf16, "
                        "as transformers computes in bf16); default: exact")
    args = p.parse_args(argv)
    from colibri.bench import format_result, run_bench
    from colibri.engine import Model

    probe = args.probe_mb << 20
    c = run_bench(args.colibri_file, args.p, args.n, args.threads, args.repeats, probe, False,
                  numerics=args.numerics)
    vocab = Model.open(args.colibri_file).hparams.vocab_size
    tokens = np.random.default_rng(0).integers(0, vocab, size=args.p)
    hf_pre, hf_dec = hf_bench(args.hf_dir, args.dtype, tokens, args.n, args.threads, args.repeats)
    c2 = run_bench(args.colibri_file, args.p, args.n, args.threads, args.repeats, probe, False,
                   numerics=args.numerics)
    pre = statistics.mean([c.prefill_tok_s, c2.prefill_tok_s])
    dec = statistics.mean([c.decode_tok_s, c2.decode_tok_s])
    print(format_result(c2))
    print(f"\ntransformers {args.dtype}, {args.threads} threads: prefill {hf_pre:.1f} tok/s, "
          f"decode {hf_dec:.1f} tok/s")
    print(f"colibri, numerics {c2.numerics} (mean of runs before and after): prefill {pre:.1f} tok/s, "
          f"decode {dec:.1f} tok/s")
    print(f"ratio colibri / transformers: prefill {pre / hf_pre:.2f}x, decode {dec / hf_dec:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
