#!/usr/bin/env python3
"""Generate the corrupt-file corpus: tests/corpus/*.colibri, manifest.json and manifest.txt.

One small valid file (a 2-layer Mixtral-style model, one MoE and one dense layer, f32, no
tokenizer, fixed metadata: the same bytes on every run, in format version 2), the same model in
format version 1, a DeepSeek-V3-style version-2 file (sigmoid scores, a correction bias,
two groups of which one is kept, a scaling factor), a GPT-OSS-style one (router bias, top-k of
the logits, expert biases, clamped SwiGLU, attention sinks) and a Llama-4-style one (sigmoid of
the chosen logits on the experts' inputs, a shared expert, chunked attention with the q/k L2 norm,
a NoPE layer with a query temperature, llama3 RoPE); then one file per broken thing, each
with the exact finding the validator must report: status code name, absolute byte offset, tensor
and a message substring. The expectation is stated here from the layout (the plan's offsets), not
read back from the validator; `--check` then runs `colibri.validate` on every entry and fails on
any difference. The header and table CRCs are recomputed after each edit (refresh_checksums)
unless the entry is about a checksum, so every file is reported as the one thing broken in it.

Fuzzer findings live in tests/corpus/fuzz/ and are listed in the same manifest (added by hand,
with the error they must produce): they are never regenerated, only checked.

    python tools/make_corpus.py           # write tests/corpus/ (and check it)
    python tools/make_corpus.py --check   # only check the committed files against the manifest

manifest.txt is the same list for the C test (engine_c/tests/test_corpus.c): one line per file,
`file check_flags code_number offset`, with offset -1 for "any".
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

from colibri import fileformat as ff  # noqa: E402
from colibri.values import HParams  # noqa: E402

CORPUS = ROOT / "tests" / "corpus"
MAX_FILE = 64 * 1024

# col_status names (colibri.h; append-only).
CODES = ["COL_OK", "COL_ERR_IO", "COL_ERR_NOMEM", "COL_ERR_INVALID_ARG", "COL_ERR_TRUNCATED",
         "COL_ERR_BAD_MAGIC", "COL_ERR_BAD_VERSION", "COL_ERR_LIMIT", "COL_ERR_HEADER",
         "COL_ERR_SECTION_BOUNDS", "COL_ERR_TENSOR_BOUNDS", "COL_ERR_MISALIGNED",
         "COL_ERR_SIZE_MISMATCH", "COL_ERR_OVERLAP", "COL_ERR_MISSING_TENSOR", "COL_ERR_SHAPE",
         "COL_ERR_DTYPE", "COL_ERR_NAME", "COL_ERR_CHECKSUM", "COL_ERR_NONFINITE",
         "COL_ERR_UNSUPPORTED", "COL_ERR_ROUTING", "COL_ERR_CONTEXT_FULL", "COL_ERR_BAD_TOKEN",
         "COL_ERR_UNKNOWN_TENSOR"]
CHECK_CHECKSUMS, CHECK_NONFINITE = 1, 2

# Header field offsets (docs/format.md).
H_VERSION, H_NUM_EXPERTS, H_HEADER_SIZE, H_TENSOR_COUNT = 0x04, 0x08, 0x10, 0x14
H_ROUTING_OFFSET, H_DATA_OFFSET, H_FILE_SIZE, H_ARCH, H_FLAGS = 0x18, 0x20, 0x50, 0x58, 0x5C
H_D_MODEL, H_HEADER_CRC, H_TABLES_CRC = 0x60, 0xC0, 0xC4
H_ROPE_TYPE, H_ROPE_ORIG_CTX, H_KV_LORA, H_ROTARY_DIM, H_ROPE_BETA_FAST = 0x8C, 0x9C, 0xD0, 0xE0, 0xF4
H_NORM_KIND, H_RESIDUAL_SCALE = 0x100, 0x108
T_DTYPE, T_NDIM, T_SHAPE, T_OFFSET, T_NBYTES, T_CRC = 0x40, 0x44, 0x48, 0x68, 0x70, 0x78
R_KIND, R_SCORING, R_SELECT_ON, R_CORRECTION, R_N_GROUPS, R_GROUPS_KEPT = 0x04, 0x18, 0x1C, 0x20, 0x24, 0x28
R_GROUP_SCORE, R_SCALE, R_ATTENTION = 0x2C, 0x3C, 0x48
R_SINKS, R_EXPERT_BIAS, R_ACTIVATION, R_ACT_ALPHA, R_ACT_LIMIT = 0x4C, 0x50, 0x54, 0x58, 0x5C
R_WEIGHT_INPUTS, R_TEMP_SCALE = 0x60, 0x70
H_ROPE_HIGH, H_CHUNK = 0xA4, 0x110


@dataclass
class Entry:
    """One corpus file and what validating it must report (the first error, or for a file with
    only warnings the first warning; code COL_OK for a clean file)."""

    file: str
    code: str
    offset: int
    message: str
    description: str
    tensor: str = ""
    severity: str = "error"
    checksums: bool = False
    nan_check: bool = False
    absent: bool = False          # no file: the path itself is the test (COL_ERR_IO)
    data: bytes = field(default=b"", repr=False)

    @property
    def flags(self) -> int:
        return (CHECK_CHECKSUMS if self.checksums else 0) | (CHECK_NONFINITE if self.nan_check else 0)

    def manifest(self) -> dict:
        return {"file": self.file, "code": self.code, "severity": self.severity,
                "offset": self.offset, "tensor": self.tensor, "message": self.message,
                "checksums": self.checksums, "nan_check": self.nan_check, "absent": self.absent,
                "description": self.description}


# ---------------------------------------------------------------------------------------------
# The base model


def base_hparams() -> HParams:
    return HParams(arch=ff.ARCH_MIXTRAL, n_layers=2, n_experts=2, n_experts_active=1,
                   d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, vocab_size=16,
                   max_context=16, d_ff_expert=8, d_ff_dense=8, flags=ff.FLAG_NORM_TOPK,
                   norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)


KINDS = [ff.LAYER_MOE, ff.LAYER_DENSE]


# DeepSeek-V3's rule on 4 experts: sigmoid + correction bias, 2 groups by their best two, 1 kept.
V3_RULE = ff.RouteRule(scoring=ff.SCORING_SIGMOID, correction_bias=True, n_groups=2,
                       n_groups_kept=1, group_score=ff.GROUP_TOP2_SUM, normalize=ff.NORM_SUM,
                       norm_eps=1e-20, scale=2.5)


def v3_hparams() -> HParams:
    return replace(base_hparams(), flags=0, n_experts=4, n_experts_active=2)


# GPT-OSS's rule and experts: top-k of the logits (+ router bias), a softmax over the chosen;
# expert biases and the clamped SwiGLU. Both layers have attention sinks.
GPT_OSS_RULE = ff.RouteRule(select_on=ff.SELECT_LOGITS, gate_bias=True, expert_bias=True,
                            activation=ff.EXPERT_SWIGLU_CLAMPED, act_alpha=1.702, act_limit=7.0)
GPT_OSS_ATTENTION = [ff.LayerAttention(ff.LAYER_FULL, sinks=True)] * 2
# Llama 4's: the sigmoid of each chosen logit on that expert's input, a shared expert; layer 0
# chunked with the q/k L2 norm, layer 1 without RoPE, its queries' temperature tuned.
LLAMA4_RULE = ff.RouteRule(scoring=ff.SCORING_SIGMOID, select_on=ff.SELECT_LOGITS,
                           shared=ff.SHARED_PLAIN, weight_inputs=True)
LLAMA4_ATTENTION = [ff.LayerAttention(ff.LAYER_CHUNKED, qk_l2_norm=True),
                    ff.LayerAttention(ff.LAYER_FULL, no_rope=True, temperature_floor=4,
                                      temperature_scale=0.1)]


def llama4_hparams() -> HParams:
    return replace(v3_hparams(), d_ff_shared=8, attention_chunk_size=4,
                   rope_layout=ff.ROPE_INTERLEAVED, rope_type=ff.ROPE_LLAMA3, rope_factor=8.0,
                   rope_original_max_context=8, rope_low_freq_factor=1.0,
                   rope_high_freq_factor=4.0)


def phi_hparams() -> HParams:
    """The base with PhiMoE's blocks: LayerNorms with bias, a biased LM head, LongRoPE."""
    return replace(base_hparams(), flags=ff.FLAG_NORM_TOPK | ff.FLAG_OUTPUT_BIAS,
                   norm_kind=ff.NORM_KIND_LAYER_BIAS, rope_type=ff.ROPE_LONGROPE,
                   rope_attn_factor=1.2)


