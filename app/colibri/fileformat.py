"""Writing `.colibri` files (the byte layout of docs/format.md).

The engine's C reader (engine_c/src/format.c) is the one place that *reads* and validates the
format; this module is the one place that *writes* it. The converter and the test corpus of
deliberately broken files both build on it: `plan_file` computes every offset from the tensor
shapes alone, `write_colibri` streams tensor data to a temporary file and renames it into place,
and `build_bytes` returns the image in memory so tests can corrupt any byte.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field, replace
from typing import IO, Any, Callable, Iterable, Sequence

import numpy as np

from colibri.files import atomic_write
from colibri.values import ARCH_NAMES, FORMAT_VERSION, HParams

MAGIC = b"COLI"
HEADER_SIZE = 512              # version 2's fixed header
ROUTING_ENTRY_SIZE = 128       # version 2's routing entry
HEADER_SIZE_V1 = 256
ROUTING_ENTRY_SIZE_V1 = 32


def routing_entry_size(version: int) -> int:
    """Bytes per routing-section entry of a format version."""
    return ROUTING_ENTRY_SIZE if version == 2 else ROUTING_ENTRY_SIZE_V1
TENSOR_ENTRY_SIZE = 128
TENSOR_NAME_MAX = 64
ALIGNMENT = 64
NO_TENSOR = 0xFFFFFFFF

DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
DTYPE_Q8_0, DTYPE_Q4_0 = 5, 6  # 3 and 4 (the old interleaved blocks) are retired
DTYPE_BF16X16 = 9  # bf16 in panels of 16 rows (below)
DTYPE_NAMES = {DTYPE_F32: "f32", DTYPE_F16: "f16", DTYPE_BF16: "bf16"}
DTYPE_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}
DTYPE_SIZES = {DTYPE_F32: 4, DTYPE_F16: 2, DTYPE_BF16: 2, DTYPE_BF16X16: 2}
# Block-quantised dtypes: rows are cut into blocks of 32 elements; a row stores the f16 scales of
# all its blocks first, then all its quantised elements (docs/format.md, "Quantised rows"). A row of
# n elements still takes n / 32 * BLOCK_BYTES[dtype] bytes, and rows stay back to back.
# The same blocks stored in panels of 8 rows, the order the AVX2 kernels read (docs/format.md,
# "Quantised panels"): a panel holds its 8 rows' bytes, so sizes are those of the row dtypes.
DTYPE_Q8_0X8, DTYPE_Q4_0X8 = 7, 8
PANEL_ROWS = 8
PANEL_OF = {DTYPE_Q8_0: DTYPE_Q8_0X8, DTYPE_Q4_0: DTYPE_Q4_0X8}
ROWS_OF = {panel: rows for rows, panel in PANEL_OF.items()}
QUANT_NAMES = {DTYPE_Q8_0: "q8_0", DTYPE_Q4_0: "q4_0", DTYPE_Q8_0X8: "q8_0x8", DTYPE_Q4_0X8: "q4_0x8"}
QUANT_BY_NAME = {"q8": DTYPE_Q8_0, "q8_0": DTYPE_Q8_0, "q4": DTYPE_Q4_0, "q4_0": DTYPE_Q4_0,
                 "q8_0x8": DTYPE_Q8_0X8, "q4_0x8": DTYPE_Q4_0X8}
# bf16 stored in panels of 16 rows (DTYPE_BF16X16), each pair of columns of a panel's rows in one
# 64-byte line (docs/format.md, "bf16 panels"): the rows' bytes in the order the vector kernels
# read.
BF16_PANEL_ROWS = 16
BF16_NAMES = {DTYPE_BF16: "bf16", DTYPE_BF16X16: "bf16x16"}
BLOCK_ELEMS = 32
BLOCK_BYTES = {DTYPE_Q8_0: 34, DTYPE_Q4_0: 18, DTYPE_Q8_0X8: 34, DTYPE_Q4_0X8: 18}
# 4-byte groups of one block's payload: q8_0 32 int8, q4_0 16 bytes of nibbles
_PANEL_GROUPS = {DTYPE_Q8_0: 8, DTYPE_Q4_0: 4}


def rows_dtype_name(name: str) -> str:
    """The name of the row dtype whose values a panel dtype holds ('q8_0x8' -> 'q8_0', 'bf16x16'
    -> 'bf16'); any other dtype name as it is."""
    if name == BF16_NAMES[DTYPE_BF16X16]:
        return BF16_NAMES[DTYPE_BF16]
    code = QUANT_BY_NAME.get(name)
    return QUANT_NAMES[ROWS_OF[code]] if code in ROWS_OF else name


def row_bytes(dtype: int, n: int) -> int:
    """Bytes of n consecutive elements of `dtype` (n % 32 == 0 for a block dtype)."""
    if dtype in BLOCK_BYTES:
        if n % BLOCK_ELEMS:
            raise ValueError(f"{n} elements is not a whole number of blocks of {BLOCK_ELEMS}")
        return n // BLOCK_ELEMS * BLOCK_BYTES[dtype]
    return n * DTYPE_SIZES[dtype]


def tensor_bytes(dtype: int, shape: Sequence[int]) -> int:
    """Bytes of a tensor: rows (all but the last dimension) times row_bytes of the last."""
    rows = int(np.prod(shape[:-1], dtype=np.uint64)) if len(shape) > 1 else 1
    return rows * row_bytes(dtype, int(shape[-1]))


def quantize(values: np.ndarray, dtype: int) -> np.ndarray:
    """float values [..., n] (n % 32 == 0) -> the stored rows of q8_0 or q4_0, as uint8 of shape
    [..., row_bytes(dtype, n)]; every row is quantised in blocks of 32 elements.

    A row of nb = n / 32 blocks starts with the nb little-endian f16 scales d[0..nb), followed by
    the payload. The arithmetic is llama.cpp's reference quantiser's (ggml-quants.c), in f32 step
    for step, so a block comes out bit-identical to what llama-quantize writes for the same
    values: q8_0: d = max|x| / 127, q = round-half-away-from-zero(x * (1 / d)) in [-127, 127]; the
    payload is the n int8 q in element order. q4_0: d = m / -8 where m is the block's first value
    of largest magnitude (sign kept), q = min(15, trunc(x * (1 / d) + 8.5)); the payload is 16
    bytes per block, byte j of block b holding element 32 b + j (low nibble) and 32 b + j + 16
    (high). In both, 1 / d is taken of the f32 d (0 when d is 0); only the stored scale is
    rounded to f16 (round to nearest even)."""
    x = np.asarray(values, dtype=np.float32)
    shape = x.shape
    n = shape[-1]
    if n % BLOCK_ELEMS:
        raise ValueError(f"{n} elements is not a whole number of blocks of {BLOCK_ELEMS}")
    nb = n // BLOCK_ELEMS
    blocks = x.reshape(-1, nb, BLOCK_ELEMS)  # [rows, blocks, 32]
    if dtype == DTYPE_Q8_0:
        d = np.abs(blocks).max(axis=2) / np.float32(127)
    elif dtype == DTYPE_Q4_0:
        idx = np.abs(blocks).argmax(axis=2)  # the first of equal magnitudes, as llama.cpp's '<'
        d = np.take_along_axis(blocks, idx[..., None], axis=2)[..., 0] / np.float32(-8)
    else:
        raise ValueError(f"not a block dtype: {dtype}")
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)),
                       np.float32(0)).astype(np.float32)
        scaled = blocks * inv[..., None]  # f32 products, as the C code's x[j] * id
        if dtype == DTYPE_Q8_0:
            # roundf: halves away from zero (x - trunc(x) is exact, so a half is seen exactly)
            whole = np.trunc(scaled)
            q = np.where(np.abs(scaled - whole) == 0.5, whole + np.sign(scaled), np.rint(scaled))
            q = np.clip(q, -127, 127)
            payload = q.astype(np.int8).reshape(len(blocks), n).view(np.uint8)
        else:
            # (int8_t)(x * id + 8.5f): an f32 sum, truncated toward zero
            q4 = np.clip(np.trunc(scaled + np.float32(8.5)), 0, 15).astype(np.uint8)
            payload = (q4[..., :16] | (q4[..., 16:] << 4)).reshape(len(blocks), nb * 16)
    scales = np.ascontiguousarray(d.astype("<f2")).view(np.uint8).reshape(len(blocks), 2 * nb)
    out = np.concatenate([scales, payload], axis=1)
    return out.reshape(*shape[:-1], row_bytes(dtype, n))


def _panel_split(data: np.ndarray, dtype: int, n: int) -> tuple[np.ndarray, int, int]:
    """data as [panels, 8, row bytes] or [panels, 8 row bytes] (a copy-free view when contiguous),
    with nb and the groups per block of the row dtype `dtype`."""
    nb = n // BLOCK_ELEMS
    rb = row_bytes(dtype, n)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.size % (PANEL_ROWS * rb):
        raise ValueError(f"{raw.size} bytes are not whole panels of {PANEL_ROWS} rows of {rb} bytes")
    return raw.reshape(-1, PANEL_ROWS * rb), nb, _PANEL_GROUPS[dtype]


def to_panels(rows: np.ndarray, dtype: int, n: int) -> np.ndarray:
    """Stored q8_0/q4_0 rows of n elements (dtype 5 or 6; any array shape holding whole groups of
    8 rows back to back) -> the same bytes in panels (dtype 7 or 8), as a flat uint8 array.

    Panel p holds rows 8p .. 8p + 7: first the scales, 16 bytes per block b (row r's f16 at
    16 b + 2 r), then per block the payload as 32-byte vectors whose lane r (bytes 4 r .. 4 r + 3)
    is row r's 4-byte group g of that block, g in order (q8_0 8 vectors, q4_0 4)."""
    flat, nb, groups = _panel_split(rows, dtype, n)
    x = flat.reshape(-1, PANEL_ROWS, row_bytes(dtype, n))
    scales = x[:, :, :2 * nb].reshape(-1, PANEL_ROWS, nb, 2).transpose(0, 2, 1, 3)
    payload = x[:, :, 2 * nb:].reshape(-1, PANEL_ROWS, nb, groups, 4).transpose(0, 2, 3, 1, 4)
    out = np.concatenate([scales.reshape(len(x), -1), payload.reshape(len(x), -1)], axis=1)
    return out.reshape(-1)


