"""A GGUF file or safetensors checkpoint open in the Inspector (Qt-free).

`ForeignDocument` owns what the views show about one such path: the validator's problems (a
broken file still opens into them), the metadata as key/type/value rows, the tensor table as
`TensorRow`s (GGUF block types as the dtype; layer from `blk.N.` or `model.layers.N.`; GGUF's
stacked `ffn_*_exps` as expert tensors), the bytes as a `HexSource` with regions for the header
structures and every tensor, a tensor's values (dequantised) with statistics, and the
per-expert comparison of a stacked expert tensor. Opening reads headers only; values are read
when asked. For a checkpoint of several shards the hex view shows one shard at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.engine import Problem
from colibri.errors import ColibriError, ColibriFormatError
from colibri.formats import detect, open_file
from colibri.formats.gguf_file import ArrayValue
from colibri.inspection.hexsource import BytesSource, FileSource, Region
from colibri.inspection.tensors import TensorRow

_LAYER = re.compile(r"^(?:blk|model\.layers)\.(\d+)\.")
_EXPERTS = re.compile(r"_exps\.weight$|\.experts\.\d+\.")


@dataclass(frozen=True)
class MetadataRow:
    """One metadata entry: GGUF key/value, safetensors `__metadata__` or index entry."""

    key: str
    type: str
    value: str
    offset: int
    size: int


@dataclass(frozen=True)
class ValueSummary:
    """Statistics of a tensor's (dequantised) values; `histogram` counts over [min, max]."""

    count: int
    nan_count: int
    inf_count: int
    min: float
    max: float
    mean: float
    std: float
    histogram: np.ndarray
    edges: np.ndarray


def _kind(name: str) -> str:
    if "token_embd" in name or "embed_tokens" in name:
        return "embedding"
    if name.startswith("output.") or "lm_head" in name:
        return "output"
    if "norm" in name:
        return "norm"
    if "ffn_gate_inp" in name or name.endswith("mlp.gate.weight") or "shared_expert_gate" in name:
        return "router"
    if "shexp" in name or "shared_expert" in name:
        return "shared"
    if _EXPERTS.search(name) or "experts" in name:
        return "experts"
    if "attn" in name:
        return "attention"
    return "mlp"