def base_arrays(hp: HParams, extra: bool = False, correction_bias: bool = False,
                gpt_oss: bool = False, shared: bool = False) -> list[tuple[str, np.ndarray, int]]:
    rng = np.random.default_rng(20261129)
    H, V, E, I, D = hp.d_model, hp.vocab_size, hp.n_experts, hp.d_ff_expert, hp.d_ff_dense
    q, kv = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out = [("token_embd", mat(V, H))]
    for layer, kind in enumerate(KINDS):
        p = f"layers.{layer}."
        out += [(p + "attn_norm", norm(H)), (p + "attn_q", mat(q, H)), (p + "attn_k", mat(kv, H)),
                (p + "attn_v", mat(kv, H)), (p + "attn_o", mat(H, q)), (p + "ffn_norm", norm(H))]
        if gpt_oss:
            out += [(p + "attn_sinks", norm(hp.n_heads))]
        if hp.norm_kind == ff.NORM_KIND_LAYER_BIAS:
            out += [(p + "attn_norm_bias", 0.1 * mat(H)), (p + "ffn_norm_bias", 0.1 * mat(H))]
        if kind == ff.LAYER_MOE:
            out += [(p + "moe_gate", mat(E, H))]
            if correction_bias:
                out += [(p + "moe_correction_bias", 0.1 * mat(E))]
            if gpt_oss:
                out += [(p + "moe_gate_bias", 0.1 * mat(E))]
            out += [(p + "moe_w1", mat(E, I, H)), (p + "moe_w2", mat(E, H, I)),
                    (p + "moe_w3", mat(E, I, H))]
            if gpt_oss:
                out += [(p + "moe_w1_bias", mat(E, I)), (p + "moe_w2_bias", mat(E, H)),
                        (p + "moe_w3_bias", mat(E, I))]
            if shared:
                S = hp.d_ff_shared
                out += [(p + "shared_w1", mat(S, H)), (p + "shared_w2", mat(H, S)),
                        (p + "shared_w3", mat(S, H))]
        else:
            out += [(p + "mlp_w1", mat(D, H)), (p + "mlp_w2", mat(H, D)), (p + "mlp_w3", mat(D, H))]
    out += [("output_norm", norm(H)), ("output", mat(V, H))]
    if hp.norm_kind == ff.NORM_KIND_LAYER_BIAS:
        out.append(("output_norm_bias", 0.1 * mat(H)))
    if hp.flags & ff.FLAG_OUTPUT_BIAS:
        out.append(("output_bias", 0.1 * mat(V)))
    if hp.rope_type == ff.ROPE_LONGROPE:
        out.append(("rope_freq_factors", np.array([1.0, 2.5], dtype=np.float32)))
    if extra:
        out.append(("extra.scale", norm(1)))
    return [(name, values, ff.DTYPE_F32) for name, values in out]


@dataclass
class Base:
    image: bytearray
    plan: ff.FilePlan
    index: dict[str, int]

    def entry(self, name: str) -> int:
        """Absolute offset of tensor `name`'s 128-byte table entry."""
        return self.plan.tensor_table_offset + self.index[name] * ff.TENSOR_ENTRY_SIZE

    def data(self, name: str) -> int:
        return self.plan.offsets[self.index[name]]

    def copy(self) -> bytearray:
        return bytearray(self.image)


