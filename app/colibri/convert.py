"""Converting Hugging Face MoE checkpoints to `.colibri` files.

This module owns the step from a Hugging Face model directory (`config.json`, one or many
`*.safetensors` files, optionally `model.safetensors.index.json` and `tokenizer.json`) to one
`.colibri` file laid out by `colibri.fileformat`. What a family's config means and which of its
tensors make which Colibri tensor lives in colibri.families, one module per family (Mixtral,
Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2, DeepSeek-V3, GLM-4.5, ERNIE 4.5, GPT-OSS, Llama 4);
both on-disk expert layouts that transformers 5 writes are read: per-expert tensors (the
default `save_pretrained`, and what Hub checkpoints hold) and fused 3-D tensors
(`save_pretrained(..., save_original_format=False)`), and GPT-OSS's and Llama 4's transposed
(GPT-OSS's also MXFP4) experts.

It reads safetensors through `colibri.formats.safetensors_file`: every file of the checkpoint
(index, shards) is validated byte by byte first, and only then read with the `safetensors`
library's `safe_open` (numpy, bf16 through ml_dtypes), one tensor, or one expert's slice of a
fused tensor, at a time. Everything is checked before the first byte is written: every required tensor exists and
has the shape the hyper-parameters imply. Only then does `write_colibri` stream the data, loading
one output tensor at a time, into a temporary file that is renamed into place at the end, so a
failed conversion never leaves a partial file and never touches an existing one.

No torch import: numpy and the standard library only.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import numpy as np

from colibri.errors import ColibriFormatError, ColibriIOError
from colibri.families import (FAMILIES, SUPPORTED_MODEL_TYPES, Architecture, Family,
                              architecture_from_config, family_of)
from colibri.families import common
from colibri.families.common import ConversionError
from colibri.fileformat import (
    BF16_PANEL_ROWS, BLOCK_BYTES, BLOCK_ELEMS, DTYPE_BF16, DTYPE_BF16X16, DTYPE_BY_NAME, DTYPE_F16,
    DTYPE_F32, FLAG_TIED_EMBEDDINGS, PANEL_OF, PANEL_ROWS, QUANT_BY_NAME, ROWS_OF,
    TensorSpec, bf16_to_panels, plan_file, quantize as quantize_blocks, storage_to_f32, to_panels,
    to_storage, write_colibri,
)
from colibri.formats import safetensors_file
from colibri.formats.common import TensorEntry
from colibri.formats.safetensors_file import Checkpoint
from colibri.values import DEFAULT_LAYOUT, LAYOUTS, QUANTIZE_TENSORS, HParams

CONVERTER_VERSION = "2"

__all__ = ["CONVERTER_VERSION", "FAMILIES", "LAYOUTS", "QUANTIZE_SETS",
           "SUPPORTED_MODEL_TYPES", "ConversionError", "apply_layout", "apply_quantize",
           "architecture_from_config", "check_layout", "convert", "layout_target",
           "read_safetensors_header", "to_storage_checked"]

# ---------------------------------------------------------------------------------------------
# Safetensors reading (validated by colibri.formats first, then read with safe_open)

# The checkpoint dtypes the converter reads (what transformers writes for these families).
SOURCE_DTYPES = ("F32", "F16", "BF16", "F64")


def _format_problems(problems: Sequence[Any]) -> str:
    errs = [p for p in problems if p.severity == "error"]
    shown = "; ".join(f"{f'tensor {p.tensor!r}: ' if p.tensor else ''}{p.message} "
                      f"(at byte 0x{p.offset:X})" for p in errs[:5])
    return shown + (f"; and {len(errs) - 5} more" if len(errs) > 5 else "")


def read_safetensors_header(path: str) -> dict[str, TensorEntry]:
    """Validate one .safetensors file (header and offsets; no tensor data is read) and return
    its tensors by name. Raises ConversionError naming the file, the tensor and the byte."""
    try:
        header = safetensors_file.validate_file(path)
    except ColibriIOError as exc:
        raise ConversionError(f"{path}: cannot read: {exc.message}") from exc
    if any(p.severity == "error" for p in header.problems):
        raise ConversionError(f"{path}: {_format_problems(header.problems)}")
    return {t.name: t for t in header.tensors}


def _open_checkpoint(hf_dir: str) -> Checkpoint:
    """Every file of the checkpoint validated (index, shards, headers); nothing read yet."""
    try:
        return Checkpoint.open(hf_dir)
    except ColibriFormatError as exc:
        where = exc.problems[0].message if exc.problems else exc.message
        raise ConversionError(f"{hf_dir}: {_format_problems(exc.problems) or where}") from exc
    except ColibriIOError as exc:
        raise ConversionError(f"{hf_dir}: {exc.message}") from exc


# ---------------------------------------------------------------------------------------------
# Tensor plan: which HF tensors make each Colibri tensor, checked before anything is written

_STORAGE_NP = {DTYPE_F32: np.float32, DTYPE_F16: np.float16, DTYPE_BF16: np.uint16}


@dataclass(frozen=True)
class _Piece:
    """Part of one source tensor: `index` (a tuple of ints and slices; () = all of it) into the
    tensor `name`, `count` elements, read with the safetensors library's lazy slice; a 2-D part
    is transposed first when `transpose` says so (DBRX's w2, stored [I, H] per expert)."""

    ckpt: Checkpoint
    name: str
    index: tuple[Any, ...]
    count: int
    transpose: bool = False

    def read(self) -> np.ndarray:
        part = self.ckpt.slice(self.name)[self.index if self.index else slice(None)]
        values = np.asarray(part)
        if self.transpose:
            values = values.T
        values = values.astype(np.float32).reshape(-1)
        if values.size != self.count:
            raise ConversionError(f"tensor '{self.name}': read {values.size} elements, expected "
                                  f"{self.count}")
        return values


@dataclass(frozen=True)
class _ExpertPiece:
    """One expert's values of a stacked output tensor: make(source[expert] for each source), the
    sources read with the safetensors library's lazy slice (floats as float32, U8 as uint8)."""

    ckpt: Checkpoint
    names: tuple[str, ...]
    expert: int
    make: Callable[..., np.ndarray]
    count: int

    def read(self) -> np.ndarray:
        parts = []
        for name in self.names:
            part = np.asarray(self.ckpt.slice(name)[self.expert])
            parts.append(part if part.dtype == np.uint8 else part.astype(np.float32))
        values = np.asarray(self.make(*parts), dtype=np.float32).reshape(-1)
        if values.size != self.count:
            raise ConversionError(f"tensor '{self.names[0]}': expert {self.expert} gave "
                                  f"{values.size} elements, expected {self.count}")
        return values


def to_storage_checked(values: np.ndarray, dtype: int, name: str) -> np.ndarray:
    """to_storage, refusing finite values that overflow the storage dtype (f16 max 65504)."""
    if dtype == DTYPE_F32:
        return to_storage(values, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        stored = to_storage(values, dtype)
        back = storage_to_f32(stored, dtype)
    overflow = np.isfinite(values) & ~np.isfinite(back)
    if overflow.any():
        worst = float(np.max(np.abs(values[overflow])))
        raise ConversionError(f"tensor '{name}': value {worst:g} overflows "
                              f"{'f16' if dtype == DTYPE_F16 else 'bf16'}; convert with a "
                              "wider --dtype")
    return stored


def _loader(name: str, dtype: int, shape: tuple[int, ...], pieces: Sequence[_Piece | _ExpertPiece]
            ) -> Callable[[], np.ndarray]:
    """A TensorSpec.load: fills `shape` from `pieces` in order, one piece in memory at a time
    (a piece is at most one expert's matrix)."""
    def load() -> np.ndarray:
        out = np.empty(math.prod(shape), dtype=_STORAGE_NP[dtype])
        cursor = 0
        for p in pieces:
            out[cursor:cursor + p.count] = to_storage_checked(p.read(), dtype, name)
            cursor += p.count
        return out.reshape(shape)
    return load


class _Planner:
    """Collects the output tensors and every problem with the checkpoint, so that all missing
    tensors and bad shapes are reported together, before anything is written. Implements
    colibri.families.common.Planner. Every Hugging Face name a family gives is looked up after
    `prefix` (the architecture's hf_prefix)."""

    def __init__(self, ckpt: Checkpoint, dtype: int, prefix: str = ""):
        self.ckpt = ckpt
        self.tensors = {t.name: t for t in ckpt.tensors}
        self.dtype = dtype
        self.prefix = prefix
        self.specs: list[TensorSpec] = []
        self.problems: list[str] = []
        self.used: set[str] = set()

    def has(self, hf_name: str) -> bool:
        return self.prefix + hf_name in self.tensors

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def source(self, hf_name: str, shape: tuple[int, ...], what: str,
               dtypes: Sequence[str] = SOURCE_DTYPES) -> TensorEntry | None:
        hf_name = self.prefix + hf_name
        t = self.tensors.get(hf_name)
        if t is None:
            self.problems.append(f"missing tensor '{hf_name}' (for {what})")
            return None
        self.used.add(hf_name)
        if t.shape != tuple(shape):
            self.problems.append(f"tensor '{hf_name}' has shape {list(t.shape)}, expected "
                                 f"{list(shape)} (for {what})")
            return None
        if t.dtype not in dtypes:
            self.problems.append(f"tensor '{hf_name}' has dtype {t.dtype}, not one the converter "
                                 f"reads here ({', '.join(dtypes)})")
            return None
        return t

    def _dtype(self, shape: tuple[int, ...], force_f32: bool) -> int:
        # 1-D tensors (norms, biases) and the router stay f32 (docs/format.md, Dtypes).
        return DTYPE_F32 if force_f32 or len(shape) == 1 else self.dtype

    def piece(self, t: TensorEntry, index: tuple[Any, ...] = (), count: int | None = None
              ) -> _Piece:
        return _Piece(self.ckpt, t.name, index, t.n_elements if count is None else count)

    def add(self, name: str, shape: tuple[int, ...],
            pieces: Sequence[_Piece | _ExpertPiece] | None, force_f32: bool = False) -> None:
        if pieces is None:
            return
        dtype = self._dtype(shape, force_f32)
        self.specs.append(TensorSpec(name, dtype, tuple(shape), _loader(name, dtype, shape,
                                                                        pieces)))

    def single(self, name: str, hf_name: str, shape: tuple[int, ...], force_f32: bool = False,
               source_shape: tuple[int, ...] | None = None) -> None:
        """`name` of `shape` from the whole of `hf_name` (of source_shape, default the same)."""
        t = self.source(hf_name, source_shape or shape, name)
        self.add(name, shape, None if t is None else [self.piece(t)], force_f32)

    def part(self, name: str, hf_name: str, source_shape: tuple[int, ...], rows: slice,
             shape: tuple[int, ...]) -> None:
        """`name` of `shape` from rows `rows` of `hf_name` (of source_shape): one half of a fused
        gate/up projection, one of q/k/v in a fused qkv projection."""
        t = self.source(hf_name, source_shape, name)
        count = math.prod(shape)
        self.add(name, shape, None if t is None else [self.piece(t, (rows,), count)])

    def expert_rows(self, name: str, hf_name: str, n_experts: int, rows: int, cols: int,
                    transpose: bool = False) -> None:
        """[E, rows, cols] (or [E, cols, rows] with `transpose`) from `hf_name` [E*rows, cols],
        expert e's rows e*rows..(e+1)*rows-1, read one expert at a time (DBRX's experts)."""
        t = self.source(hf_name, (n_experts * rows, cols), name)
        shape = (n_experts, cols, rows) if transpose else (n_experts, rows, cols)
        self.add(name, shape, None if t is None else [
            _Piece(self.ckpt, t.name, (slice(e * rows, (e + 1) * rows),), rows * cols, transpose)
            for e in range(n_experts)])

    def stacked(self, name: str, hf_names: Sequence[str], shape: tuple[int, ...]) -> None:
        """Per-expert matrices of `shape` stacked into [E, *shape]."""
        sources = [self.source(n, shape, name) for n in hf_names]
        ok = all(s is not None for s in sources)
        self.add(name, (len(hf_names), *shape),
                 [self.piece(s) for s in sources if s is not None] if ok else None)

    def fused_experts(self, dst: str, gate_up: str, down: str, n_experts: int, d_ff: int,
                      d_model: int) -> None:
        """moe_w1/w2/w3 from transformers' fused gate_up_proj [E, 2I, H] (rows 0..I-1 of each
        expert the gate, I..2I-1 the up projection) and down_proj [E, H, I]."""
        E, I, H = n_experts, d_ff, d_model
        gu = self.source(gate_up, (E, 2 * I, H), f"{dst}.moe_w1 and {dst}.moe_w3")
        dn = self.source(down, (E, H, I), f"{dst}.moe_w2")
        self.add(f"{dst}.moe_w1", (E, I, H),
                 None if gu is None else [self.piece(gu, (e, slice(0, I)), I * H)
                                          for e in range(E)])
        self.add(f"{dst}.moe_w2", (E, H, I),
                 None if dn is None else [self.piece(dn, (e,), H * I) for e in range(E)])
        self.add(f"{dst}.moe_w3", (E, I, H),
                 None if gu is None else [self.piece(gu, (e, slice(I, 2 * I)), I * H)
                                          for e in range(E)])

    def expert_pieces(self, name: str, shape: tuple[int, ...],
                      sources: Sequence[tuple[str, tuple[int, ...]]],
                      make: Callable[..., np.ndarray], raw: bool = False,
                      force_f32: bool = False) -> None:
        """`name` [E, *shape] expert by expert: expert e's values are make(each source's [e]),
        the sources (name, shape [E, ...]) read one expert's part at a time as float32, or with
        `raw` as the U8 bytes they must be (MXFP4 blocks and scales)."""
        entries = [self.source(n, s, name, ("U8",) if raw else SOURCE_DTYPES) for n, s in sources]
        if any(t is None for t in entries):
            return
        n_experts = sources[0][1][0]
        count = math.prod(shape)
        names = tuple(t.name for t in entries if t is not None)
        self.add(name, (n_experts, *shape),
                 [_ExpertPiece(self.ckpt, names, e, make, count) for e in range(n_experts)],
                 force_f32)

    def constant(self, name: str, values: np.ndarray) -> None:
        """`name`, an f32 tensor of values from config.json (LongRoPE's frequency factors)."""
        data = np.ascontiguousarray(values, dtype=np.float32)
        self.specs.append(TensorSpec(name, DTYPE_F32, data.shape, lambda: data))

    def derived(self, name: str, shape: tuple[int, ...], hf_name: str,
                source_shape: tuple[int, ...], make: Callable[[np.ndarray], np.ndarray]) -> None:
        """`name` = make(the float32 values of `hf_name` as source_shape): a rearrangement no run
        of elements can express (MLA's transposed key half)."""
        t = self.source(hf_name, source_shape, name)
        if t is None:
            return
        dtype = self._dtype(shape, False)

        def load() -> np.ndarray:
            values = make(self.piece(t).read().reshape(source_shape))
            assert values.shape == tuple(shape), (name, values.shape, shape)
            return to_storage_checked(np.ascontiguousarray(values, dtype=np.float32), dtype,
                                      name).reshape(shape)
        self.specs.append(TensorSpec(name, dtype, tuple(shape), load))


def _plan_tensors(tensors: Checkpoint, arch: Architecture, family: Family,
                  dtype: int) -> list[TensorSpec]:
    p = _Planner(tensors, dtype, arch.hf_prefix)
    family.embedding_tensors(p, arch)
    for layer in range(arch.hp.n_layers):
        family.layer_tensors(p, arch, layer)
    family.head_tensors(p, arch)
    for name, values in arch.constants.items():
        p.constant(name, values)
    if p.problems:
        shown = p.problems[:20]
        more = f"; and {len(p.problems) - 20} more" if len(p.problems) > 20 else ""
        raise ConversionError(f"{len(p.problems)} problem(s) with the checkpoint: "
                              + "; ".join(shown) + more)
    return p.specs


# ---------------------------------------------------------------------------------------------
# Entry point

# Which matrices `--quantize` applies to. Routing is precision-sensitive, so the router is never
# quantised (it is f32 in every file); attention and the LM head stay in `dtype` unless asked.
QUANTIZE_SETS = {
    "experts": ("moe_w1", "moe_w2", "moe_w3"),
    "ffn": ("moe_w1", "moe_w2", "moe_w3", "shared_w1", "shared_w2", "shared_w3",
            "mlp_w1", "mlp_w2", "mlp_w3"),
    "all": ("moe_w1", "moe_w2", "moe_w3", "shared_w1", "shared_w2", "shared_w3",
            "mlp_w1", "mlp_w2", "mlp_w3", "attn_q", "attn_k", "attn_v", "attn_o", "output"),
}
# The recipe of llama.cpp's `llama-quantize ... Q8_0|Q4_0`, so that the two engines can be
# compared on the same bytes per token (llama_quantize_type below).
LLAMA_CPP_RECIPE = "llama.cpp"
assert QUANTIZE_TENSORS == (*QUANTIZE_SETS, LLAMA_CPP_RECIPE)


def llama_quantize_type(name: str, shape: tuple[int, ...], qdtype: int, hp: HParams
                        ) -> int | None:
    """The dtype llama-quantize's Q8_0 (qdtype q8_0) or Q4_0 (q4_0) recipe gives the tensor
    `name` (src/llama-quant.cpp of the llama.cpp that tools/llamacpp.py pins), None where it
    leaves the tensor as converted: every matrix takes the recipe's type (embeddings, attention,
    experts, shared experts, dense MLPs) except the routers (`ffn_gate_inp*`) and 1-D tensors;
    the LM head (and the embeddings, when tied to it) is q8_0, which llama.cpp's Q4_0 makes
    q6_K, a type Colibri lacks (q8_0 is the nearest: 34 bytes per 32 weights against 26.25, so
    a 32000 x 1024 head reads 7.9 MB more); in models of exactly 8 experts, attn_k and attn_v
    are q8_0 (llama.cpp's rule for Mixtral). Biases stay as they are, GPT-OSS's [E, I] expert
    biases too."""
    base = name.rsplit(".", 1)[-1]
    if len(shape) < 2 or base in ("moe_gate", "shared_gate") or base.endswith("_bias"):
        return None
    if base == "output" or (base == "token_embd" and hp.flags & FLAG_TIED_EMBEDDINGS):
        return QUANT_BY_NAME["q8_0"]
    if base in ("attn_k", "attn_v") and hp.n_experts == 8:
        return QUANT_BY_NAME["q8_0"]
    return qdtype


def _quantized(spec: TensorSpec, qdtype: int) -> TensorSpec:
    """The same tensor stored as q8_0/q4_0 blocks, quantised from its `dtype` values."""
    inner = spec.load

    def load() -> np.ndarray:
        return quantize_blocks(storage_to_f32(inner(), spec.dtype), qdtype)
    return TensorSpec(spec.name, qdtype, spec.shape, load)


def quantize_target(name: str, shape: tuple[int, ...], qdtype: int, which: str, hp: HParams
                    ) -> int | None:
    """The block dtype the tensor `name` gets when `which` (a QUANTIZE_SETS key, or
    LLAMA_CPP_RECIPE) is quantised to `qdtype`; None where it keeps its float dtype. Rows that
    are not whole blocks are the caller's to check."""
    if which == LLAMA_CPP_RECIPE:
        return llama_quantize_type(name, shape, qdtype, hp)
    in_set = name.rsplit(".", 1)[-1] in QUANTIZE_SETS[which] and len(shape) >= 2
    return qdtype if in_set else None


def apply_quantize(specs: list[TensorSpec], quantize_dtype: str | None, which: str,
                    hp: HParams, notes: list[str]) -> list[TensorSpec]:
    """`specs` with the matrices that `which` (a QUANTIZE_SETS key, or LLAMA_CPP_RECIPE) selects
    stored as `quantize_dtype` ("q8" or "q4"; None: unchanged) blocks."""
    if quantize_dtype is None:
        return specs
    if quantize_dtype not in QUANT_BY_NAME:
        raise ConversionError(f"quantize {quantize_dtype!r} not supported (supported: q8, q4)")
    if which not in QUANTIZE_TENSORS:
        raise ConversionError(f"quantize set {which!r} not supported (supported: "
                              f"{', '.join(QUANTIZE_TENSORS)})")
    qdtype = QUANT_BY_NAME[quantize_dtype]
    out, skipped = [], []
    for spec in specs:
        to = quantize_target(spec.name, spec.shape, qdtype, which, hp)
        if to is None or spec.dtype in BLOCK_BYTES:
            out.append(spec)
        elif spec.shape[-1] % BLOCK_ELEMS:
            skipped.append(spec.name)
            out.append(spec)
        else:
            out.append(_quantized(spec, to))
    if skipped:
        notes.append(f"not quantised (rows not a multiple of {BLOCK_ELEMS}): {', '.join(skipped)}")
    return out


# Kept in rows in the panel layout: the embeddings are read a row at a time (a row of a panel is
# spread over all its lines), and so is a head tied to them.
ROWS_ONLY = ("token_embd",)


def check_layout(layout: str) -> None:
    """Raise ConversionError unless `layout` is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ConversionError(f"layout {layout!r} not supported (supported: "
                              f"{', '.join(LAYOUTS)})")


def layout_target(name: str, shape: tuple[int, ...], dtype: int, layout: str) -> int:
    """The dtype the tensor `name` of `shape`, stored as `dtype`, gets in `layout`: "rows" turns
    a panel dtype into its row dtype; "panels" stores q8_0/q4_0 matrices [rows, n] and stacks
    [E, rows, n] with rows % 8 == 0 (n % 32 == 0 already) as q8_0x8/q4_0x8, except ROWS_ONLY;
    "bf16-panels" does that and stores bf16 ones with rows % 16 == 0 and n even as bf16x16.
    Every other tensor keeps `dtype`. The one place that decides which tensors are panels."""
    check_layout(layout)
    rows = DTYPE_BF16 if dtype == DTYPE_BF16X16 else ROWS_OF.get(dtype, dtype)
    if len(shape) not in (2, 3) or name.rsplit(".", 1)[-1] in ROWS_ONLY or layout == "rows":
        return rows
    if rows in PANEL_OF and shape[-2] % PANEL_ROWS == 0:
        return PANEL_OF[rows]
    if (layout == "bf16-panels" and rows == DTYPE_BF16 and shape[-2] % BF16_PANEL_ROWS == 0
            and shape[-1] % 2 == 0):
        return DTYPE_BF16X16
    return rows


def _in_panels(spec: TensorSpec, panel_dtype: int) -> TensorSpec:
    """The same tensor, its stored q8_0/q4_0 or bf16 rows rearranged into panels (the same
    bytes)."""
    inner = spec.load

    def load() -> np.ndarray:
        if panel_dtype == DTYPE_BF16X16:
            return bf16_to_panels(inner(), spec.shape[-1]).reshape(spec.shape)
        return to_panels(inner(), ROWS_OF[panel_dtype], spec.shape[-1])
    return TensorSpec(spec.name, panel_dtype, spec.shape, load)


def apply_layout(specs: list[TensorSpec], layout: str) -> list[TensorSpec]:
    """`specs` with their q8_0/q4_0 (and bf16) tensors stored in `layout` (layout_target decides
    which); the converters' specs hold rows, so "rows" changes nothing."""
    out = []
    for spec in specs:
        to = layout_target(spec.name, spec.shape, spec.dtype, layout)
        panel = to in ROWS_OF or to == DTYPE_BF16X16
        out.append(_in_panels(spec, to) if panel and to != spec.dtype else spec)
    return out


def convert(hf_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], dtype: str = "f32",
            progress: Callable[[int, int], None] | None = None, quantize: str | None = None,
            quantize_tensors: str = "experts", layout: str = DEFAULT_LAYOUT) -> list[str]:
    """Convert the Hugging Face checkpoint in `hf_dir` to a `.colibri` file at `out_path`;
    returns warnings about the file written (one sentence each), e.g. that it has no tokenizer.

    `dtype` ("f32", "f16" or "bf16") is the storage of every matrix except the router; 1-D
    tensors and `moe_gate` are always f32. `progress(done, total)` is called after each tensor
    is written. `quantize` ("q8" or "q4", default None) stores the matrices of the
    `quantize_tensors` set ("experts" = moe_w1/w2/w3, the default; "ffn" adds shared experts and
    dense MLPs; "all" adds attention and the LM head; "llama.cpp" is llama-quantize's Q8_0/Q4_0
    recipe, see llama_quantize_type) as q8_0/q4_0 blocks quantised from their `dtype` values;
    matrices whose rows are not a multiple of 32 stay in `dtype` (noted in the
    metadata). `layout` ("panels", the default, or "rows") is how those blocks are stored
    (layout_target). Raises ConversionError for an unsupported or inconsistent checkpoint; nothing is
    written unless every check passes, and on any failure no file is left at `out_path` (an
    existing file there is left untouched)."""
    hf_dir, out_path = os.fspath(hf_dir), os.fspath(out_path)
    if dtype not in DTYPE_BY_NAME:
        raise ConversionError(f"dtype {dtype!r} not supported (supported: "
                              f"{', '.join(DTYPE_BY_NAME)})")
    config_path = os.path.join(hf_dir, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        raise ConversionError(f"{config_path}: cannot read: {str(exc)[:200]}") from exc
    if not isinstance(raw, dict):
        raise ConversionError(f"{config_path}: not a JSON object")
    arch = architecture_from_config(raw)
    family = family_of(raw)
    model_type, notes = family.model_type, arch.notes
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise ConversionError(f"output directory {out_dir} does not exist")

    tensors = _open_checkpoint(hf_dir)
    specs = _plan_tensors(tensors, arch, family, DTYPE_BY_NAME[dtype])
    specs = apply_layout(apply_quantize(specs, quantize, quantize_tensors, arch.hp, notes), layout)

    tokenizer = b""
    warnings = []
    tokenizer_path = os.path.join(hf_dir, "tokenizer.json")
    if os.path.exists(tokenizer_path):
        with open(tokenizer_path, "rb") as f:
            tokenizer = f.read()
    else:
        warnings.append(f"{hf_dir} has no tokenizer.json, so the file has no tokenizer: prompts "
                        "must be given as token ids (colibri run --tokens; the Inspector's "
                        "prompt field takes them too)")
    metadata = {
        "source": {"model_type": model_type, "architectures": raw.get("architectures")},
        "converted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "converter_version": CONVERTER_VERSION,
        "dtype": dtype,
        **({"quantize": quantize, "quantize_tensors": quantize_tensors} if quantize else {}),
        "hf_config": raw,
    }
    if notes:
        metadata["notes"] = notes
    plan = plan_file(arch.hp, arch.kinds, specs, tokenizer, metadata, rules=arch.rules,
                     attention=arch.attention)
    write_colibri(out_path, plan, progress)
    return warnings
