"""`colibri convert`: a Hugging Face checkpoint (colibri.convert) or a GGUF file
(colibri.convert_gguf, chosen by the file's content) to a .colibri file."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from colibri.cli.common import EXIT_OK, error, fail
from colibri.values import QUANTIZE_TENSORS


def _progress_line(done: int, total: int) -> None:
    print(f"\rconverting: {done}/{total} tensors", end="", file=sys.stderr, flush=True)


def _is_gguf(path: str) -> bool:
    from colibri.errors import ColibriError
    from colibri.formats import detect
    try:
        return os.path.isfile(path) and detect(path) == "gguf"
    except ColibriError:
        return False  # the converter reports the unreadable path in its own words


def cmd_convert(args: argparse.Namespace) -> int:
    try:
        from colibri import convert  # here, not at import: a test may stand in for it
    except ImportError as exc:
        fail(f"the converter is not available: {exc}")
    progress = _progress_line if sys.stderr.isatty() else None
    try:
        quant = ({"quantize": args.quantize, "quantize_tensors": args.quantize_tensors}
                 if args.quantize else {})
        warnings: list[str] = []   # what the file written lacks (colibri.convert's say)
        if _is_gguf(args.hf_dir):
            from colibri.convert_gguf import convert_gguf
            convert_gguf(args.hf_dir, args.out, dtype=args.dtype, progress=progress, **quant)
        else:
            warnings = convert.convert(args.hf_dir, args.out, dtype=args.dtype,
                                       progress=progress, **quant)
    except convert.ConversionError as exc:
        fail(f"conversion failed: {exc}")
    finally:
        if progress is not None:
            print(file=sys.stderr)
    for warning in warnings:
        error(f"warning: {warning}")
    print(f"wrote {args.out}")
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face MoE checkpoint or a GGUF file "
                                       "to .colibri")
    p.add_argument("hf_dir", metavar="HF_DIR|MODEL.gguf")
    p.add_argument("out", metavar="OUT.colibri")
    p.add_argument("--dtype", choices=("f32", "f16", "bf16"), default="f32",
                   help="storage dtype of the matrices (norms and routers stay f32); for GGUF, "
                        "of tensors whose type Colibri does not store (K-quants, IQ...)")
    p.add_argument("--quantize", choices=("q8", "q4"), default=None,
                   help="store the --quantize-tensors matrices as q8_0 / q4_0 blocks of 32")
    p.add_argument("--quantize-tensors", choices=QUANTIZE_TENSORS, default="experts",
                   help="experts (default): moe_w1/w2/w3; ffn: + shared experts and dense MLPs; "
                        "all: + attention and LM head; llama.cpp: llama-quantize's Q8_0/Q4_0 "
                        "recipe (every matrix, embeddings included; LM head q8_0; attn_k/v q8_0 "
                        "with 8 experts). The router is never quantised")
    p.set_defaults(func=cmd_convert)
