"""Accuracy report of quantised files against an unquantised reference: top-1 next-token
agreement, KL(reference || quantised) of the next-token distributions (mean and max), and routing
agreement: the share of (position, MoE layer) decisions whose selected expert set is the
reference's, overall and by the reference's selection margin (its k-th minus (k+1)-th router
logit, colibri.jitter.margins), so a recipe that only moves close calls shows apart from one that
moves decisive ones. Each row also gives the bytes of weights a token reads (colibri.bench), the
other side of the trade. The prompt is random token ids (or the model's tokenizer on --text),
run teacher-forced through both files.

Both recipes of `colibri convert --quantize` are covered (--recipes): `experts` (the default:
the expert matrices only, router and attention kept) and `llama.cpp` (llama-quantize's Q8_0 /
Q4_0: embeddings, attention and the LM head too; docs/converter.md).

    python tools/quant_accuracy.py REF.colibri TEST.colibri [TEST ...]    # files made elsewhere
    python tools/quant_accuracy.py --hf HF_DIR [--dtype bf16]   # a checkpoint (e.g. a bench model)
    python tools/quant_accuracy.py --conformance                # tests/hf_reference's models
    python tools/quant_accuracy.py --requantize FILE [--text F] # a .colibri file (the demo model)
    common: [--quant q8,q4] [--recipes experts,llama.cpp] [-n 128] [--text FILE]

--hf converts the checkpoint to f32 (the reference), to --dtype unquantised, and to --dtype
quantised with each recipe, as `colibri convert` would. --requantize writes FILE's weights as f32
(the reference) and quantised from those f32 values, everything else f32.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from colibri.bench import weight_bytes_per_token
from colibri.engine import Model, Session
from colibri.jitter import margins

# Edges of the margin bins (absolute router-logit difference of the reference's k-th and
# (k+1)-th expert): a quantisation error of the logits of about the size of a bin's margins
# flips decisions of that bin.
MARGIN_EDGES = (1e-3, 1e-2, 1e-1, 1.0)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _bin_labels() -> list[str]:
    edges = [f"{e:g}" for e in MARGIN_EDGES]
    return ([f"<{edges[0]}"] + [f"{a}-{b}" for a, b in zip(edges, edges[1:])]
            + [f">={edges[-1]}"])


def compare(ref: str, test: str, n: int = 128, threads: int = 2, seed: int = 0,
            text: str | None = None) -> dict[str, Any]:
    with Model.open(ref) as a, Model.open(test) as b:
        vocab = a.hparams.vocab_size
        limit = min(n, a.hparams.max_context - 1)
        if text is not None:
            tokens = np.asarray(a.tokenizer.encode(text).ids[:limit], dtype=np.int32)
        else:
            tokens = np.random.default_rng(seed).integers(0, vocab, size=limit)
        sa = Session(a, threads=threads, max_context=len(tokens) + 1)
        sb = Session(b, threads=threads, max_context=len(tokens) + 1)
        la, lb = sa.prefill(tokens), sb.prefill(tokens)
        pa, pb = _softmax(la.astype(np.float64)), _softmax(lb.astype(np.float64))
        kl = np.sum(pa * (np.log(pa + 1e-300) - np.log(pb + 1e-300)), axis=-1)
        ia, ib = np.sort(sa.trace.expert_ids, -1), np.sort(sb.trace.expert_ids, -1)
        same = np.all(ia == ib, axis=-1)                                  # [positions, moe layers]
        margin, _ = margins(sa.trace.router_logits, a.hparams.n_experts_active)
        bins = np.digitize(margin, MARGIN_EDGES)
        by_margin = [{"margin": label, "cells": int(np.sum(bins == i)),
                      "agree": float(np.mean(same[bins == i])) if np.any(bins == i) else None}
                     for i, label in enumerate(_bin_labels())]
        return {"top1": float(np.mean(la.argmax(-1) == lb.argmax(-1))),
                "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                "routing": float(np.mean(same)), "routing_by_margin": by_margin,
                "positions": len(tokens), "mb_per_token": weight_bytes_per_token(b) / 1e6}


def _share(agree: float | None) -> str:
    return "-" if agree is None else f"{100 * agree:.1f}%"


def _row(name: str, r: dict[str, Any]) -> str:
    bins = "  ".join(f"{b['margin']}: {_share(b['agree'])} of {b['cells']}"
                     for b in r["routing_by_margin"])
    return (f"{name:40s} {r['mb_per_token']:8.4g} MB/token  top-1 {100 * r['top1']:6.2f}%  "
            f"KL mean {r['kl_mean']:.2e} max {r['kl_max']:.2e}  routing {100 * r['routing']:6.2f}%"
            f"  ({r['positions']} positions)\n{'':40s} routing by the reference's margin: {bins}")


def conformance(quants: list[str], recipes: list[str], n: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import hf_reference as hr
    from colibri.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        for v in hr.VARIANTS:
            hf = hr.save(hr.build(v), Path(tmp) / v.name)
            ref = Path(tmp) / f"{v.name}-f32.colibri"
            convert(hf, ref, "f32")
            for q in quants:
                for recipe in recipes:
                    out = Path(tmp) / f"{v.name}-{q}-{recipe}.colibri"
                    convert(hf, out, "f32", quantize=q, quantize_tensors=recipe)
                    with Model.open(out) as m:
                        qd = sorted({t.dtype for t in m.tensors if t.dtype.startswith("q")})
                    note = "" if qd else " (rows not multiples of 32: nothing quantised)"
                    print(_row(f"{v.name} {q} {recipe}{note}", compare(str(ref), str(out), n)),
                          flush=True)


def checkpoint(hf: str, dtype: str, quants: list[str], recipes: list[str], n: int,
               text: str | None) -> None:
    from colibri.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "f32.colibri"
        convert(hf, ref, "f32")
        outs = [(dtype, Path(tmp) / f"{dtype}.colibri", {})] if dtype != "f32" else []
        outs += [(f"{dtype} {q} {recipe}", Path(tmp) / f"{q}-{recipe}.colibri",
                  {"quantize": q, "quantize_tensors": recipe})
                 for q in quants for recipe in recipes]
        for name, out, quant in outs:
            convert(hf, out, dtype, **quant)
            print(_row(f"{Path(hf).name} {name}", compare(str(ref), str(out), n, text=text)),
                  flush=True)
            out.unlink()


def requantize(path: str, quants: list[str], recipes: list[str], n: int,
               text: str | None) -> None:
    from colibri.jitter.weights import convert_weights

    with tempfile.TemporaryDirectory() as tmp, Model.open(path) as model:
        ref = Path(tmp) / "f32.colibri"
        convert_weights(model, "f32", ref)
        for q in quants:
            for recipe in recipes:
                out = Path(tmp) / f"{q}-{recipe}.colibri"
                convert_weights(model, "f32", out, quantize=q, quantize_tensors=recipe)
                print(_row(f"{Path(path).name} {q} {recipe}",
                           compare(str(ref), str(out), n, text=text)), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*")
    p.add_argument("--conformance", action="store_true")
    p.add_argument("--hf", metavar="DIR", help="a Hugging Face checkpoint to convert and compare")
    p.add_argument("--dtype", default="bf16", choices=("f32", "f16", "bf16"),
                   help="--hf: the storage the quantised files are made from (default bf16)")
    p.add_argument("--quant", default="q8,q4")
    p.add_argument("--recipes", default="experts,llama.cpp",
                   help="--quantize-tensors choices to compare (default experts,llama.cpp)")
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--requantize", metavar="FILE")
    p.add_argument("--text", metavar="FILE", help="prompt text (tokenized by the model)")
    args = p.parse_args(argv)
    text = Path(args.text).read_text(encoding="utf-8") if args.text else None
    quants, recipes = args.quant.split(","), args.recipes.split(",")
    if args.conformance:
        conformance(quants, recipes, args.n)
    if args.hf:
        checkpoint(args.hf, args.dtype, quants, recipes, args.n, text)
    if args.requantize:
        requantize(args.requantize, quants, recipes, args.n, text)
    if len(args.files) >= 2:
        for test in args.files[1:]:
            print(_row(Path(test).name, compare(args.files[0], test, args.n, text=text)),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
