"""A GGUF file or safetensors checkpoint open in the Inspector (Qt-free).

`ForeignDocument` owns what the views show about one such path: the validator's problems (a
broken file still opens into them), the metadata as a lazily walked tree
(`inspection.foreign_tree`), the tensor table as `TensorRow`s (GGUF block types as the dtype;
layer from `blk.N.` or `layers.N.`), the bytes as one `HexSource` per file with regions for the
header structures and every tensor, and the tensors as a `stats.TensorStore`
(`ForeignTensors`), so the values view and the per-expert comparison of `.colibri` files show
them too (every ggml block type dequantised). Opening reads headers only; values are read when
asked. For a checkpoint of several shards the hex view shows one file at a time: the shards,
then the index.

Which tensors are a MoE layer's experts is found from the names alone (`expert_layers`):
GGUF's router `blk.L.ffn_gate_inp` with its stacked `ffn_{gate,down,up}_exps` [E, ...]; in a
Hugging Face checkpoint a router `layers.L.<mlp|block_sparse_moe>.gate` with either one tensor
per expert (`experts.{e}.gate_proj/down_proj/up_proj`, Mixtral's `w1/w2/w3`) or the fused
transformers 5 layout (`experts.gate_up_proj` [E, 2I, H], gate rows first, and
`experts.down_proj` [E, H, I]). Other orientations (gpt-oss, Llama 4: [E, H, 2I]) are left as
plain tensors.

`data_check(doc)` is the task the validation report's data checks run (every tensor read for
its CRC-32, NaN/Inf scan of the dequantised values), as `document.data_check` is for `.colibri`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from colibri.engine import Problem
from colibri.errors import ColibriError, ColibriFormatError
from colibri.formats import detect, open_file
from colibri.formats.common import TensorEntry
from colibri.formats.safetensors_file import checkpoint_layout
from colibri.inspection.document import DataCheckResult, size_text
from colibri.inspection.hexsource import BytesSource, FileSource, Region
from colibri.inspection.stats import ExpertLayer, ExpertPart
from colibri.inspection.tensors import TensorRow
from colibri.values import CancelFlag, Progress, check_cancelled

_PROGRESS_UNITS = 10_000   # Qt's progress bar holds an int32: bytes are reported in these units
_LAYER = re.compile(r"^blk\.(\d+)\.|(?:^|\.)layers\.(\d+)\.")
_GGUF_ROUTER = re.compile(r"^blk\.(\d+)\.ffn_gate_inp\.weight$")
_GGUF_MATRICES = {"moe_w1": "ffn_gate_exps", "moe_w2": "ffn_down_exps", "moe_w3": "ffn_up_exps"}
_HF_ROUTER = re.compile(r"^(?P<base>(?:.*\.)?layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe"
                        r"|feed_forward))\.(?:gate|router)\.weight$")
_HF_EXPERT = re.compile(r"^(?P<base>.*)\.experts\.(?P<e>\d+)\.(?P<m>w1|w2|w3|gate_proj"
                        r"|down_proj|up_proj)\.weight$")
_HF_ROLES = {"w1": "moe_w1", "gate_proj": "moe_w1", "w2": "moe_w2", "down_proj": "moe_w2",
             "w3": "moe_w3", "up_proj": "moe_w3"}


# ---------------------------------------------------------------------------------------------
# Experts and kinds, from the names


def _layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    if m is None:
        return None
    return int(m.group(1) if m.group(1) is not None else m.group(2))


def _gguf_layers(shapes: dict[str, tuple[int, ...]]) -> list[ExpertLayer]:
    out = []
    for name, shape in shapes.items():
        m = _GGUF_ROUTER.match(name)
        if m is None or len(shape) != 2:
            continue
        layer, n = int(m.group(1)), shape[0]
        names = {mat: f"blk.{layer}.{base}.weight" for mat, base in _GGUF_MATRICES.items()}
        names = {mat: t for mat, t in names.items()
                 if len(shapes.get(t, ())) == 3 and shapes[t][0] == n}
        if names:
            out.append(ExpertLayer.stacked(layer, name, n, names))
    return out


def _hf_layers(shapes: dict[str, tuple[int, ...]]) -> list[ExpertLayer]:
    per_expert: dict[str, dict[str, dict[int, str]]] = {}
    for name in shapes:
        m = _HF_EXPERT.match(name)
        if m is not None:
            role = _HF_ROLES[m.group("m")]
            per_expert.setdefault(m.group("base"), {}).setdefault(role, {})[int(m.group("e"))] = name
    out = []
    for name, shape in shapes.items():
        m = _HF_ROUTER.match(name)
        if m is None or len(shape) != 2:
            continue
        base, layer, n = m.group("base"), int(m.group("layer")), shape[0]
        parts: dict[str, tuple[ExpertPart, ...]] = {}
        gate_up = next((t for t in (f"{base}.experts.gate_up_proj",
                                    f"{base}.experts.gate_up_proj.weight") if t in shapes), None)
        down = next((t for t in (f"{base}.experts.down_proj", f"{base}.experts.down_proj.weight")
                     if t in shapes), None)
        if gate_up is not None and down is not None:
            gu, dn = shapes[gate_up], shapes[down]
            # [E, 2I, H] and [E, H, I]: rows 0..I-1 of each expert's gate_up are the gate
            if (len(gu) == 3 and len(dn) == 3 and gu[0] == dn[0] == n and gu[1] == 2 * dn[2]
                    and gu[2] == dn[1]):
                i = dn[2]
                parts["moe_w1"] = tuple(ExpertPart(gate_up, e, (0, i)) for e in range(n))
                parts["moe_w2"] = tuple(ExpertPart(down, e) for e in range(n))
                parts["moe_w3"] = tuple(ExpertPart(gate_up, e, (i, 2 * i)) for e in range(n))
        else:
            for role, by_expert in sorted(per_expert.get(f"{base}", {}).items()):
                if all(e in by_expert for e in range(n)):
                    parts[role] = tuple(ExpertPart(by_expert[e]) for e in range(n))
        if parts:
            out.append(ExpertLayer(layer, name, n, parts))
    return out


def expert_layers(tensors: Iterable[TensorEntry]) -> list[ExpertLayer]:
    """The MoE layers of a GGUF file or a checkpoint, found from tensor names and shapes (see
    the module docstring), in layer order."""
    shapes = {t.name: tuple(t.shape) for t in tensors}
    return sorted(_gguf_layers(shapes) + _hf_layers(shapes), key=lambda x: x.layer)


def _kind(name: str, routers: set[str], experts: set[str]) -> str:
    if name in routers:
        return "router"
    if name in experts:
        return "experts"
    if "token_embd" in name or "embed_tokens" in name:
        return "embedding"
    if name.startswith("output.") or "lm_head" in name:
        return "output"
    if "norm" in name:
        return "norm"
    if "shexp" in name or "shared_expert" in name:
        return "shared"
    if "attn" in name:
        return "attention"
    return "mlp"


# ---------------------------------------------------------------------------------------------
# The tensors as a stats.TensorStore


class ForeignTensors:
    """A GGUF file or safetensors checkpoint as a `stats.TensorStore`: stored views over the
    mapping, decoded to float32 a chunk of rows at a time (GGUF through the `gguf` package's
    dequantisation of every ggml type; safetensors dtypes, bf16 and float8 included, through
    numpy and ml_dtypes)."""

    def __init__(self, file: Any, layers: list[ExpertLayer]) -> None:
        self.file = file
        self._layers = layers
        self._gguf = getattr(file, "format", "") == "gguf"

    def __contains__(self, name: object) -> bool:
        return name in self.file

    def tensor_info(self, name: str) -> TensorEntry:
        return self.file.tensor_info(name)

    def tensor(self, name: str) -> np.ndarray:
        return self.file.tensor(name)

    def decode(self, name: str, rows: np.ndarray) -> np.ndarray:
        if self._gguf:
            return self.file.decode_rows(name, rows)
        return np.asarray(rows, dtype=np.float32)

    def expert_layers(self) -> list[ExpertLayer]:
        return list(self._layers)


# ---------------------------------------------------------------------------------------------
# The document


class ForeignDocument:
    """One GGUF or safetensors path: problems always, the reader when the file is valid.
    Opening validates the headers (bounded work, but it grows with the number of tensors: run
    it on a worker for a checkpoint of many shards)."""

    generation = 0   # a foreign file is not reloaded; results carry this to match the report
    stores_checksums = False   # neither format stores checksums: data checks read and scan

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
        self.layers = expert_layers(self.file.tensors) if self.file is not None else []
        self._layout: Any = None

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip(os.sep))

    @property
    def kind(self) -> str:
        """What the file is, for sentences: 'GGUF file' or 'safetensors checkpoint'."""
        return "GGUF file" if self.format == "gguf" else "safetensors checkpoint"

    @property
    def opened(self) -> bool:
        """Whether the file passed validation and its tensors can be read."""
        return self.file is not None

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

    def plain_explanation(self) -> str:
        """One sentence on what is wrong ("" for a clean file)."""
        if self.open_error is not None and not self.problems:
            return f"This file cannot be read: {self.open_error}."
        errs = [p for p in self.problems if p.severity == "error"]
        if errs:
            first = errs[0]
            where = f" in tensor '{first.tensor}'" if first.tensor else ""
            more = f" and {len(errs) - 1} more" if len(errs) > 1 else ""
            return (f"This {self.kind} is damaged: {first.message}{where} (at byte "
                    f"0x{first.offset:X}){more}. It is not read further; the report lists every "
                    "problem.")
        if self.problems:
            return (f"This is a valid {self.kind} with {len(self.problems)} warning(s): it reads, "
                    "and the report says what the warnings describe.")
        return ""

    # -- tensors ---------------------------------------------------------------------------------

    def tensor_rows(self) -> list[TensorRow]:
        """One row per tensor in file order (shard by shard): routers and stacked expert
        tensors carry their number of experts, a checkpoint's per-expert tensors their expert."""
        f = self.file
        if f is None:
            return []
        routers = {x.router for x in self.layers}
        stacked: dict[str, int] = {}
        own: dict[str, int] = {}
        for x in self.layers:
            stacked[x.router] = x.n_experts
            for parts in x.parts.values():
                for e, part in enumerate(parts):
                    if part.expert is None:
                        own[part.name] = e
                    else:
                        stacked[part.name] = x.n_experts
        experts = set(stacked) - routers | set(own)
        shard_of = {p: i for i, p in enumerate(self.shard_paths())}
        rows = []
        for i, t in enumerate(f.tensors):
            rows.append(TensorRow(t.name, i, _layer_of(t.name), None,
                                  _kind(t.name, routers, experts), t.dtype, tuple(t.shape),
                                  t.offset, t.nbytes, 0, n_experts=stacked.get(t.name, 0),
                                  shard=shard_of.get(t.path, 0), expert_of=own.get(t.name)))
        return rows

    def store(self) -> ForeignTensors | None:
        """The tensors as a `stats.TensorStore` (None when the file did not open)."""
        return ForeignTensors(self.file, self.layers) if self.file is not None else None

    def values(self, name: str) -> np.ndarray:
        """float32 values of tensor `name` (dequantised), a copy: for tests and small tensors."""
        if self.file is None:
            raise ValueError(f"{self.path} did not open")
        return np.asarray(self.file.tensor_f32(name), dtype=np.float32)

    # -- bytes -----------------------------------------------------------------------------------

    def shard_paths(self) -> list[str]:
        """The files holding tensors: the GGUF file, or a checkpoint's shards in order (those
        that exist, for a checkpoint that did not open)."""
        if self.file is not None and self.format == "safetensors":
            return [f.path for f in self.file.files]
        layout = self._checkpoint_layout()
        if layout is not None:
            return [p for p in layout.shard_paths if os.path.isfile(p)]
        return [self.path] if os.path.isfile(self.path) else []

    def file_paths(self) -> list[str]:
        """Every file the hexdump can show: the shards, then a checkpoint's index."""
        paths = self.shard_paths()
        layout = self._checkpoint_layout()
        index = layout.index_path if layout is not None else None
        if index and os.path.isfile(index) and index not in paths:
            paths.append(index)
        return paths

    def _checkpoint_layout(self) -> Any:
        """Which files make the checkpoint (None for GGUF, or a path that cannot be listed)."""
        if self.format != "safetensors":
            return None
        if self.file is not None:
            return self.file.layout
        if self._layout is None:
            try:
                self._layout = checkpoint_layout(self.path)
            except ColibriError:
                return None
        return self._layout

    def file_of(self, problem: Problem) -> int:
        """Which of `file_paths()` a problem's offset is in (a shard's problems name it first;
        a checkpoint's own problems are the index's)."""
        paths = self.file_paths()
        for i, path in enumerate(paths):
            if problem.message.startswith(os.path.basename(path) + ": "):
                return i
        if self.format == "safetensors" and len(paths) > 1 and paths[-1].endswith(".json"):
            return len(paths) - 1
        return 0

    def source(self, file: int = 0) -> Any:
        paths = self.file_paths()
        if not paths:
            return BytesSource(b"")
        try:
            return FileSource(paths[min(file, len(paths) - 1)])
        except OSError:
            return BytesSource(b"")

    def regions(self, file: int = 0) -> list[Region]:
        f = self.file
        if f is None:
            return []
        if self.format == "gguf":
            return f.regions
        files = f.files
        return files[file].regions if 0 <= file < len(files) else []