class ForeignDocument:
    """One GGUF or safetensors path: problems always, the reader when the file is valid."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.problems: list[Problem] = []
        self.file: Any = None
        self.open_error: Exception | None = None
        self.format = ""
        try:
            self.format = detect(self.path) or ""
            self.file = open_file(self.path)  # validates first, once
            self.problems = list(self.file.problems)
        except ColibriFormatError as exc:
            self.problems = list(exc.problems)
            self.open_error = exc
        except (ColibriError, OSError) as exc:
            self.open_error = exc

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip(os.sep))

    @property
    def size(self) -> int:
        if self.file is not None:
            return int(self.file.size)
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    @property
    def status(self) -> str:
        if self.open_error is not None and not self.problems:
            return "unreadable"
        if any(p.severity == "error" for p in self.problems):
            return "invalid"
        return "warnings" if self.problems else "valid"

    def explanation(self) -> str:
        """One sentence on what is wrong ("" for a clean file)."""
        if self.open_error is not None and not self.problems:
            return f"This file cannot be read: {self.open_error}."
        errs = [p for p in self.problems if p.severity == "error"]
        what = "GGUF file" if self.format == "gguf" else "safetensors checkpoint"
        if errs:
            first = errs[0]
            where = f" in tensor '{first.tensor}'" if first.tensor else ""
            more = f" and {len(errs) - 1} more" if len(errs) > 1 else ""
            return (f"This {what} is damaged: {first.message}{where} (at byte "
                    f"0x{first.offset:X}){more}. It is not read further; the report lists every "
                    "problem.")
        if self.problems:
            return f"This {what} is valid with {len(self.problems)} warning(s)."
        return ""

    # -- metadata and tensors --------------------------------------------------------------------

    def metadata_rows(self) -> list[MetadataRow]:
        f = self.file
        if f is None:
            return []
        rows = []
        if self.format == "gguf":
            shown = f.metadata()
            for kv in f.key_values:
                value = shown[kv.key]
                text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) \
                    else value
                kind = (f"{kv.value.element_type_name}[{kv.value.count}]"
                        if isinstance(kv.value, ArrayValue) else kv.type_name)
                rows.append(MetadataRow(kv.key, kind, text[:500], kv.offset,
                                        kv.end - kv.offset))
            return rows
        for group, values in f.metadata.items():
            for key, value in (values.items() if isinstance(values, dict) else [("", values)]):
                rows.append(MetadataRow(f"{group}.{key}" if key else group, type(value).__name__,
                                        json.dumps(value, ensure_ascii=False)[:500], 0, 0))
        return rows

    def tensor_rows(self) -> list[TensorRow]:
        f = self.file
        if f is None:
            return []
        rows = []
        for i, t in enumerate(f.tensors):
            m = _LAYER.match(t.name)
            kind = _kind(t.name)
            stacked = kind == "experts" and t.name.endswith("_exps.weight") and len(t.shape) == 3
            rows.append(TensorRow(t.name, i, int(m.group(1)) if m else None, None, kind, t.dtype,
                                  tuple(t.shape), t.offset, t.nbytes, 0,
                                  n_experts=t.shape[0] if stacked else 0))
        return rows

    # -- bytes -----------------------------------------------------------------------------------

    def shard_paths(self) -> list[str]:
        if self.file is not None and self.format == "safetensors":
            return [f.path for f in self.file.files]
        return [self.path] if os.path.isfile(self.path) else []

    def source(self, shard: int = 0) -> Any:
        paths = self.shard_paths()
        if not paths:
            return BytesSource(b"")
        try:
            return FileSource(paths[min(shard, len(paths) - 1)])
        except OSError:
            return BytesSource(b"")

    def regions(self, shard: int = 0) -> list[Region]:
        f = self.file
        if f is None:
            return []
        if self.format == "gguf":
            return f.regions
        files = f.files
        return files[min(shard, len(files) - 1)].regions if files else []

    # -- values ------------------------------------------------------------------------------------

    def values(self, name: str, expert: int | None = None) -> np.ndarray:
        """float32 values of tensor `name` (or one expert's slice of a stacked tensor)."""
        f = self.file
        if f is None:
            raise ValueError(f"{self.path} did not open")
        values = f.tensor_f32(name)
        if expert is not None:
            values = values[expert]
        return np.asarray(values, dtype=np.float32)

    def summary(self, name: str, expert: int | None = None, bins: int = 100) -> ValueSummary:
        v = self.values(name, expert).reshape(-1)
        finite = v[np.isfinite(v)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        hist, edges = np.histogram(finite, bins=bins, range=(lo, hi if hi > lo else lo + 1))
        return ValueSummary(int(v.size), int(np.isnan(v).sum()), int(np.isinf(v).sum()), lo, hi,
                            float(finite.mean()) if finite.size else 0.0,
                            float(finite.std()) if finite.size else 0.0, hist, edges)

    def expert_comparison(self, name: str) -> list[tuple[int, float, float, float]]:
        """(expert, Frobenius norm, mean, std) of each expert of a stacked tensor."""
        v = self.values(name)
        out = []
        for e in range(v.shape[0]):
            x = v[e][np.isfinite(v[e])]
            out.append((e, float(np.linalg.norm(x)), float(x.mean()) if x.size else 0.0,
                        float(x.std()) if x.size else 0.0))
        return out


# ---------------------------------------------------------------------------------------------
# Running a GGUF model in the debugger: imported once into a cache keyed by the file's identity


def cache_directory() -> str:
    """$COLIBRI_CACHE/imports (default ~/.cache/colibri/imports)."""
    root = os.environ.get("COLIBRI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "colibri")
    return os.path.join(root, "imports")


def import_path(path: str | os.PathLike[str]) -> str:
    """Where the import of the GGUF file at `path` lives: named by the file's real path, size,
    modification time and inode, so an edited or replaced file gets a new import."""
    real = os.path.realpath(os.fspath(path))
    st = os.stat(real)
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}".encode())
    stem = os.path.splitext(os.path.basename(real))[0]
    return os.path.join(cache_directory(), f"{stem}-{key.hexdigest()[:16]}.colibri")


def can_run(doc: ForeignDocument) -> bool:
    """A valid GGUF file of an architecture the engine runs."""
    from colibri.convert_gguf import ARCHITECTURES
    f = doc.file
    return (doc.format == "gguf" and f is not None and f.architecture in ARCHITECTURES
            and bool(f.get(f"{f.architecture}.expert_count")))


def import_for_debugger(path: str | os.PathLike[str],
                        progress: Any = None) -> str:
    """The path of the `.colibri` import of a GGUF file, converting it first unless the cache
    already holds it (the converter writes atomically, so a crash leaves no half file)."""
    from colibri.convert_gguf import convert_gguf
    target = import_path(path)
    if not os.path.isfile(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        convert_gguf(path, target, progress=progress)
    return target


def is_foreign(path: str | os.PathLike[str]) -> bool:
    """Whether the Inspector should open `path` as a GGUF or safetensors document."""
    try:
        return detect(path) in ("gguf", "safetensors")
    except ColibriError:
        return False


__all__ = ["ForeignDocument", "MetadataRow", "ValueSummary", "can_run", "import_for_debugger",
           "import_path", "is_foreign"]
