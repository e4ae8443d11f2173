"""`colibri validate`, `colibri info`, `colibri dump`: is a file sound, what is in it, what are a
tensor's values."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import numpy as np

from colibri.cli.common import (EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE, add_file, add_json, error,
                                fail, open_model, unreadable)
from colibri.errors import ColibriError, ColibriIOError

METADATA_SHOWN = 2000   # characters of the user metadata `info` prints


def _other_format(args: argparse.Namespace, command: str) -> int | None:
    """GGUF files and safetensors checkpoints, told apart by their content, are validated, shown
    and dumped by colibri.formats.commands; None for every other path (a .colibri file, or one
    that cannot be read), which `open_model` and the command's own code handle."""
    from colibri.formats import commands
    return commands.run(args, command)


def cmd_validate(args: argparse.Namespace) -> int:
    from colibri.engine import validate
    from colibri.inspection.report import validation_json, validation_lines

    other = _other_format(args, "validate")
    if other is not None:
        return other
    reason = unreadable(args.file)
    try:
        if reason is not None:
            raise ColibriIOError(reason, 1)
        problems = validate(args.file, checksums=args.checksums, nan_check=args.nan_check)
    except (ColibriIOError, OSError) as exc:
        if args.json:
            print(validation_json([], None, str(exc)))
        else:
            error(str(exc))
        return EXIT_UNREADABLE
    except ColibriError as exc:  # the engine refused to validate (e.g. out of memory)
        error(str(exc))
        return EXIT_INVALID
    print(validation_json(problems, "colibri") if args.json else
          "\n".join(validation_lines(args.file, problems)))
    return EXIT_INVALID if any(p.severity == "error" for p in problems) else EXIT_OK


def _field_value(value: int | float | bytes | None) -> Any:
    """A header value for JSON: bytes as hex (or a count of zeros), numbers as they are."""
    if isinstance(value, bytes):
        return value.hex() if any(value) else f"{len(value)} zero bytes"
    return value


def _show(value: int | float | bytes | None) -> str:
    """A header or hyper-parameter value for people: float32 fields without float64 noise."""
    if isinstance(value, float):
        return f"{value:.7g}"
    if isinstance(value, bytes) and any(value) and all(32 <= b < 127 for b in value):
        return repr(value)
    return str(_field_value(value))


def _flag_names(flags: int) -> str:
    from colibri.engine import ffi

    names = [name.removeprefix("COL_FLAG_") for bit, name in
             sorted(ffi.typeof("col_model_flag").elements.items()) if flags & bit]
    unknown = flags & ~sum(ffi.typeof("col_model_flag").elements)
    if unknown:
        names.append(f"0x{unknown:X}")
    return "|".join(names) or "none"


def cmd_info(args: argparse.Namespace) -> int:
    other = _other_format(args, "info")
    if other is not None:
        return other
    with open_model(args.file) as model:
        header = model.header_fields()
        tensors = model.tensors
        user = model.metadata["user"]
        hp = model.hparams.to_dict()
        routing = [model.routing(layer) for layer in range(model.hparams.n_layers)]
        if args.json:
            doc = {
                "path": model.path, "format": "colibri", "arch": model.arch, "size": model.size,
                "header": [{"name": f.name, "group": f.group, "offset": f.offset, "size": f.size,
                            "kind": f.kind, "value": _field_value(f.value)} for f in header],
                "hparams": hp, "user_metadata": user,
                "routing": [{**dataclasses.asdict(r), "rule": r.describe()} for r in routing],
                "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                             "offset": t.offset, "nbytes": t.nbytes, "crc32": t.crc32}
                            for t in tensors],
            }
            print(json.dumps(doc, indent=2, default=str))
            return EXIT_OK
        print(f"{model.path}: {model.arch}, {model.size} bytes, {len(tensors)} tensors")
        print("\nheader:")
        for f in header:
            value = (f"0x{f.value:08X}" if f.name.endswith("crc32") and isinstance(f.value, int)
                     else _show(f.value))
            print(f"  0x{f.offset:03X}  {f.name:<28} {value}")
        print("\nhyper-parameters:")
        for name, value in hp.items():
            extra = f" ({_flag_names(int(value))})" if name == "flags" else ""
            print(f"  {name:<28} {_show(value)}{extra}")
        print("\nrouting:")
        for r in routing:
            print(f"  layer {r.layer:<4} {r.describe()}")
        if user is not None:  # as stored, so that colibri-c (which cannot re-serialise) agrees
            meta = model.sections["metadata"]
            text = bytes(model.bytes()[meta.offset:meta.end]).decode("utf-8")
            print("\nuser metadata:")
            print("  " + text[:METADATA_SHOWN].replace("\n", "\n  "))
        print("\ntensors:")
        width = max((len(t.name) for t in tensors), default=4)
        print(f"  {'name':<{width}}  dtype  {'shape':<20} {'offset':>12} {'bytes':>12}")
        for t in tensors:
            shape = "[" + ", ".join(map(str, t.shape)) + "]"
            print(f"  {t.name:<{width}}  {t.dtype:<5}  {shape:<20} 0x{t.offset:010X} {t.nbytes:>12}")
    return EXIT_OK


def cmd_dump(args: argparse.Namespace) -> int:
    other = _other_format(args, "dump")
    if other is not None:
        return other
    with open_model(args.file) as model:
        if args.tensor not in model:
            fail(f"{args.file}: no tensor {args.tensor!r} (see `colibri info {args.file}`)")
        info = model.tensor_info(args.tensor)
        values = model.tensor_f32(args.tensor)
    finite = values[np.isfinite(values)]
    print(f"{info.name}: dtype {info.dtype}, shape {list(info.shape)}, offset 0x{info.offset:X}, "
          f"{info.nbytes} bytes, crc32 0x{info.crc32:08X}")
    if finite.size:
        print(f"min {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}  "
              f"std {finite.std():.6g}")
    print(f"nan {int(np.isnan(values).sum())}  inf {int(np.isinf(values).sum())}")
    rows = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values
    n = max(args.rows, 0)
    print(f"first {min(n, rows.shape[0])} row(s):")
    with np.printoptions(precision=5, suppress=True, linewidth=120):
        print(rows[:n])
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("validate", help="check a .colibri, GGUF or safetensors file (or "
                                        "checkpoint directory); exit 0 valid, 1 invalid, "
                                        "2 unreadable")
    add_file(p)
    p.add_argument("--checksums", action="store_true", help="verify every tensor's CRC-32 "
                   "(GGUF, safetensors: read every tensor's bytes)")
    p.add_argument("--nan-check", action="store_true", help="scan every tensor for NaN/Inf")
    add_json(p, 'print {"valid": ..., "problems": [...]}')
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("info", help="header fields, hyper-parameters and tensor table")
    add_file(p)
    add_json(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("dump", help="statistics and first rows of one tensor")
    add_file(p)
    p.add_argument("--tensor", required=True, metavar="NAME")
    p.add_argument("--rows", type=int, default=4, metavar="N",
                   help="rows to print (of the tensor viewed as [-1, last dim]); default 4")
    p.set_defaults(func=cmd_dump)
