"""`colibri convert`: a Hugging Face checkpoint (colibri.convert), a GGUF file
(colibri.convert_gguf) or a .colibri file (colibri.relayout: its quantised and bf16 tensors re-laid
out), chosen by the content, to a .colibri file."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from colibri.cli.common import EXIT_OK, error, fail
from colibri.values import DEFAULT_LAYOUT, LAYOUTS, QUANTIZE_TENSORS


def _progress_line(done: int, total: int) -> None:
    print(f"\rconverting: {done}/{total} tensors", end="", file=sys.stderr, flush=True)


def _file_format(path: str) -> str | None:
    """'gguf' or 'colibri' for such a file, else None (a checkpoint directory, or a path the
    converter reports in its own words)."""
    from colibri.errors import ColibriError
    from colibri.formats import detect
    try:
        found = detect(path) if os.path.isfile(path) else None
    except ColibriError:
        return None
    return found if found in ("gguf", "colibri") else None


def cmd_convert(args: argparse.Namespace) -> int:
    try:
        from colibri import convert  # here, not at import: a test may stand in for it
    except ImportError as exc:
        fail(f"the converter is not available: {exc}")
    progress = _progress_line if sys.stderr.isatty() else None
    source = _file_format(args.hf_dir)
    if source == "colibri" and (args.dtype or args.quantize):
        fail("a .colibri input is only re-laid out (--layout): --dtype and --quantize need the "
             "checkpoint or GGUF file it came from")
    try:
        quant = ({"quantize": args.quantize, "quantize_tensors": args.quantize_tensors}
                 if args.quantize else {})
        dtype = args.dtype or "f32"
        warnings: list[str] = []   # what the file written lacks (colibri.convert's say)
        if source == "colibri":
            from colibri.relayout import relayout
            relayout(args.hf_dir, args.out, args.layout, progress=progress)
        elif source == "gguf":
            from colibri.convert_gguf import convert_gguf
            convert_gguf(args.hf_dir, args.out, dtype=dtype, progress=progress,
                         layout=args.layout, **quant)
        else:
            warnings = convert.convert(args.hf_dir, args.out, dtype=dtype, progress=progress,
                                       layout=args.layout, **quant)
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
                                       "to .colibri, or re-lay out a .colibri file")
    p.add_argument("hf_dir", metavar="HF_DIR|MODEL.gguf|MODEL.colibri",
                   help="a .colibri file is rewritten with its quantised and bf16 tensors in "
                        "--layout (same values; OUT may be the same path)")
    p.add_argument("out", metavar="OUT.colibri")
    p.add_argument("--dtype", choices=("f32", "f16", "bf16"), default=None,
                   help="storage dtype of the matrices (default f32; norms and routers stay "
                        "f32); for GGUF, of tensors whose type Colibri does not store (K-quants, "
                        "IQ...)")
    p.add_argument("--quantize", choices=("q8", "q4"), default=None,
                   help="store the --quantize-tensors matrices as q8_0 / q4_0 blocks of 32")
    p.add_argument("--quantize-tensors", choices=QUANTIZE_TENSORS, default="experts",
                   help="experts (default): moe_w1/w2/w3; ffn: + shared experts and dense MLPs; "
                        "all: + attention and LM head; llama.cpp: llama-quantize's Q8_0/Q4_0 "
                        "recipe (every matrix, embeddings included; LM head q8_0; attn_k/v q8_0 "
                        "with 8 experts). The router is never quantised")
    p.add_argument("--layout", choices=LAYOUTS, default=DEFAULT_LAYOUT,
                   help="how matrices are stored (default %(default)s): panels: q8_0/q4_0 in "
                        "panels of 8 rows (dtypes q8_0x8/q4_0x8), the order the AVX2 kernels "
                        "read, faster for prompts and batches (embeddings stay rows); "
                        "bf16-panels: those, and bf16 in panels of 16 rows (bf16x16), faster "
                        "prompts on CPUs without AMX (exact results differ in the last bits: "
                        "each output is one chain over its row); rows: row after row, as files "
                        "before panels. The same bytes and values every way")
    p.set_defaults(func=cmd_convert)