def panels_hparams() -> HParams:
    """The base model widened so every matrix has rows % 8 == 0 and columns % 32 == 0."""
    return replace(base_hparams(), d_model=32, head_dim=16, d_ff_expert=32, d_ff_dense=32)


def as_panels(arrays: list[tuple[str, np.ndarray, int]]) -> list[ff.TensorSpec]:
    """Every matrix but the router quantised to q8_0 and stored in 8-row panels (q8_0x8)."""
    specs = []
    for name, v, dtype in arrays:
        if v.ndim == 1 or name.endswith("moe_gate"):
            specs += ff.tensor_specs_from_arrays([(name, v, dtype)])
            continue
        stored = ff.to_panels(ff.quantize(v, ff.DTYPE_Q8_0), ff.DTYPE_Q8_0, v.shape[-1])
        specs.append(ff.TensorSpec(name, ff.DTYPE_Q8_0X8, v.shape, lambda s=stored: s))
    return specs


def build_base(extra: bool = False, version: int = ff.FORMAT_VERSION, v3: bool = False,
               extra_bias: bool = False, gpt_oss: bool = False, llama4: bool = False,
               phi: bool = False, panels: bool = False) -> Base:
    """The base file; `v3`: the DeepSeek-V3-style one; `extra_bias`: with a correction bias that
    its routing entry does not name; `gpt_oss`: the GPT-OSS-style one; `llama4`: the
    Llama-4-style one; `phi`: with PhiMoE's biased LayerNorms and LM head, and its LongRoPE
    (frequency factors [head_dim / 2], cos and sin times 1.2); `panels`: the base widened
    (panels_hparams) with its matrices in q8_0x8."""
    hp = (llama4_hparams() if llama4 else v3_hparams() if v3 or extra_bias or gpt_oss
          else phi_hparams() if phi else panels_hparams() if panels else base_hparams())
    arrays = base_arrays(hp, extra, correction_bias=v3 or extra_bias, gpt_oss=gpt_oss,
                         shared=llama4)
    specs = as_panels(arrays) if panels else ff.tensor_specs_from_arrays(arrays)
    rules = ([V3_RULE, None] if v3 else [ff.RouteRule(), None] if extra_bias else
             [GPT_OSS_RULE, None] if gpt_oss else [LLAMA4_RULE, None] if llama4 else None)
    attention = GPT_OSS_ATTENTION if gpt_oss else LLAMA4_ATTENTION if llama4 else None
    plan = ff.plan_file(hp, KINDS, specs, tokenizer=b"", metadata={"corpus": True}, rules=rules,
                        attention=attention, version=version)
    image = ff.build_bytes(plan)
    return Base(image, plan, {s.name: i for i, s in enumerate(specs)})


def put(image: bytearray, offset: int, fmt: str, *values: object) -> None:
    struct.pack_into(fmt, image, offset, *values)


def edited(base: Base, edit: Callable[[bytearray], None], refresh: bool = True) -> bytes:
    image = base.copy()
    edit(image)
    if refresh:
        ff.refresh_checksums(image)
    return bytes(image)


# ---------------------------------------------------------------------------------------------
# The corpus


