"""`colibri validate`, `info` and `dump` for GGUF and safetensors files (the CLI's `.colibri`
paths stay in colibri.cli; `run(args, command)` answers None for a `.colibri` file so the caller
goes on with its own). Exit codes and errors are colibri.cli.common's."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from colibri.cli.common import EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE, error
from colibri.errors import ColibriError, ColibriFormatError, ColibriIOError
from colibri.formats import detect, open_file, validate
from colibri.inspection.report import validation_json, validation_lines


def run(args: argparse.Namespace, command: str) -> int | None:
    """Handle `command` ('validate', 'info', 'dump') for a GGUF or safetensors path; None when
    the path is (or may be) a .colibri file, which the caller handles."""
    try:
        fmt = detect(args.file)
    except ColibriIOError:
        return None  # the caller reports unreadable paths the same way for every format
    if fmt not in ("gguf", "safetensors"):
        return None
    return {"validate": _validate, "info": _info, "dump": _dump}[command](args, fmt)


def _validate(args: argparse.Namespace, fmt: str) -> int:
    try:
        _, problems = validate(args.file, checksums=args.checksums, nan_check=args.nan_check)
    except (ColibriIOError, OSError) as exc:
        if args.json:
            print(validation_json([], fmt, str(exc)))
        else:
            error(str(exc))
        return EXIT_UNREADABLE
    print(validation_json(problems, fmt) if args.json else
          "\n".join(validation_lines(args.file, problems, fmt)))
    return EXIT_INVALID if any(p.severity == "error" for p in problems) else EXIT_OK


def _open(path: str) -> Any:
    try:
        return open_file(path), None
    except ColibriFormatError as exc:
        error(str(exc))
        return None, EXIT_INVALID
    except (ColibriIOError, OSError) as exc:
        error(str(exc))
        return None, EXIT_UNREADABLE


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _info(args: argparse.Namespace, fmt: str) -> int:
    f, code = _open(args.file)
    if f is None:
        return code
    tensors = f.tensors
    metadata = f.metadata() if fmt == "gguf" else f.metadata
    if args.json:
        doc: dict[str, Any] = {"path": args.file, "format": fmt, "size": f.size,
                               "metadata": _json_value(metadata)}
        if fmt == "gguf":
            doc.update(version=f.layout.version, alignment=f.layout.alignment,
                       data_offset=f.layout.data_offset, architecture=f.architecture)
        else:
            doc["files"] = [p for p in f.layout.shard_paths]
        rows = []
        for t in tensors:
            row = t.to_dict()
            if fmt == "gguf":
                row["ne"] = list(f.ne(t.name))
            else:
                row["file"] = t.path
            rows.append(row)
        doc["tensors"] = rows
        print(json.dumps(doc, indent=2, ensure_ascii=False))
        return EXIT_OK
    total = sum(t.nbytes for t in tensors)
    what = (f"GGUF v{f.layout.version}, {f.architecture or 'no architecture'}" if fmt == "gguf"
            else f"safetensors, {len(f.files)} file(s)")
    print(f"{args.file}: {what}, {f.size} bytes, {len(tensors)} tensors ({total} bytes of data)")
    print("\nmetadata:")
    for key, value in metadata.items():
        text = json.dumps(_json_value(value), ensure_ascii=False)
        print(f"  {key:<40} {text if len(text) <= 100 else text[:97] + '...'}")
    print("\ntensors:")
    width = max([4] + [len(t.name) for t in tensors])
    shards = fmt == "safetensors" and len(f.files) > 1  # offsets are within each shard
    print(f"  {'name':<{width}}  {'dtype':<7} {'shape':<20} {'offset':>12} {'bytes':>12}"
          + ("  file" if shards else ""))
    for t in tensors:
        shape = "[" + ", ".join(map(str, t.shape)) + "]"
        where = f"  {os.path.basename(t.path)}" if shards else ""
        print(f"  {t.name:<{width}}  {t.dtype:<7} {shape:<20} 0x{t.offset:010X} {t.nbytes:>12}"
              f"{where}")
    return EXIT_OK


def _dump(args: argparse.Namespace, fmt: str) -> int:
    f, code = _open(args.file)
    if f is None:
        return code
    if args.tensor not in f:
        error(f"{args.file}: no tensor {args.tensor!r} (see `colibri info {args.file}`)")
        return EXIT_INVALID
    t = f.tensor_info(args.tensor)
    try:
        values = f.tensor_f32(args.tensor)
    except (ColibriError, ValueError) as exc:
        error(f"{args.tensor}: cannot read values: {exc}")
        return EXIT_INVALID
    where = f", file {t.path}" if fmt == "safetensors" and t.path else ""
    print(f"{t.name}: dtype {t.dtype}, shape {list(t.shape)}, offset 0x{t.offset:X}, "
          f"{t.nbytes} bytes{where}")
    finite = values[np.isfinite(values)]
    if finite.size:
        print(f"min {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}  "
              f"std {finite.std():.6g}")
    print(f"nan {int(np.isnan(values).sum())}  inf {int(np.isinf(values).sum())}")
    rows = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values.reshape(-1)
    n = max(args.rows, 0)
    print(f"first {min(n, rows.shape[0])} row(s):")
    with np.printoptions(precision=5, suppress=True, linewidth=120):
        print(rows[:n])
    return EXIT_OK


__all__ = ["run"]