# ---------------------------------------------------------------------------------------------
# Data checks (file-wide, run on a worker)


def data_check(doc: ForeignDocument, checksums: bool = True, nan_check: bool = True,
               ) -> Callable[[Progress, CancelFlag], DataCheckResult]:
    """A task function `fn(progress, cancelled) -> DataCheckResult` reading every tensor's bytes
    (their CRC-32: GGUF and safetensors store none to compare with, so the read proves the data
    is there) and/or scanning the dequantised values for NaN/Inf, with byte-weighted progress in
    units of 1/10000, raising colibri.values.Cancelled when cancelled."""
    f, generation = doc.file, doc.generation

    def run(progress: Progress, cancelled: CancelFlag) -> DataCheckResult:
        result = DataCheckResult(generation, checksums, nan_check)
        if f is None:
            result.complete = False
            return result
        total = sum(t.nbytes for t in f.tensors)

        def report(done: int, _total: int, name: str) -> None:
            result.bytes_checked = done
            progress(done * _PROGRESS_UNITS // max(total, 1), _PROGRESS_UNITS,
                     f"{name} ({size_text(done)} of {size_text(total)})" if name else "")

        scan = f.scan(checksums, nan_check, report, cancelled)
        check_cancelled(cancelled)
        bad = {p.tensor for p in scan.problems if p.severity == "error"}
        result.status = {t.name: "bad" if t.name in bad else "ok" for t in f.tensors}
        result.problems = list(scan.problems)
        result.complete = scan.complete
        return result

    return run


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
    from colibri.convert_gguf import SUPPORTED_ARCHITECTURES
    f = doc.file
    return (doc.format == "gguf" and f is not None and f.architecture in SUPPORTED_ARCHITECTURES
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


__all__ = ["ForeignDocument", "ForeignTensors", "can_run", "data_check", "expert_layers",
           "import_for_debugger", "import_path", "is_foreign"]
