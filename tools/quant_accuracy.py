"""Accuracy report of quantised files against their f32 original: top-1 next-token agreement,
mean KL(f32 || quantised) of the next-token distributions, and routing agreement (fraction of
(position, MoE layer) decisions whose selected expert set is identical), over a prompt of
random token ids (or the model's tokenizer on --text).

    python tools/quant_accuracy.py REF_F32.colibri TEST.colibri [TEST ...] [-n 128]
    python tools/quant_accuracy.py --conformance [--quant q8,q4]   # tests/hf_reference models
    python tools/quant_accuracy.py --requantize FILE [--text F]   # e.g. the demo model

--requantize writes FILE's weights as f32 (the reference) and with its expert matrices as q8_0
and q4_0 (everything else f32), so the comparison isolates the quantisation of the experts.
--text tokenizes a text file with the model's own tokenizer instead of random ids.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from colibri.engine import Model, Session


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def compare(ref: str, test: str, n: int = 128, threads: int = 2, seed: int = 0,
            text: str | None = None) -> dict[str, float]:
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
        return {"top1": float(np.mean(la.argmax(-1) == lb.argmax(-1))),
                "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                "routing": float(np.mean(np.all(ia == ib, axis=-1))), "positions": len(tokens)}


def _row(name: str, r: dict[str, float]) -> str:
    return (f"{name:44s} top-1 {100 * r['top1']:6.2f}%  KL mean {r['kl_mean']:.2e} max "
            f"{r['kl_max']:.2e}  routing {100 * r['routing']:6.2f}%  ({r['positions']} positions)")


def conformance(quants: list[str], n: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import hf_reference as hr
    from colibri.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        for v in hr.VARIANTS:
            hf = hr.save(hr.build(v), Path(tmp) / v.name)
            ref = Path(tmp) / f"{v.name}-f32.colibri"
            convert(hf, ref, "f32")
            for q in quants:
                out = Path(tmp) / f"{v.name}-{q}.colibri"
                convert(hf, out, "f32", quantize=q, quantize_tensors="ffn")
                with Model.open(out) as m:
                    qd = sorted({t.dtype for t in m.tensors if t.dtype.startswith("q")})
                note = "" if qd else " (rows not multiples of 32: nothing quantised)"
                print(_row(f"{v.name} {q}{note}", compare(str(ref), str(out), n)), flush=True)


def requantize(path: str, quants: list[str], n: int, text: str | None) -> None:
    from colibri.jitter.weights import convert_weights

    with tempfile.TemporaryDirectory() as tmp, Model.open(path) as model:
        ref = Path(tmp) / "f32.colibri"
        convert_weights(model, "f32", ref)
        for q in quants:
            out = Path(tmp) / f"{q}.colibri"
            convert_weights(model, "f32", out, quantize=q)
            print(_row(f"{Path(path).name} experts {q}", compare(str(ref), str(out), n, text=text)),
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*")
    p.add_argument("--conformance", action="store_true")
    p.add_argument("--quant", default="q8,q4")
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--requantize", metavar="FILE")
    p.add_argument("--text", metavar="FILE", help="prompt text (tokenized by the model)")
    args = p.parse_args(argv)
    text = Path(args.text).read_text(encoding="utf-8") if args.text else None
    if args.conformance:
        conformance(args.quant.split(","), args.n)
    if args.requantize:
        requantize(args.requantize, args.quant.split(","), args.n, text)
    if len(args.files) >= 2:
        for test in args.files[1:]:
            print(_row(Path(test).name, compare(args.files[0], test, args.n, text=text)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