def corpus_entries() -> list[Entry]:
    b = build_base()
    size = len(b.image)
    p = b.plan
    out: list[Entry] = []

    def add(file: str, code: str, offset: int, message: str, description: str, data: bytes,
            **kw: object) -> None:
        out.append(Entry(file, code, offset, message, description, data=data, **kw))  # type: ignore[arg-type]

    add("valid.colibri", "COL_OK", 0, "", "the clean base file every other entry breaks",
        bytes(b.image), checksums=True, nan_check=True)

    # -- identity and size
    add("empty.colibri", "COL_ERR_TRUNCATED", 0, "is empty", "a zero-byte file", b"")
    add("truncated_header.colibri", "COL_ERR_TRUNCATED", 100, "shorter than the 256-byte",
        "cut inside the fixed header (an interrupted download)", bytes(b.image[:100]))
    add("truncated_data.colibri", "COL_ERR_TRUNCATED", size - 100, "declares file_size",
        "the last 100 bytes of tensor data missing", bytes(b.image[:size - 100]))
    add("bad_magic.colibri", "COL_ERR_BAD_MAGIC", 0, "expected \"COLI\"",
        "a GGUF file given a .colibri name", edited(b, lambda im: put(im, 0, "<4s", b"GGUF")))
    add("bad_version.colibri", "COL_ERR_BAD_VERSION", H_VERSION, "format version 3",
        "written by a newer converter", edited(b, lambda im: put(im, H_VERSION, "<I", 3)))

    # -- limits: rejected before anything is allocated, the limit stated
    add("limit_tensor_count.colibri", "COL_ERR_LIMIT", H_TENSOR_COUNT, "tensor_count 4294967295",
        "tensor_count near 2^32", edited(b, lambda im: put(im, H_TENSOR_COUNT, "<I", 0xFFFFFFFF)))
    add("limit_num_experts.colibri", "COL_ERR_LIMIT", H_NUM_EXPERTS, "not in 1..4096",
        "num_experts 0", edited(b, lambda im: put(im, H_NUM_EXPERTS, "<I", 0)))
    add("limit_ndim.colibri", "COL_ERR_LIMIT", b.entry("layers.0.attn_q") + T_NDIM,
        "ndim 5 not in 1..4", "a tensor with 5 dimensions",
        edited(b, lambda im: put(im, b.entry("layers.0.attn_q") + T_NDIM, "<I", 5)),
        tensor="layers.0.attn_q")

    def overflow(im: bytearray) -> None:
        e = b.entry("layers.0.moe_w1")
        put(im, e + T_SHAPE, "<4Q", 1 << 32, 1 << 32, 1 << 32, 1)
    add("limit_shape_overflow.colibri", "COL_ERR_LIMIT", b.entry("layers.0.moe_w1") + T_SHAPE + 8,
        "element count overflows 64 bits", "a shape whose product overflows 64 bits",
        edited(b, overflow), tensor="layers.0.moe_w1")

    # -- header fields
    add("header_size.colibri", "COL_ERR_HEADER", H_HEADER_SIZE, "header_size 100",
        "header_size below the fixed header", edited(b, lambda im: put(im, H_HEADER_SIZE, "<I", 100)))
    add("header_trailing.colibri", "COL_ERR_HEADER", H_FILE_SIZE, "trailing bytes",
        "64 bytes appended after the declared end", bytes(b.image) + b"\0" * 64)
    add("header_d_model.colibri", "COL_ERR_HEADER", H_D_MODEL, "d_model 0",
        "a zero hyper-parameter", edited(b, lambda im: put(im, H_D_MODEL, "<I", 0)))

    # -- sections
    add("section_routing.colibri", "COL_ERR_SECTION_BOUNDS", H_ROUTING_OFFSET, "routing section",
        "routing_offset past the end of the file",
        edited(b, lambda im: put(im, H_ROUTING_OFFSET, "<Q", 1 << 40)))
    add("section_data_offset.colibri", "COL_ERR_SECTION_BOUNDS", H_DATA_OFFSET, "data_offset",
        "data_offset beyond the file",
        edited(b, lambda im: put(im, H_DATA_OFFSET, "<Q", size + 4096)))

    # -- tensor table entries
    last = p.tensors[-1].name
    add("tensor_bounds.colibri", "COL_ERR_TENSOR_BOUNDS", b.entry(last) + T_OFFSET, "beyond file end",
        "the last tensor's offset moved past the end",
        edited(b, lambda im: put(im, b.entry(last) + T_OFFSET, "<Q", (size + 63) // 64 * 64)),
        tensor=last)
    add("misaligned.colibri", "COL_ERR_MISALIGNED", b.entry("output_norm") + T_OFFSET,
        "not a multiple of 64", "a tensor offset 4 bytes off the 64-byte grid",
        edited(b, lambda im: put(im, b.entry("output_norm") + T_OFFSET, "<Q",
                                 b.data("output_norm") + 4)), tensor="output_norm")
    add("size_mismatch.colibri", "COL_ERR_SIZE_MISMATCH", b.entry("layers.1.ffn_norm") + T_NBYTES,
        "nbytes 36 != 8 elements * 4 bytes", "nbytes disagrees with shape and dtype",
        edited(b, lambda im: put(im, b.entry("layers.1.ffn_norm") + T_NBYTES, "<Q", 36)),
        tensor="layers.1.ffn_norm")
    add("overlap.colibri", "COL_ERR_OVERLAP", b.entry("layers.0.attn_norm") + T_OFFSET,
        "overlap or table not sorted", "two tensors share bytes",
        edited(b, lambda im: put(im, b.entry("layers.0.attn_norm") + T_OFFSET, "<Q",
                                 b.data("token_embd"))), tensor="layers.0.attn_norm")

    def rename(old: str, new: bytes) -> Callable[[bytearray], None]:
        def edit(im: bytearray) -> None:
            im[b.entry(old):b.entry(old) + 64] = new.ljust(64, b"\0")
        return edit

    add("missing_tensor.colibri", "COL_ERR_MISSING_TENSOR", p.tensor_table_offset,
        "required tensor 'output_norm' is missing", "output_norm renamed away",
        edited(b, rename("output_norm", b"output_nrm")), tensor="output_norm")

    def transpose(im: bytearray) -> None:
        put(im, b.entry("layers.1.mlp_w2") + T_SHAPE, "<2Q", 8, 8)  # stays [8, 8]: no-op guard
        put(im, b.entry("token_embd") + T_SHAPE, "<2Q", 8, 16)
    add("shape_transposed.colibri", "COL_ERR_SHAPE", b.entry("token_embd") + T_SHAPE,
        "(transposed?)", "token_embd stored [d_model, vocab]", edited(b, transpose),
        tensor="token_embd")
    add("dtype_unknown.colibri", "COL_ERR_DTYPE", b.entry("layers.0.attn_k") + T_DTYPE,
        "unknown dtype 10", "a dtype code no engine knows",
        edited(b, lambda im: put(im, b.entry("layers.0.attn_k") + T_DTYPE, "<I", 10)),
        tensor="layers.0.attn_k")

    def norm_f16(im: bytearray) -> None:
        e = b.entry("output_norm")
        put(im, e + T_DTYPE, "<I", ff.DTYPE_F16)
        put(im, e + T_NBYTES, "<Q", 16)
    add("dtype_not_allowed.colibri", "COL_ERR_DTYPE", b.entry("output_norm") + T_DTYPE,
        "must be f32", "a norm stored as f16", edited(b, norm_f16), tensor="output_norm")
    add("name_bad_char.colibri", "COL_ERR_NAME", b.entry("layers.0.attn_v") + 6, "name",
        "a space inside a tensor name",
        edited(b, rename("layers.0.attn_v", b"layers 0.attn_v")), tensor="layers 0.attn_v")
    add("name_unterminated.colibri", "COL_ERR_NAME", b.entry("layers.0.attn_v") + 63, "name",
        "a 64-byte name with no NUL", edited(b, rename("layers.0.attn_v", b"a" * 64)),
        tensor="a" * 63)
    add("name_duplicate.colibri", "COL_ERR_NAME", b.entry("layers.0.attn_v"), "duplicates tensor",
        "two tensors called layers.0.attn_k",
        edited(b, rename("layers.0.attn_v", b"layers.0.attn_k")), tensor="layers.0.attn_k")

    # -- checksums and data (no CRC refresh: the damage is the point)
    add("checksum_header.colibri", "COL_ERR_CHECKSUM", H_HEADER_CRC, "header_crc32",
        "one flipped bit in sliding_window (0x088), a field no other check objects to",
        edited(b, lambda im: im.__setitem__(0x88, im[0x88] ^ 1), refresh=False))

    def table_crc(im: bytearray) -> None:
        e = b.entry("layers.1.attn_o") + T_CRC
        im[e] ^= 0x80
        head = bytearray(im[:ff.HEADER_SIZE])  # header CRC fixed, tables CRC left stale
        put(head, H_HEADER_CRC, "<I", ff.header_crc(head))
        im[:ff.HEADER_SIZE] = head
    add("checksum_tables.colibri", "COL_ERR_CHECKSUM", H_TABLES_CRC, "tables_crc32",
        "one flipped bit in the tensor table", edited(b, table_crc, refresh=False))
    add("checksum_tensor.colibri", "COL_ERR_CHECKSUM", b.data("layers.0.moe_w2"),
        "data hashes to", "one flipped bit in tensor data (found with --checksums)",
        edited(b, lambda im: im.__setitem__(b.data("layers.0.moe_w2") + 5,
                                            im[b.data("layers.0.moe_w2") + 5] ^ 0x10),
               refresh=False), tensor="layers.0.moe_w2", checksums=True)

    def nan(im: bytearray) -> None:
        at = b.data("layers.1.mlp_w3") + 4 * 9
        put(im, at, "<f", float("nan"))
        n = p.tensors[b.index["layers.1.mlp_w3"]].nbytes
        crc = zlib.crc32(bytes(im[b.data("layers.1.mlp_w3"):b.data("layers.1.mlp_w3") + n]))
        put(im, b.entry("layers.1.mlp_w3") + T_CRC, "<I", crc & 0xFFFFFFFF)
    add("nonfinite.colibri", "COL_ERR_NONFINITE", b.data("layers.1.mlp_w3") + 36,
        "1 NaN/Inf values, first at element 9", "a NaN with a correct CRC (found with --nan-check)",
        edited(b, nan), tensor="layers.1.mlp_w3", checksums=True, nan_check=True)

    # -- architecture and routing
    add("unsupported_arch.colibri", "COL_ERR_UNSUPPORTED", H_ARCH, "unknown arch 99",
        "an architecture code from the future", edited(b, lambda im: put(im, H_ARCH, "<I", 99)))
    add("unsupported_flag.colibri", "COL_ERR_UNSUPPORTED", H_FLAGS, "unknown flag bits 0x80000000",
        "an unknown flag bit", edited(b, lambda im: put(im, H_FLAGS, "<I", 0x80000000)))
    layer1 = p.routing_offset + ff.ROUTING_ENTRY_SIZE
    add("routing_kind.colibri", "COL_ERR_ROUTING", layer1 + R_KIND,
        "unknown layer kind 5", "layer 1's routing kind is 5",
        edited(b, lambda im: put(im, layer1 + R_KIND, "<I", 5)))

    # -- format version 1 (files from converters before version 2 stay valid)
    v1 = build_base(version=1)
    add("valid_v1.colibri", "COL_OK", 0, "", "the base model in format version 1 (32-byte routing "
        "entries, NORM_TOPK in the header flags)", bytes(v1.image), checksums=True, nan_check=True)
    add("v1_output_bias.colibri", "COL_ERR_UNSUPPORTED", H_FLAGS, "unknown flag bits 0x100",
        "version 2's OUTPUT_BIAS flag in a version-1 header",
        edited(v1, lambda im: put(im, H_FLAGS, "<I", ff.FLAG_NORM_TOPK | ff.FLAG_OUTPUT_BIAS)))
    add("v1_flag_in_v2.colibri", "COL_ERR_HEADER", H_FLAGS, "are format version 1's",
        "a version-2 header with version 1's NORM_TOPK flag (the routing entry states it)",
        edited(b, lambda im: put(im, H_FLAGS, "<I", ff.FLAG_NORM_TOPK)))

    # -- version 2's header fields
    add("v2_reserved.colibri", "COL_ERR_UNSUPPORTED", 0x180, "not 0: a field this engine does not "
        "know", "a reserved byte of the version-2 header set (a field from a newer converter)",
        edited(b, lambda im: im.__setitem__(0x180, 7)))
    add("v2_gqa_with_latent.colibri", "COL_ERR_HEADER", H_KV_LORA, "kv_lora_rank is set but "
        "attention is GQA", "an MLA dimension in a GQA file",
        edited(b, lambda im: put(im, H_KV_LORA, "<I", 16)))
    add("v2_rotary_dim.colibri", "COL_ERR_HEADER", H_ROTARY_DIM, "rotary_dim 3 not even",
        "an odd number of rotated dimensions", edited(b, lambda im: put(im, H_ROTARY_DIM, "<I", 3)))

    def yarn_without_beta(im: bytearray) -> None:
        put(im, H_ROPE_TYPE, "<I", ff.ROPE_YARN)
        put(im, H_ROPE_ORIG_CTX, "<I", 8)
    add("v2_yarn_beta.colibri", "COL_ERR_HEADER", H_ROPE_BETA_FAST, "rope_beta_fast 0",
        "YaRN RoPE without its beta_fast", edited(b, yarn_without_beta))
    add("v2_norm_kind.colibri", "COL_ERR_UNSUPPORTED", H_NORM_KIND, "unknown norm_kind 3",
        "a norm this engine does not compute", edited(b, lambda im: put(im, H_NORM_KIND, "<I", 3)))
    add("v2_layernorm_bias_missing.colibri", "COL_ERR_MISSING_TENSOR", p.tensor_table_offset,
        "required tensor 'output_norm_bias' is missing", "LayerNorm with bias (norm_kind 2) "
        "declared without its bias tensors", edited(b, lambda im: put(im, H_NORM_KIND, "<I", 2)),
        tensor="output_norm_bias")
    add("v2_residual_scale.colibri", "COL_ERR_HEADER", H_RESIDUAL_SCALE,
        "residual_scale -0.5 is not 0 (none) or a finite value > 0",
        "a negative residual multiplier", edited(b, lambda im: put(im, H_RESIDUAL_SCALE, "<f", -0.5)))
    phi = build_base(phi=True)
    add("valid_layernorm_bias.colibri", "COL_OK", 0, "", "PhiMoE's blocks: LayerNorms with bias "
        "(attn_norm_bias, ffn_norm_bias, output_norm_bias), the LM head's output_bias and "
        "LongRoPE (rope_freq_factors)", bytes(phi.image), checksums=True, nan_check=True)
    add("v2_longrope_missing_factors.colibri", "COL_ERR_MISSING_TENSOR", p.tensor_table_offset,
        "required tensor 'rope_freq_factors' is missing", "LongRoPE (rope_type 3) without its "
        "frequency factors", edited(b, lambda im: put(im, H_ROPE_TYPE, "<I", ff.ROPE_LONGROPE)),
        tensor="rope_freq_factors")

    def zero_factor(im: bytearray) -> None:
        at = phi.data("rope_freq_factors") + 4
        put(im, at, "<f", 0.0)
        n = phi.plan.tensors[phi.index["rope_freq_factors"]].nbytes
        crc = zlib.crc32(bytes(im[at - 4:at - 4 + n]))
        put(im, phi.entry("rope_freq_factors") + T_CRC, "<I", crc & 0xFFFFFFFF)
    add("longrope_zero_factor.colibri", "COL_ERR_LIMIT", phi.data("rope_freq_factors") + 4,
        "factor 1 is 0, not a finite value > 0", "a LongRoPE frequency factor of 0 (its "
        "frequency would be infinite)", edited(phi, zero_factor), tensor="rope_freq_factors")

    def bias_as_row(im: bytearray) -> None:
        put(im, phi.entry("output_bias") + T_NDIM, "<I", 2)
        put(im, phi.entry("output_bias") + T_SHAPE, "<QQ", 1, 16)
    add("output_bias_shape.colibri", "COL_ERR_SHAPE", phi.entry("output_bias") + T_NDIM,
        "shape [1, 16], expected [16]", "the LM-head bias stored as a [1, V] row",
        edited(phi, bias_as_row), tensor="output_bias")

    # -- quantised panels (dtype 7 q8_0x8): the base widened to H = 32, every matrix but the
    # router in 8-row panels; attn_q [32, 32] has one block a row, 34-byte rows, 272-byte panels
    pn = build_base(panels=True)
    add("valid_panels.colibri", "COL_OK", 0, "", "the base widened (hidden 32), every matrix but "
        "the router stored as q8_0 in 8-row panels (q8_0x8)", bytes(pn.image), checksums=True,
        nan_check=True)
    add("panel_rows.colibri", "COL_ERR_SHAPE", pn.entry("layers.0.attn_k") + T_SHAPE,
        "12 rows, a panel dtype needs a multiple of 8", "a q8_0x8 matrix of 12 rows (half a panel "
        "short)", edited(pn, lambda im: put(im, pn.entry("layers.0.attn_k") + T_SHAPE, "<Q", 12)),
        tensor="layers.0.attn_k")

    def panel_vector(im: bytearray) -> None:
        put(im, pn.entry("output_norm") + T_DTYPE, "<I", ff.DTYPE_Q8_0X8)
        put(im, pn.entry("output_norm") + T_NBYTES, "<Q", 34)
    add("panel_vector.colibri", "COL_ERR_SHAPE", pn.entry("output_norm") + T_NDIM,
        "a panel dtype needs a matrix", "a 1-D tensor in a panel dtype",
        edited(pn, panel_vector), tensor="output_norm")
    add("panel_nbytes.colibri", "COL_ERR_SIZE_MISMATCH", pn.entry("layers.0.attn_q") + T_NBYTES,
        "nbytes 816 != 32 blocks of 32 * 34 bytes", "a q8_0x8 matrix one panel short in nbytes",
        edited(pn, lambda im: put(im, pn.entry("layers.0.attn_q") + T_NBYTES, "<Q", 3 * 272)),
        tensor="layers.0.attn_q")

    def panel_nan(im: bytearray) -> None:
        start, n = pn.data("layers.0.attn_q"), 32 * 34
        put(im, start + 272 + 2 * 3, "<H", 0x7C00)  # row 11: panel 1, lane 3 of block 0's scales
        put(im, start + 11 * 34, "<H", 0x7C00)  # where row 11's scale would be in rows: payload
        put(im, pn.entry("layers.0.attn_q") + T_CRC, "<I",
            zlib.crc32(bytes(im[start:start + n])) & 0xFFFFFFFF)
    add("panel_nonfinite.colibri", "COL_ERR_NONFINITE", pn.data("layers.0.attn_q") + 278,
        "1 NaN/Inf values, first at the scale of row 11, block 0", "an infinite f16 scale in a "
        "q8_0x8 panel (and its bit pattern in a payload byte pair, which is no scale)",
        edited(pn, panel_nan), tensor="layers.0.attn_q", checksums=True, nan_check=True)

    # -- version 2's routing rule (the DeepSeek-V3-style base: 4 experts, top-2, 2 groups)
    v3 = build_base(v3=True)
    add("valid_v3_rule.colibri", "COL_OK", 0, "", "sigmoid scores, a correction bias, two groups "
        "scored by their best two with one kept, renormalised and scaled by 2.5",
        bytes(v3.image), checksums=True, nan_check=True)
    e0, e1 = v3.plan.routing_offset, v3.plan.routing_offset + ff.ROUTING_ENTRY_SIZE
    add("routing_groups_divide.colibri", "COL_ERR_ROUTING", e0 + R_N_GROUPS,
        "n_groups 3 does not divide n_experts 4", "3 groups of 4 experts",
        edited(v3, lambda im: put(im, e0 + R_N_GROUPS, "<I", 3)))
    add("routing_groups_kept.colibri", "COL_ERR_ROUTING", e0 + R_GROUPS_KEPT,
        "n_groups_kept 0 not in 1..n_groups 2", "no group kept",
        edited(v3, lambda im: put(im, e0 + R_GROUPS_KEPT, "<I", 0)))

    def groups_too_small(im: bytearray) -> None:
        put(im, e0 + R_N_GROUPS, "<3I", 4, 1, ff.GROUP_MAX)
    add("routing_groups_hold_topk.colibri", "COL_ERR_ROUTING", e0 + R_GROUPS_KEPT,
        "1 kept groups of 1 experts cannot hold top_k 2", "top-2 from one kept group of one expert",
        edited(v3, groups_too_small))
    add("routing_scoring.colibri", "COL_ERR_UNSUPPORTED", e0 + R_SCORING, "unknown scoring 7",
        "a scoring function from the future", edited(v3, lambda im: put(im, e0 + R_SCORING, "<I", 7)))
    add("routing_scale.colibri", "COL_ERR_ROUTING", e0 + R_SCALE, "scale nan is not a finite "
        "value > 0", "a NaN routed scaling factor",
        edited(v3, lambda im: put(im, e0 + R_SCALE, "<f", float("nan"))))
    add("routing_bias_on_logits.colibri", "COL_ERR_ROUTING", e0 + R_CORRECTION,
        "the rule must select on scores", "a correction bias on a rule that selects on logits",
        edited(v3, lambda im: put(im, e0 + R_GROUP_SCORE - 0x10, "<I", ff.SELECT_LOGITS)))
    gate = v3.index["layers.0.moe_gate"]
    add("routing_bias_index.colibri", "COL_ERR_ROUTING", e0 + R_CORRECTION,
        "is 'layers.0.moe_gate', expected 'layers.0.moe_correction_bias'",
        "the correction bias index pointing at the router", edited(
            v3, lambda im: put(im, e0 + R_CORRECTION, "<I", gate)),
        tensor="layers.0.moe_correction_bias")
    bias = "layers.0.moe_correction_bias"

    def bias_length(im: bytearray) -> None:
        put(im, v3.entry(bias) + T_SHAPE, "<Q", 3)
        put(im, v3.entry(bias) + T_NBYTES, "<Q", 12)
    add("routing_bias_length.colibri", "COL_ERR_SHAPE", v3.entry(bias) + T_SHAPE,
        "shape [3], expected [4]", "a correction bias of 3 values for 4 experts",
        edited(v3, bias_length), tensor=bias)

    def bias_f16(im: bytearray) -> None:
        put(im, v3.entry(bias) + T_DTYPE, "<I", ff.DTYPE_F16)
        put(im, v3.entry(bias) + T_NBYTES, "<Q", 8)
    add("routing_bias_dtype.colibri", "COL_ERR_DTYPE", v3.entry(bias) + T_DTYPE, "must be f32",
        "a correction bias stored as f16", edited(v3, bias_f16), tensor=bias)
    add("routing_reserved.colibri", "COL_ERR_UNSUPPORTED", e0 + 0x7C, "reserved byte 0x7C",
        "a reserved byte of a routing entry set",
        edited(v3, lambda im: im.__setitem__(e0 + 0x7C, 1)))
    add("routing_sliding_no_window.colibri", "COL_ERR_ROUTING", e1 + R_ATTENTION,
        "sliding-window layer, but the header's sliding_window is 0",
        "a sliding-window layer in a file without a window",
        edited(v3, lambda im: put(im, e1 + R_ATTENTION, "<I", ff.LAYER_SLIDING)))
    add("routing_dense_rule.colibri", "COL_ERR_ROUTING", e1 + R_SCALE, "dense layer with scale",
        "a dense layer's entry with a scaling factor",
        edited(v3, lambda im: put(im, e1 + R_SCALE, "<f", 2.0)))

    # -- GPT-OSS's experts and attention (the GPT-OSS-style base: layer 0 MoE, sinks everywhere)
    go = build_base(gpt_oss=True)
    add("valid_gpt_oss.colibri", "COL_OK", 0, "", "a router bias, top-2 of the logits weighted by "
        "a softmax over the chosen, expert biases, the clamped SwiGLU and attention sinks",
        bytes(go.image), checksums=True, nan_check=True)
    g0, g1 = go.plan.routing_offset, go.plan.routing_offset + ff.ROUTING_ENTRY_SIZE
    add("routing_activation.colibri", "COL_ERR_UNSUPPORTED", g0 + R_ACTIVATION,
        "unknown activation 5", "an expert activation from the future",
        edited(go, lambda im: put(im, g0 + R_ACTIVATION, "<I", 5)))
    add("routing_act_limit.colibri", "COL_ERR_ROUTING", g0 + R_ACT_LIMIT,
        "act_limit -7 is not a finite value > 0", "a clamped SwiGLU with a negative limit",
        edited(go, lambda im: put(im, g0 + R_ACT_LIMIT, "<f", -7.0)))
    add("routing_dense_activation.colibri", "COL_ERR_ROUTING", g1 + R_ACTIVATION,
        "dense layer with activation", "a dense layer's entry with the experts' activation",
        edited(go, lambda im: put(im, g1 + R_ACTIVATION, "<I", ff.EXPERT_SWIGLU_CLAMPED)))
    add("routing_expert_bias_missing.colibri", "COL_ERR_MISSING_TENSOR", v3.plan.tensor_table_offset,
        "required tensor 'layers.0.moe_w1_bias' is missing", "expert biases the file does not hold",
        edited(v3, lambda im: put(im, e0 + R_EXPERT_BIAS, "<I", 1)), tensor="layers.0.moe_w1_bias")
    sinks = "layers.1.attn_sinks"

    def sinks_per_kv_head(im: bytearray) -> None:
        put(im, go.entry(sinks) + T_SHAPE, "<Q", 1)
        put(im, go.entry(sinks) + T_NBYTES, "<Q", 4)
    add("routing_sinks_shape.colibri", "COL_ERR_SHAPE", go.entry(sinks) + T_SHAPE,
        "shape [1], expected [2]", "one sink per KV head instead of one per query head",
        edited(go, sinks_per_kv_head), tensor=sinks)
    add("routing_sinks_unnamed.colibri", "COL_ERR_UNKNOWN_TENSOR", go.entry(sinks),
        "not used by this architecture", "attention sinks the routing entry does not name: a "
        "warning, the layer attends without them",
        edited(go, lambda im: put(im, g1 + R_SINKS, "<I", 0)), tensor=sinks, severity="warning")

    # -- Llama 4's routing and attention (the Llama-4-style base)
    l4 = build_base(llama4=True)
    add("valid_llama4.colibri", "COL_OK", 0, "", "the sigmoid of each chosen logit scaling that "
        "expert's input, a shared expert, chunked attention with the q/k L2 norm, a NoPE layer "
        "with a query temperature, llama3 RoPE", bytes(l4.image), checksums=True, nan_check=True)
    m0, m1 = l4.plan.routing_offset, l4.plan.routing_offset + ff.ROUTING_ENTRY_SIZE
    add("routing_chunked_no_size.colibri", "COL_ERR_ROUTING", m0 + R_ATTENTION,
        "header's attention_chunk_size is 0", "a chunked-attention layer without a chunk size",
        edited(l4, lambda im: put(im, H_CHUNK, "<I", 0)))
    add("v2_chunk_unused.colibri", "COL_ERR_HEADER", H_CHUNK, "attention_chunk_size 4 but no "
        "routing entry has a chunked-attention layer", "a chunk size no layer uses",
        edited(v3, lambda im: put(im, H_CHUNK, "<I", 4)))
    add("routing_temperature_scale.colibri", "COL_ERR_ROUTING", m0 + R_TEMP_SCALE,
        "temperature_scale 0.5 (finite with a temperature_floor, else 0)",
        "a query temperature's scale without its floor",
        edited(l4, lambda im: put(im, m0 + R_TEMP_SCALE, "<f", 0.5)))
    add("routing_dense_weight_inputs.colibri", "COL_ERR_ROUTING", m1 + R_WEIGHT_INPUTS,
        "dense layer with weight_inputs", "a dense layer's entry weighting expert inputs",
        edited(l4, lambda im: put(im, m1 + R_WEIGHT_INPUTS, "<I", 1)))
    add("v2_llama3_high_freq.colibri", "COL_ERR_HEADER", H_ROPE_HIGH,
        "rope_high_freq_factor 0 is not a finite value > 0",
        "llama3 RoPE without its high_freq_factor",
        edited(l4, lambda im: put(im, H_ROPE_HIGH, "<f", 0.0)))

    xb = build_base(extra_bias=True)
    add("routing_bias_unnamed.colibri", "COL_ERR_UNKNOWN_TENSOR", xb.entry(bias),
        "not used by this architecture", "a correction bias the routing entry does not name: "
        "a warning, the file stays valid (and routes without it)", bytes(xb.image), tensor=bias,
        severity="warning")

    e = build_base(extra=True)
    add("unknown_tensor.colibri", "COL_ERR_UNKNOWN_TENSOR", e.entry("extra.scale"),
        "not used by this architecture", "an extra tensor: a warning, the file stays valid",
        bytes(e.image), tensor="extra.scale", severity="warning")

    out.append(Entry("absent.colibri", "COL_ERR_IO", 0, "cannot open",
                     "no such file (the file is deliberately not in the corpus)", absent=True))
    return out


# ---------------------------------------------------------------------------------------------
# Writing and checking


def load_manifest() -> list[dict]:
    return json.loads((CORPUS / "manifest.json").read_text())


def write_manifests(entries: list[dict]) -> None:
    (CORPUS / "manifest.json").write_text(json.dumps(entries, indent=2) + "\n")
    lines = ["# file check_flags code offset  (generated by tools/make_corpus.py from manifest.json)"]
    for m in entries:
        flags = (CHECK_CHECKSUMS if m["checksums"] else 0) | (CHECK_NONFINITE if m["nan_check"] else 0)
        lines.append(f"{m['file']} {flags} {CODES.index(m['code'])} {m['offset']}")
    (CORPUS / "manifest.txt").write_text("\n".join(lines) + "\n")


def first_finding(problems: list) -> object | None:
    errors = [q for q in problems if q.severity == "error"]
    return errors[0] if errors else (problems[0] if problems else None)


def check(entries: list[dict]) -> list[str]:
    """Validate every manifest entry; return the differences (empty when all match)."""
    from colibri import errors, validate

    failures = []
    for m in entries:
        path = CORPUS / m["file"]
        if not m["absent"] and path.stat().st_size > MAX_FILE:
            failures.append(f"{m['file']}: larger than {MAX_FILE} bytes")
        try:
            problems = validate(path, checksums=m["checksums"], nan_check=m["nan_check"])
        except errors.ColibriError as exc:
            if exc.code_name != m["code"] or m["message"] not in exc.message:
                failures.append(f"{m['file']}: raised {exc}, expected {m['code']}")
            continue
        got = first_finding(problems)
        if m["code"] == "COL_OK":
            if problems:
                failures.append(f"{m['file']}: expected clean, got {problems[0]}")
            continue
        if got is None:
            failures.append(f"{m['file']}: no finding, expected {m['code']}")
        elif (got.code_name, got.offset, got.severity) != (m["code"], m["offset"], m["severity"]) \
                or m["message"] not in got.message or got.tensor != m["tensor"]:
            failures.append(f"{m['file']}: got {got} (tensor '{got.tensor}'), expected "
                            f"{m['severity']} {m['code']} at 0x{m['offset']:X} tensor "
                            f"'{m['tensor']}' containing {m['message']!r}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the committed corpus")
    args = parser.parse_args(argv)
    if not args.check:
        CORPUS.mkdir(parents=True, exist_ok=True)
        generated = corpus_entries()
        kept = [m for m in (load_manifest() if (CORPUS / "manifest.json").exists() else [])
                if m["file"].startswith("fuzz/")]
        for e in generated:
            if not e.absent:
                (CORPUS / e.file).write_bytes(e.data)
        write_manifests([e.manifest() for e in generated] + kept)
    failures = check(load_manifest())
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    print(f"{len(load_manifest())} corpus entries, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