def from_panels(panels: np.ndarray, dtype: int, n: int) -> np.ndarray:
    """Inverse of to_panels: stored panels (dtype 7 or 8 data; `dtype` is the row dtype 5 or 6)
    -> the rows they hold, as uint8 [rows, row_bytes(dtype, n)]."""
    flat, nb, groups = _panel_split(panels, dtype, n)
    scales = flat[:, :16 * nb].reshape(-1, nb, PANEL_ROWS, 2).transpose(0, 2, 1, 3)
    payload = flat[:, 16 * nb:].reshape(-1, nb, groups, PANEL_ROWS, 4).transpose(0, 3, 1, 2, 4)
    rows = np.concatenate([scales.reshape(len(flat), PANEL_ROWS, -1),
                           payload.reshape(len(flat), PANEL_ROWS, -1)], axis=2)
    return rows.reshape(-1, row_bytes(dtype, n))


def bf16_to_panels(rows: np.ndarray, n: int) -> np.ndarray:
    """bf16 rows of n elements (uint16 bit patterns, any array shape holding whole groups of 16
    rows back to back; n even) -> the same values in bf16x16 panels, as a flat uint16 array.

    Panel p holds rows 16p .. 16p + 15: for each pair of columns 2q, 2q + 1, row r's two values at
    elements 32 q + 2 r and 32 q + 2 r + 1."""
    flat = np.ascontiguousarray(rows).view(np.uint16).reshape(-1)
    if n % 2 or flat.size % (BF16_PANEL_ROWS * n):
        raise ValueError(f"{flat.size} values are not whole panels of {BF16_PANEL_ROWS} rows "
                         f"of {n} (an even count)")
    return flat.reshape(-1, BF16_PANEL_ROWS, n // 2, 2).transpose(0, 2, 1, 3).reshape(-1)


def bf16_from_panels(panels: np.ndarray, n: int) -> np.ndarray:
    """Inverse of bf16_to_panels: bf16x16 data -> the rows it holds, uint16 [rows, n]."""
    flat = np.ascontiguousarray(panels).view(np.uint16).reshape(-1)
    if n % 2 or flat.size % (BF16_PANEL_ROWS * n):
        raise ValueError(f"{flat.size} values are not whole panels of {BF16_PANEL_ROWS} rows "
                         f"of {n} (an even count)")
    return flat.reshape(-1, n // 2, BF16_PANEL_ROWS, 2).transpose(0, 2, 1, 3).reshape(-1, n)


def dequantize(data: np.ndarray, dtype: int, shape: Sequence[int]) -> np.ndarray:
    """Inverse of quantize: the float32 values [shape] that stored rows stand for. `data` holds
    whole rows back to back (any array shape, e.g. one row, [rows, row bytes] or a stacked
    [E, rows, row bytes]); rows have shape[-1] elements."""
    if dtype not in BLOCK_BYTES:
        raise ValueError(f"not a block dtype: {dtype}")
    shape = tuple(int(s) for s in shape)
    if dtype in ROWS_OF:  # panels hold whole groups of 8 rows: data must too
        dtype = ROWS_OF[dtype]
        data = from_panels(data, dtype, shape[-1])
    n = shape[-1]
    if n % BLOCK_ELEMS:
        raise ValueError(f"{n} elements is not a whole number of blocks of {BLOCK_ELEMS}")
    nb = n // BLOCK_ELEMS
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    rb = row_bytes(dtype, n)
    if raw.size % rb or raw.size // rb * n != int(np.prod(shape, dtype=np.uint64)):
        raise ValueError(f"{raw.size} bytes are not the rows of a {QUANT_NAMES[dtype]} tensor "
                         f"of shape {shape}")
    rows = raw.reshape(-1, rb)
    d = np.ascontiguousarray(rows[:, :2 * nb]).view("<f2").astype(np.float32)  # [rows, nb]
    payload = rows[:, 2 * nb:]
    if dtype == DTYPE_Q8_0:
        q = payload.view(np.int8).astype(np.float32).reshape(-1, nb, BLOCK_ELEMS)
    else:
        qs = payload.reshape(-1, nb, 16)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.float32) - 8.0
    return (d[..., None] * q).reshape(shape)


ARCH_MIXTRAL, ARCH_QWEN2_MOE, ARCH_QWEN3_MOE, ARCH_OLMOE = 1, 2, 3, 4  # keys of ARCH_NAMES
ARCH_DEEPSEEK_V2, ARCH_DEEPSEEK_V3, ARCH_GLM4_MOE, ARCH_ERNIE4_5_MOE = 5, 6, 7, 8  # version 2
ARCH_GPT_OSS, ARCH_LLAMA4 = 9, 10
ARCH_PHIMOE, ARCH_GRANITEMOE, ARCH_GRANITEMOESHARED, ARCH_DBRX = 11, 12, 13, 14

FLAG_NORM_TOPK = 1              # version 1 only (a version-2 routing entry states it)
FLAG_TIED_EMBEDDINGS = 2
FLAG_SHARED_EXPERT = 4          # version 1 only
FLAG_SHARED_EXPERT_GATE = 8     # version 1 only
FLAGS_V1_ONLY = FLAG_NORM_TOPK | FLAG_SHARED_EXPERT | FLAG_SHARED_EXPERT_GATE
FLAG_QKV_BIAS = 16
FLAG_O_BIAS = 32
FLAG_QK_NORM_HEAD = 64
FLAG_QK_NORM_FULL = 128
FLAG_OUTPUT_BIAS = 256          # version 2 only

LAYER_DENSE, LAYER_MOE = 0, 1
LAYER_FULL, LAYER_SLIDING, LAYER_CHUNKED = 0, 1, 2  # a layer's attention mask (routing entry 0x48)
ATTENTION_GQA, ATTENTION_MLA = 0, 1              # header 0x0C8
ROPE_DEFAULT, ROPE_LINEAR, ROPE_YARN, ROPE_LONGROPE, ROPE_LLAMA3 = 0, 1, 2, 3, 4   # header 0x08C
ROPE_HALVES, ROPE_INTERLEAVED = 0, 1             # header 0x0E4
SCORING_SOFTMAX, SCORING_SIGMOID, SCORING_SPARSEMIXER = 0, 1, 2
SELECT_SCORES, SELECT_LOGITS = 0, 1
GROUP_NONE, GROUP_MAX, GROUP_TOP2_SUM = 0, 1, 2
NORM_NONE, NORM_SUM, NORM_SUM_CLAMPED, NORM_P = 0, 1, 2, 3
SHARED_NONE, SHARED_PLAIN, SHARED_SIGMOID_GATE = 0, 1, 2
EXPERT_SWIGLU, EXPERT_SWIGLU_CLAMPED = 0, 1      # routed experts' activation (routing entry 0x54)
NORM_KIND_RMS, NORM_KIND_LAYER, NORM_KIND_LAYER_BIAS = 0, 1, 2   # header 0x100

# Fixed-header fields after the first 0x28 bytes: (offset, struct code, HParams attribute).
_HPARAM_FIELDS: tuple[tuple[int, str, str], ...] = (
    (0x058, "<I", "arch"), (0x05C, "<I", "flags"), (0x060, "<I", "d_model"),
    (0x064, "<I", "n_heads"), (0x068, "<I", "n_kv_heads"), (0x06C, "<I", "head_dim"),
    (0x070, "<I", "vocab_size"), (0x074, "<I", "max_context"), (0x078, "<I", "d_ff_expert"),
    (0x07C, "<I", "d_ff_dense"), (0x080, "<I", "d_ff_shared"), (0x084, "<I", "n_experts_active"),
    (0x088, "<I", "sliding_window"), (0x08C, "<I", "rope_type"), (0x090, "<d", "rope_theta"),
    (0x098, "<f", "rope_factor"), (0x09C, "<I", "rope_original_max_context"),
    (0x0A0, "<f", "rope_low_freq_factor"), (0x0A4, "<f", "rope_high_freq_factor"),
    (0x0A8, "<f", "norm_eps"), (0x0AC, "<f", "clip_qkv"), (0x0B0, "<f", "default_epsilon"),
    (0x0B4, "<i", "bos_token_id"), (0x0B8, "<i", "eos_token_id"),
)
# Version 2's fields after the CRCs (0x0C8..0x113; 0x114..0x1FF reserved, zero).
_HPARAM_FIELDS_V2: tuple[tuple[int, str, str], ...] = (
    (0x0C8, "<I", "attention"), (0x0CC, "<I", "q_lora_rank"), (0x0D0, "<I", "kv_lora_rank"),
    (0x0D4, "<I", "qk_nope_head_dim"), (0x0D8, "<I", "qk_rope_head_dim"),
    (0x0DC, "<I", "v_head_dim"), (0x0E0, "<I", "rotary_dim"), (0x0E4, "<I", "rope_layout"),
    (0x0E8, "<f", "attn_scale"), (0x0EC, "<f", "latent_norm_eps"),
    (0x0F0, "<f", "rope_attn_factor"), (0x0F4, "<f", "rope_beta_fast"),
    (0x0F8, "<f", "rope_beta_slow"), (0x0FC, "<I", "rope_truncate"),
    (0x100, "<I", "norm_kind"), (0x104, "<f", "embedding_scale"), (0x108, "<f", "residual_scale"),
    (0x10C, "<f", "logit_divisor"), (0x110, "<I", "attention_chunk_size"),
)


@dataclass(frozen=True)
class RouteRule:
    """A MoE layer's routing rule, as its version-2 routing entry states it (docs/format.md, "The
    routing rule"), and the form of its routed experts. `gate_bias` and `correction_bias` say
    whether the layer has the tensors `layers.L.moe_gate_bias` and `layers.L.moe_correction_bias`
    (the writer finds their index); `expert_bias` whether it has `moe_w1_bias`, `moe_w3_bias`
    and `moe_w2_bias`; `activation` (EXPERT_*) with `act_alpha` and `act_limit` is what the
    experts compute between their projections; `weight_inputs` puts each chosen expert's weight on
    its input instead of its output (Llama 4)."""

    scoring: int = SCORING_SOFTMAX
    select_on: int = SELECT_SCORES
    gate_bias: bool = False
    correction_bias: bool = False
    n_groups: int = 1
    n_groups_kept: int = 1
    group_score: int = GROUP_NONE
    normalize: int = NORM_NONE
    norm_eps: float = 0.0
    norm_p: float = 0.0
    scale: float = 1.0
    shared: int = SHARED_NONE
    sparsemixer_eps: float = 0.0
    expert_bias: bool = False
    activation: int = EXPERT_SWIGLU
    act_alpha: float = 0.0
    act_limit: float = 0.0
    weight_inputs: bool = False

    @classmethod
    def from_info(cls, info: Any) -> RouteRule:
        """The rule of a decoded routing entry (colibri.engine.RoutingInfo of a MoE layer)."""
        return cls(info.scoring, info.select_on, info.gate_bias_tensor is not None,
                   info.correction_bias_tensor is not None, info.n_groups, info.n_groups_kept,
                   info.group_score, info.normalize, info.norm_eps, info.norm_p, info.scale,
                   info.shared, info.sparsemixer_eps, bool(info.expert_bias), info.activation,
                   info.act_alpha, info.act_limit, bool(info.weight_inputs))

    @classmethod
    def from_v1_flags(cls, flags: int) -> RouteRule:
        """The rule a version-1 file means by its header flags (softmax over every expert, top-k
        of the scores; NORM_TOPK, SHARED_EXPERT, SHARED_EXPERT_GATE)."""
        shared = (SHARED_NONE if not flags & FLAG_SHARED_EXPERT else
                  SHARED_SIGMOID_GATE if flags & FLAG_SHARED_EXPERT_GATE else SHARED_PLAIN)
        return cls(normalize=NORM_SUM if flags & FLAG_NORM_TOPK else NORM_NONE, shared=shared)


@dataclass(frozen=True)
class LayerAttention:
    """A layer's attention as its version-2 routing entry states it, dense and MoE layers alike:
    the mask (LAYER_FULL / LAYER_SLIDING / LAYER_CHUNKED), whether each head has a sink logit
    (`layers.L.attn_sinks`), whether the layer skips RoPE, L2-normalises q and k heads after it,
    and scales its queries by a temperature (its floor and scale; floor 0 = none)."""

    mask: int = LAYER_FULL
    sinks: bool = False
    no_rope: bool = False
    qk_l2_norm: bool = False
    temperature_floor: int = 0
    temperature_scale: float = 0.0

    @classmethod
    def from_info(cls, info: Any) -> LayerAttention:
        """The attention of a decoded routing entry (colibri.engine.RoutingInfo)."""
        return cls(info.attention, bool(info.sinks), bool(info.no_rope), bool(info.qk_l2_norm),
                   info.temperature_floor, info.temperature_scale)


@dataclass
class TensorSpec:
    """One tensor to write. `load` returns the data already in the storage dtype
    (float32, float16, or uint16 bit patterns for bf16), C-contiguous, of shape `shape`."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.dtype, self.shape)


@dataclass
class FilePlan:
    """Every offset of a file, computed before any data is written."""

    hparams: HParams
    layer_kinds: list[int]
    rules: list[RouteRule | None]   # per layer (None for dense layers)
    attention: list[LayerAttention] # per layer
    version: int
    tensors: list[TensorSpec]
    offsets: list[int]
    routing_offset: int
    tensor_table_offset: int
    tokenizer_offset: int
    tokenizer: bytes
    metadata_offset: int
    metadata: bytes
    data_offset: int
    file_size: int
    crcs: list[int] = field(default_factory=list)


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, NaN kept quiet."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return rounded


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_storage(values: np.ndarray, dtype: int) -> np.ndarray:
    """Convert float data to the array `TensorSpec.load` must return for `dtype`."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == DTYPE_F32:
        return np.ascontiguousarray(values)
    if dtype == DTYPE_F16:
        return np.ascontiguousarray(values.astype(np.float16))
    if dtype == DTYPE_BF16:
        return to_bf16_bits(values)
    raise ValueError(f"unknown dtype {dtype}")


def storage_to_f32(data: np.ndarray, dtype: int) -> np.ndarray:
    """Inverse of to_storage: the float32 values a storage array stands for."""
    if dtype == DTYPE_BF16:
        return bf16_bits_to_f32(data)
    return np.asarray(data).astype(np.float32)


def plan_file(hparams: HParams, layer_kinds: Sequence[int], tensors: Sequence[TensorSpec],
              tokenizer: bytes = b"", metadata: dict | None = None,
              rules: Sequence[RouteRule | None] | None = None,
              attention: Sequence[LayerAttention] | None = None,
              version: int = FORMAT_VERSION) -> FilePlan:
    """Lay out a file: sections in the documented order, tensors 64-byte aligned in list order.

    `rules` gives each MoE layer's routing rule (None entries for dense layers); without it every
    MoE layer gets the rule version 1 means by `hparams.flags` (RouteRule.from_v1_flags), and a
    version-2 file leaves those version-1 flag bits out of its header. `attention` gives each
    layer's LayerAttention; without it every layer is sliding when `hparams.sliding_window` is
    set, as in version 1. Version 1 can state only version 1's rule and attention; asking it for
    more raises ValueError.

    The plan's `hparams` are those written: `version` is `version` and `n_moe_layers` counts the
    MoE layers of `layer_kinds`, whatever `hparams` said."""
    if len(layer_kinds) != hparams.n_layers:
        raise ValueError(f"{len(layer_kinds)} layer kinds for {hparams.n_layers} layers")
    if version not in (1, 2):
        raise ValueError(f"format version {version} (this writer writes 1 and 2)")
    hparams = replace(hparams, version=version,
                      n_moe_layers=sum(1 for k in layer_kinds if k == LAYER_MOE))
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise ValueError("duplicate tensor names")
    implied = RouteRule.from_v1_flags(hparams.flags)
    if rules is None:
        rules = [implied if k == LAYER_MOE else None for k in layer_kinds]
    if attention is None:
        attention = [LayerAttention(LAYER_SLIDING if hparams.sliding_window else LAYER_FULL)
                     ] * hparams.n_layers
    if len(rules) != hparams.n_layers or len(attention) != hparams.n_layers:
        raise ValueError("rules and attention need one entry per layer")
    if version == 1 and (any(r not in (None, implied) for r in rules) or
                         len(set(attention)) > 1 or attention[0] != LayerAttention(attention[0].mask)
                         or hparams.attention != ATTENTION_GQA or
                         hparams.norm_kind != NORM_KIND_RMS or hparams.flags & FLAG_OUTPUT_BIAS or
                         hparams.embedding_scale or hparams.residual_scale or
                         hparams.logit_divisor):
        raise ValueError("format version 1 cannot state these routing rules or attention")
    header_size = HEADER_SIZE if version == 2 else HEADER_SIZE_V1
    entry_size = ROUTING_ENTRY_SIZE if version == 2 else ROUTING_ENTRY_SIZE_V1
    meta_bytes = json.dumps(metadata or {}, sort_keys=True).encode("utf-8")
    routing_offset = header_size
    table_offset = _align(routing_offset + entry_size * hparams.n_layers, 8)
    tokenizer_offset = _align(table_offset + TENSOR_ENTRY_SIZE * len(tensors), 8)
    metadata_offset = _align(tokenizer_offset + len(tokenizer), 8)
    data_offset = _align(metadata_offset + len(meta_bytes), ALIGNMENT)
    offsets = []
    cursor = data_offset
    for t in tensors:
        offsets.append(cursor)
        cursor = _align(cursor + t.nbytes, ALIGNMENT)
    file_size = offsets[-1] + tensors[-1].nbytes if tensors else data_offset
    return FilePlan(hparams, list(layer_kinds), list(rules), list(attention), version,
                    list(tensors), offsets, routing_offset, table_offset,
                    tokenizer_offset if tokenizer else 0, bytes(tokenizer),
                    metadata_offset if meta_bytes else 0, meta_bytes, data_offset, file_size)


def _routing_bytes(plan: FilePlan) -> bytes:
    """The routing section: one entry per layer (docs/format.md, "Routing section")."""
    index = {t.name: i for i, t in enumerate(plan.tensors)}
    hp = plan.hparams
    size = ROUTING_ENTRY_SIZE if plan.version == 2 else ROUTING_ENTRY_SIZE_V1
    out = bytearray()
    for layer, kind in enumerate(plan.layer_kinds):
        entry = bytearray(size)
        rule = plan.rules[layer] if kind == LAYER_MOE else None

        def tensor(slot: str, present: bool = True) -> int:
            return index.get(f"layers.{layer}.{slot}", NO_TENSOR) if present else NO_TENSOR
        if rule is None:  # dense: no gate, no rule
            struct.pack_into("<4I", entry, 0x00, layer, kind, NO_TENSOR, NO_TENSOR)
            if plan.version == 2:
                struct.pack_into("<I", entry, 0x20, NO_TENSOR)
        else:
            struct.pack_into("<7I", entry, 0x00, layer, kind, tensor("moe_gate"),
                             tensor("moe_gate_bias", rule.gate_bias), hp.n_experts_active,
                             hp.n_experts, rule.scoring)
            if plan.version == 2:
                struct.pack_into("<6I3fIf", entry, 0x1C, rule.select_on,
                                 tensor("moe_correction_bias", rule.correction_bias),
                                 rule.n_groups, rule.n_groups_kept, rule.group_score,
                                 rule.normalize, rule.norm_eps, rule.norm_p, rule.scale,
                                 rule.shared, rule.sparsemixer_eps)
        if plan.version == 2:
            att = plan.attention[layer]
            struct.pack_into("<2I", entry, 0x48, att.mask, int(att.sinks))
            if rule is not None:
                struct.pack_into("<2I2fI", entry, 0x50, int(rule.expert_bias), rule.activation,
                                 rule.act_alpha, rule.act_limit, int(rule.weight_inputs))
            struct.pack_into("<3If", entry, 0x64, int(att.no_rope), int(att.qk_l2_norm),
                             att.temperature_floor, att.temperature_scale)
        out += entry
    return bytes(out)


def _table_bytes(plan: FilePlan) -> bytes:
    out = bytearray()
    for t, offset, crc in zip(plan.tensors, plan.offsets, plan.crcs):
        name = t.name.encode("ascii")
        if len(name) >= TENSOR_NAME_MAX:
            raise ValueError(f"tensor name too long: {t.name}")
        shape = list(t.shape) + [0] * (4 - len(t.shape))
        out += name.ljust(TENSOR_NAME_MAX, b"\0")
        out += struct.pack("<II4QQQII", t.dtype, len(t.shape), *shape, offset, t.nbytes, crc, 0)
    return bytes(out)


def header_bytes(plan: FilePlan, routing: bytes, table: bytes) -> bytes:
    """The fixed header (256 bytes in version 1, 512 in version 2), CRCs included."""
    hp = plan.hparams
    size = HEADER_SIZE if plan.version == 2 else HEADER_SIZE_V1
    head = bytearray(size)
    struct.pack_into("<4sIIIII", head, 0, MAGIC, plan.version, hp.n_experts, hp.n_layers,
                     size, len(plan.tensors))
    struct.pack_into("<QQQQQQQQ", head, 0x18, plan.routing_offset, plan.data_offset,
                     plan.tensor_table_offset, plan.tokenizer_offset, len(plan.tokenizer),
                     plan.metadata_offset, len(plan.metadata), plan.file_size)
    for offset, code, attr in _HPARAM_FIELDS:
        struct.pack_into(code, head, offset, getattr(hp, attr))
    struct.pack_into("<I", head, 0x0BC, hp.n_moe_layers)
    if plan.version == 2:
        struct.pack_into("<I", head, 0x05C, hp.flags & ~FLAGS_V1_ONLY)
        struct.pack_into("<I", head, 0x080, hp.d_ff_shared if any(
            r is not None and r.shared != SHARED_NONE for r in plan.rules) else 0)
        for offset, code, attr in _HPARAM_FIELDS_V2:
            struct.pack_into(code, head, offset, hp.v2_value(attr))
    fix_crcs(head, routing + table)
    return bytes(head)


def header_crc(head: bytes | bytearray) -> int:
    """header_crc32 of a whole fixed header: version 1's covers bytes 0x000..0x0BF, version 2's
    those and every byte after the two CRCs, 0x0C8 to the header's end."""
    crc = zlib.crc32(bytes(head[:0xC0]))
    if struct.unpack_from("<I", head, 0x04)[0] == 2:
        crc = zlib.crc32(bytes(head[0xC8:]), crc)
    return crc & 0xFFFFFFFF


def fix_crcs(head: bytearray, tables: bytes) -> None:
    """Recompute header_crc32 (0x0C0) and tables_crc32 (0x0C4) of a whole fixed header in place."""
    struct.pack_into("<I", head, 0x0C4, zlib.crc32(tables) & 0xFFFFFFFF)
    struct.pack_into("<I", head, 0x0C0, header_crc(head))


def refresh_checksums(image: bytearray) -> None:
    """Recompute the header and tables CRCs of a whole file image after editing it in place, so
    that a test's deliberate corruption is reported as itself rather than as a checksum error.
    Uses the (possibly edited) version, header size and section offsets in the header."""
    version, _ne, n_layers, header_size, n_tensors = struct.unpack_from("<5I", image, 0x04)
    entry = ROUTING_ENTRY_SIZE if version == 2 else ROUTING_ENTRY_SIZE_V1
    header_size = max(HEADER_SIZE if version == 2 else HEADER_SIZE_V1,
                      min(header_size, len(image)))
    routing_offset = struct.unpack_from("<Q", image, 0x18)[0]
    table_offset = struct.unpack_from("<Q", image, 0x28)[0]
    routing = bytes(image[routing_offset:routing_offset + n_layers * entry])
    table = bytes(image[table_offset:table_offset + n_tensors * TENSOR_ENTRY_SIZE])
    head = bytearray(image[:header_size])
    fix_crcs(head, routing + table)
    image[:header_size] = head


def _tensor_data(spec: TensorSpec) -> bytes:
    data = np.ascontiguousarray(spec.load())
    if spec.dtype not in BLOCK_BYTES and tuple(data.shape) != tuple(spec.shape):
        raise ValueError(f"tensor {spec.name}: data shape {data.shape} != declared {spec.shape}")
    raw = data.tobytes()
    if len(raw) != spec.nbytes:
        raise ValueError(f"tensor {spec.name}: {len(raw)} bytes, expected {spec.nbytes}")
    return raw


def build_bytes(plan: FilePlan) -> bytearray:
    """The whole file image in memory (for tests and small files)."""
    image = bytearray(plan.file_size)
    plan.crcs = []
    for spec, offset in zip(plan.tensors, plan.offsets):
        raw = _tensor_data(spec)
        image[offset:offset + len(raw)] = raw
        plan.crcs.append(zlib.crc32(raw) & 0xFFFFFFFF)
    _write_metadata_sections(plan, image)
    return image


def _write_metadata_sections(plan: FilePlan, image: bytearray) -> None:
    routing, table = _routing_bytes(plan), _table_bytes(plan)
    head = header_bytes(plan, routing, table)
    image[:len(head)] = head
    image[plan.routing_offset:plan.routing_offset + len(routing)] = routing
    image[plan.tensor_table_offset:plan.tensor_table_offset + len(table)] = table
    if plan.tokenizer:
        image[plan.tokenizer_offset:plan.tokenizer_offset + len(plan.tokenizer)] = plan.tokenizer
    if plan.metadata:
        image[plan.metadata_offset:plan.metadata_offset + len(plan.metadata)] = plan.metadata


def write_colibri(path: str | os.PathLike[str], plan: FilePlan,
                  progress: Callable[[int, int], None] | None = None) -> None:
    """Stream `plan` to `path`: data first (one tensor in memory at a time), then the header and
    tables, fsync, and an atomic rename. On any error the temporary file is removed and an
    existing file at `path` is left untouched."""
    def stream(out: IO[bytes]) -> None:
        plan.crcs = []
        out.truncate(plan.file_size)
        for i, (spec, offset) in enumerate(zip(plan.tensors, plan.offsets)):
            raw = _tensor_data(spec)
            out.seek(offset)
            out.write(raw)
            plan.crcs.append(zlib.crc32(raw) & 0xFFFFFFFF)
            if progress is not None:
                progress(i + 1, len(plan.tensors))
        head = bytearray(plan.data_offset)
        _write_metadata_sections(plan, head)
        out.seek(0)
        out.write(head)

    atomic_write(path, stream)


def tensor_specs_from_arrays(arrays: Iterable[tuple[str, np.ndarray, int]]) -> list[TensorSpec]:
    """Specs for in-memory float arrays: (name, values, dtype) -> stored in `dtype`."""
    specs = []
    for name, values, dtype in arrays:
        stored = to_storage(values, dtype)
        specs.append(TensorSpec(name, dtype, tuple(int(s) for s in stored.shape),
                                lambda stored=stored: stored))
    return specs
