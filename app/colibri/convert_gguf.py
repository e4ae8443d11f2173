"""Importing GGUF files (llama.cpp) as `.colibri` files.

The GGUF file is validated first (`colibri.formats.gguf_file`); the architecture, hyper-parameters
and tensor names then map onto Colibri's (docs/formats.md, "GGUF import"):

| GGUF `general.architecture` | family | top-k weights renormalised (llama.cpp's graph) |
|---|---|---|
| llama (with `expert_count` > 0: Mixtral) | mixtral | yes |
| qwen2moe | qwen2_moe | no (`expert_weights_norm` when present) |
| qwen3moe | qwen3_moe | yes |
| olmoe | olmoe | no |
| gpt-oss | gpt_oss | (a softmax over the chosen logits) |
| llama4 | llama4 | (each chosen logit's sigmoid, on the expert's input) |
| phimoe | phimoe | sparsemixer (router_jitter_noise 0.01: the GGUF does not record it) |
| granitemoe | granitemoe, or granitemoeshared with `ffn_*_shexp` tensors | softmax over the chosen logits |
| dbrx | dbrx | 1-norm (moe_normalize_expert_weights 1: the GGUF does not record it) |
| deepseek2 | deepseek_v2 (softmax gating), deepseek_v3 (sigmoid) | the family's rule |
| glm4moe | glm4_moe | the family's rule |
| ernie4_5-moe | ernie4_5_moe | the family's rule (moe_norm_min 1e-12: not recorded) |

GPT-OSS and Llama 4 files state less than their graphs use: what llama.cpp's graph fixes for
them (GPT-OSS's swiglu alpha 1.702 and limit 7, sliding layers every second from layer 0;
Llama 4's chunks of 8192, a NoPE layer every fourth with the query temperature of floor 8192
and scale 0.1, the q/k L2 norm unless there are 128 experts) is what the import states.

The families of format version 2 get their routing rule (docs/format.md) from the family, with a
note in the metadata where the GGUF file does not record a parameter of it; llama.cpp itself
routes PhiMoE and DBRX by a softmax, top-k and a sum renormalisation. The architectures of
CONFIG_ARCHITECTURES are read through their family's transformers config: the GGUF keys become
the config.json fields, so the header and rules are what a Hugging Face conversion writes.
Multi-token-prediction layers after the last decoder layer (`nextn_predict_layers`) are left
out, and a tensor the import would not read is an error, not a silent omission.

llama.cpp's converter permutes the rows of q and k (weights and biases) for `llama` and
`granitemoe` files, because llama.cpp rotates interleaved pairs there while Hugging Face rotates
halves; the import undoes that permutation exactly (a reshuffle of whole rows, so it applies to
quantised rows too). The other architectures are stored unpermuted. DBRX's fused `attn_qkv` is
split into q, k and v rows; DeepSeek's attn_k_b / attn_v_b are Colibri's layout already (older
files' attn_kv_b is split per head here).

Storage: F32, F16 and BF16 tensors are kept as they are; Q8_0 and Q4_0 tensors are repacked
into Colibri's rows of the same blocks (scales first, docs/format.md), and by default further into
panels of 8 rows (`layout`, convert.layout_target), so every value is the one llama.cpp
computes; any other type (K-quants, IQ types, Q5_0, ...) is dequantised with the
`gguf` package and stored in `dtype`, with a note in the metadata. Norms, biases and the router
are f32 in every `.colibri` file, so F16/BF16 ones widen exactly. The tokenizer becomes the
file's tokenizer.json (`formats.gguf_tokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q

from colibri.convert import (
    CONVERTER_VERSION, ConversionError, apply_layout, apply_quantize, to_storage_checked,
)
from colibri.errors import ColibriFormatError, ColibriIOError
from colibri.families import architecture_from_config
from colibri.families.common import check_limits, mla_tensors
from colibri.fileformat import (
    ARCH_DBRX, ARCH_GPT_OSS, ARCH_GRANITEMOE, ARCH_GRANITEMOESHARED, ARCH_LLAMA4, ARCH_MIXTRAL,
    ARCH_OLMOE, ARCH_PHIMOE, ARCH_QWEN2_MOE, ARCH_QWEN3_MOE, ATTENTION_MLA, DTYPE_BF16,
    DTYPE_BY_NAME, DTYPE_F16, DTYPE_F32, DTYPE_Q4_0, DTYPE_Q8_0, EXPERT_SWIGLU_CLAMPED,
    FLAG_NORM_TOPK, FLAG_O_BIAS, FLAG_OUTPUT_BIAS, FLAG_QK_NORM_FULL, FLAG_QK_NORM_HEAD,
    FLAG_QKV_BIAS, FLAG_SHARED_EXPERT, FLAG_SHARED_EXPERT_GATE, FLAG_TIED_EMBEDDINGS,
    LAYER_CHUNKED, LAYER_DENSE, LAYER_FULL, LAYER_MOE, LAYER_SLIDING, NORM_KIND_LAYER,
    NORM_KIND_LAYER_BIAS, NORM_P, ROPE_INTERLEAVED, ROPE_LONGROPE, ROPE_YARN, SCORING_SIGMOID,
    SCORING_SPARSEMIXER, SELECT_LOGITS, SHARED_NONE, SHARED_PLAIN, LayerAttention, RouteRule,
    TensorSpec, plan_file, write_colibri,
)
from colibri.formats.gguf_file import GGUFFile
from colibri.formats.gguf_tokenizer import TokenizerError, tokenizer_json
from colibri.values import DEFAULT_LAYOUT, HParams

# general.architecture -> (family, Colibri arch code, renormalise top-k by default)
ARCHITECTURES: dict[str, tuple[str, int, bool]] = {
    "llama": ("mixtral", ARCH_MIXTRAL, True),
    "qwen2moe": ("qwen2_moe", ARCH_QWEN2_MOE, False),
    "qwen3moe": ("qwen3_moe", ARCH_QWEN3_MOE, True),
    "olmoe": ("olmoe", ARCH_OLMOE, False),
    "gpt-oss": ("gpt_oss", ARCH_GPT_OSS, False),
    "llama4": ("llama4", ARCH_LLAMA4, False),
    "phimoe": ("phimoe", ARCH_PHIMOE, False),
    "granitemoe": ("granitemoe", ARCH_GRANITEMOE, False),
    "dbrx": ("dbrx", ARCH_DBRX, False),
}
# general.architecture -> the transformers families its files are converted from. These are
# read through their family's config (colibri.families): the GGUF keys become the config.json
# fields the family reads, so the header, the routing rules and the attention come from the
# code a Hugging Face conversion runs. deepseek2 is DeepSeek-V2 or -V3 by its gating function.
CONFIG_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "deepseek2": ("deepseek_v2", "deepseek_v3"),
    "glm4moe": ("glm4_moe",),
    "ernie4_5-moe": ("ernie4_5_moe",),
}
SUPPORTED_ARCHITECTURES = (*ARCHITECTURES, *CONFIG_ARCHITECTURES)
# llama.cpp's expert_gating_func values (LLAMA_EXPERT_GATING_FUNC_TYPE_*)
GATING_SOFTMAX, GATING_SIGMOID = 1, 2
# ERNIE 4.5's moe_norm_min, which the GGUF files do not record: the transformers class default
# and the published models' value
ERNIE_MOE_NORM_MIN = 1e-12
# Architectures whose q/k rows llama.cpp's converter permutes (LlamaModel's undo_permute).
PERMUTED = ("llama", "granitemoe")
# PhiMoE's sparsemixer chooses two experts; its threshold and DBRX's p are the transformers class
# defaults (and the published models' values), which the GGUF files do not record.
PHIMOE_ROUTER_JITTER_NOISE = 0.01
DBRX_NORMALIZE_P = 1.0
# llama.cpp's graphs (src/models/openai-moe.cpp, llama4.cpp, llama-graph.cpp) fix these
GPT_OSS_SWIGLU = (1.702, 7.0)       # alpha, limit
LLAMA4_CHUNK = 8192                 # attention_chunk_size
LLAMA4_NOPE_STEP = 4                # every 4th layer without RoPE (n_no_rope_layer_step)
LLAMA4_TEMPERATURE = (8192, 0.1)    # floor, scale (n_attn_temp_floor_scale, f_attn_temp_scale)
_KEPT = {Q.F32: DTYPE_F32, Q.F16: DTYPE_F16, Q.BF16: DTYPE_BF16}
_REPACKED = {Q.Q8_0: DTYPE_Q8_0, Q.Q4_0: DTYPE_Q4_0}


def _open(path: str) -> GGUFFile:
    try:
        return GGUFFile.open(path)
    except ColibriFormatError as exc:
        errs = [p for p in exc.problems if p.severity == "error"] or []
        shown = "; ".join(f"{p.message} (at byte 0x{p.offset:X})" for p in errs[:5])
        raise ConversionError(f"{path}: not a valid GGUF file: {shown or exc.message}") from exc
    except ColibriIOError as exc:
        raise ConversionError(f"{path}: cannot read: {exc.message}") from exc


class _Meta:
    """Typed access to `<arch>.*` keys with the key's name in every error."""

    def __init__(self, f: GGUFFile, arch: str) -> None:
        self.f, self.arch = f, arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.f.get(f"{self.arch}.{key}", default)

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConversionError(f"{self.arch}.{key} = {value!r}, expected an integer >= "
                                  f"{minimum}")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                np.isfinite(value) and value > 0):
            raise ConversionError(f"{self.arch}.{key} = {value!r}, expected a finite number > 0")
        return float(value)


@dataclass
class _Arch:
    """What a GGUF file means: header fields, layer kinds, and each layer's
    routing rule (format version 2's families) and attention (GPT-OSS, Llama 4); None means what
    version 1's flags say (plan_file's default)."""

    hp: HParams
    kinds: list[int]
    family: str
    rules: list[RouteRule | None] | None = None
    attention: list[LayerAttention] | None = None


def _swa_pattern(m: _Meta, n_layers: int, default: int) -> list[bool]:
    """Which layers llama.cpp makes sliding or chunked (llama_model_base::load_swa_pattern):
    `attention.sliding_window_pattern` as a list of bools or a period n (the first n - 1 of
    every n layers), else `default` as the period."""
    pattern = m.get("attention.sliding_window_pattern", default)
    if isinstance(pattern, list):
        if len(pattern) != n_layers or not all(isinstance(p, bool) for p in pattern):
            raise ConversionError(f"{m.arch}.attention.sliding_window_pattern = {pattern!r}, "
                                  f"expected {n_layers} booleans")
        return list(pattern)
    n = m.int("attention.sliding_window_pattern", default, minimum=0)
    return [n == 0 or i % n < n - 1 for i in range(n_layers)]


def _on_moe_layers(kinds: list[int], rule: RouteRule) -> list[RouteRule | None]:
    return [rule if k == LAYER_MOE else None for k in kinds]


def _gpt_oss(m: _Meta, a: _Arch) -> _Arch:
    """GPT-OSS: every layer MoE with biases, the clamped SwiGLU and sinks; RoPE as halves."""
    hp = a.hp
    sliding = _swa_pattern(m, hp.n_layers, 2)
    if any(sliding) and not hp.sliding_window:
        raise ConversionError(f"{m.arch}.attention.sliding_window is missing or 0")
    if not any(sliding):
        hp = replace(hp, sliding_window=0)
    rule = RouteRule(select_on=SELECT_LOGITS, gate_bias=True, expert_bias=True,
                     activation=EXPERT_SWIGLU_CLAMPED, act_alpha=GPT_OSS_SWIGLU[0],
                     act_limit=GPT_OSS_SWIGLU[1])
    return _Arch(hp, a.kinds, a.family, _on_moe_layers(a.kinds, rule),
                 [LayerAttention(LAYER_SLIDING if s else LAYER_FULL, sinks=True)
                  for s in sliding])


def _llama4(m: _Meta, a: _Arch) -> _Arch:
    """Llama 4 as llama.cpp's graph runs it: chunked layers by the sliding-window pattern (3 of
    4), every fourth layer without RoPE and with the query temperature, the q/k L2 norm on the
    RoPE layers unless the model has 128 experts; sigmoid weights on the experts' inputs and a
    shared expert; RoPE on interleaved pairs."""
    hp = a.hp
    if m.get("attention.sliding_window") == 0:
        raise ConversionError(f"{m.arch}.attention.sliding_window = 0: a Llama 4 file without "
                              "chunked attention (MobileLLM-style) is not supported")
    chunked = _swa_pattern(m, hp.n_layers, 4)
    nope = [(i + 1) % LLAMA4_NOPE_STEP == 0 for i in range(hp.n_layers)]
    qk_norm = hp.n_experts != 128
    floor, scale = LLAMA4_TEMPERATURE
    hp = replace(hp, rope_layout=ROPE_INTERLEAVED, d_ff_shared=hp.d_ff_expert,
                 attention_chunk_size=LLAMA4_CHUNK if any(chunked) else 0)
    rule = RouteRule(scoring=SCORING_SIGMOID, select_on=SELECT_LOGITS, shared=SHARED_PLAIN,
                     weight_inputs=True)
    return _Arch(hp, a.kinds, a.family, _on_moe_layers(a.kinds, rule),
                 [LayerAttention(LAYER_CHUNKED if c else LAYER_FULL, no_rope=n,
                                 qk_l2_norm=qk_norm and not n,
                                 temperature_floor=floor if n else 0,
                                 temperature_scale=scale if n else 0.0)
                  for c, n in zip(chunked, nope)])


def _hparams(f: GGUFFile, notes: list[str]) -> _Arch:
    """What the file means: its family's config for CONFIG_ARCHITECTURES, else the GGUF keys
    read here and completed by _family."""
    arch = f.architecture
    if arch in CONFIG_ARCHITECTURES:
        return _config_hparams(f, notes)
    if arch not in ARCHITECTURES:
        raise ConversionError(f"{f.path}: architecture {arch!r} not supported (supported: "
                              f"{', '.join(SUPPORTED_ARCHITECTURES)})")
    family, code, norm_default = ARCHITECTURES[arch]
    m = _Meta(f, arch)
    n_experts = m.int("expert_count", 0, minimum=0)
    if n_experts == 0:
        raise ConversionError(f"{f.path}: a dense {arch} model (no {arch}.expert_count); "
                              "Colibri runs Mixture-of-Experts models")
    n_layers = m.int("block_count")
    if n_layers > 1024:
        raise ConversionError(f"{arch}.block_count = {n_layers} outside 1..1024")
    d_model = m.int("embedding_length")
    n_heads = m.int("attention.head_count")
    n_kv = m.int("attention.head_count_kv", n_heads)
    head_dim = m.int("attention.key_length", d_model // n_heads)
    if m.int("attention.value_length", head_dim) != head_dim:
        raise ConversionError(f"{arch}.attention.value_length differs from key_length")
    rope_dim = m.int("rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ConversionError(f"{arch}.rope.dimension_count {rope_dim} != head_dim {head_dim}: "
                              "partial rotary embeddings are not supported")
    if n_heads % n_kv:
        raise ConversionError(f"{arch}.attention.head_count_kv {n_kv} does not divide "
                              f"head_count {n_heads}")
    top_k = m.int("expert_used_count")
    if top_k > n_experts:
        raise ConversionError(f"{arch}.expert_used_count {top_k} > {n_experts} experts")

    kinds = [LAYER_MOE if f"blk.{i}.ffn_gate_inp.weight" in f else LAYER_DENSE
             for i in range(n_layers)]
    if arch in ("qwen2moe", "qwen3moe", "gpt-oss", "llama4"):
        d_ff_expert = m.int("expert_feed_forward_length")
    else:
        d_ff_expert = m.int("feed_forward_length")
    d_ff_dense = m.int("feed_forward_length") if LAYER_DENSE in kinds else 0
    flags = 0
    norm = m.get("expert_weights_norm", norm_default)
    if norm:
        flags |= FLAG_NORM_TOPK
    if "output.weight" not in f:
        flags |= FLAG_TIED_EMBEDDINGS
    if "output.bias" in f:
        flags |= FLAG_OUTPUT_BIAS
    d_ff_shared = 0
    if arch == "granitemoe" and "blk.0.ffn_gate_shexp.weight" in f:
        family, code = "granitemoeshared", ARCH_GRANITEMOESHARED
        d_ff_shared = m.int("expert_shared_feed_forward_length")
        flags |= FLAG_SHARED_EXPERT
    if arch == "qwen2moe" and "blk.0.ffn_gate_shexp.weight" in f:
        d_ff_shared = m.int("expert_shared_feed_forward_length")
        flags |= FLAG_SHARED_EXPERT
        if "blk.0.ffn_gate_inp_shexp.weight" in f:
            flags |= FLAG_SHARED_EXPERT_GATE
    if "blk.0.attn_q.bias" in f:
        flags |= FLAG_QKV_BIAS
    if "blk.0.attn_output.bias" in f:
        flags |= FLAG_O_BIAS
    if arch == "qwen3moe":
        flags |= FLAG_QK_NORM_HEAD
    if arch == "olmoe":
        flags |= FLAG_QK_NORM_FULL
    clip = m.get("attention.clamp_kqv")
    clip_qkv = m.number("attention.clamp_kqv") if clip is not None else 0.0

    rope_type, rope_factor = 0, 1.0
    yarn: dict[str, Any] = {}
    if arch != "phimoe" and ("rope_factors_long.weight" in f or "rope_factors_short.weight" in f):
        raise ConversionError(f"{f.path}: LongRoPE frequency factors (rope_factors_long/short) "
                              f"in a {arch} file; Colibri runs them for PhiMoE only")
    scaling = m.get("rope.scaling.type", "none")
    if scaling == "linear":
        rope_type, rope_factor = 1, m.number("rope.scaling.factor")
    elif scaling == "yarn" and arch == "gpt-oss":
        # transformers' GPT-OSS does not floor/ceil the correction range (ggml does)
        params = _yarn_parameters(m, notes)
        rope_type, rope_factor = ROPE_YARN, params["factor"]
        yarn = dict(rope_original_max_context=params["original_max_position_embeddings"],
                    rope_beta_fast=params.get("beta_fast", 32.0),
                    rope_beta_slow=params.get("beta_slow", 1.0),
                    rope_truncate=0,
                    rope_attn_factor=params.get("attention_factor",
                                                0.1 * float(np.log(rope_factor)) + 1.0))
    elif scaling not in ("none", None):
        raise ConversionError(f"{arch}.rope.scaling.type {scaling!r} not supported "
                              "(supported: none, linear; yarn for gpt-oss)")
    if "rope_freqs.weight" in f or "blk.0.rope_freqs.weight" in f:
        raise ConversionError(f"{f.path}: per-frequency RoPE factors (rope_freqs, llama3-style "
                              "scaling) are not imported; convert the Hugging Face checkpoint")
    window = m.get("attention.sliding_window", 0) or 0
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ConversionError(f"{arch}.attention.sliding_window = {window!r}")
    vocab = m.get("vocab_size")
    if vocab is None:
        embd = f.tensor_info("token_embd.weight") if "token_embd.weight" in f else None
        if embd is None:
            raise ConversionError(f"{f.path}: no token_embd.weight")
        vocab = embd.shape[0]
    hp = HParams(
        arch=code, n_layers=n_layers, n_experts=n_experts, n_experts_active=top_k,
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, vocab_size=vocab,
        max_context=m.int("context_length"), d_ff_expert=d_ff_expert, d_ff_dense=d_ff_dense,
        d_ff_shared=d_ff_shared, flags=flags, sliding_window=window, rope_type=rope_type,
        rope_theta=m.number("rope.freq_base", 10000.0), rope_factor=rope_factor,
        norm_eps=m.number("attention.layer_norm_epsilon" if arch == "dbrx"
                          else "attention.layer_norm_rms_epsilon"), clip_qkv=clip_qkv,
        bos_token_id=_token_id(f, "bos", vocab, notes),
        eos_token_id=_token_id(f, "eos", vocab, notes), **yarn)
    a = _family(f, m, _Arch(hp, kinds, family), notes)
    try:
        check_limits(a.hp)
    except ConversionError as exc:
        raise ConversionError(f"{f.path}: {exc}") from exc
    return a


def _family(f: GGUFFile, m: _Meta, a: _Arch, notes: list[str]) -> _Arch:
    """The header fields, routing rules and attention of a format-version-2 family (rules None:
    version 1's rule, from the header flags, for the first four)."""
    arch, hp = f.architecture, a.hp
    if arch == "gpt-oss":
        return _gpt_oss(m, a)
    if arch == "llama4":
        return _llama4(m, a)
    if arch == "phimoe":
        if hp.n_experts_active != 2:
            notes.append(f"phimoe.expert_used_count {hp.n_experts_active}: PhiMoE's sparsemixer "
                         "routes every token to 2 experts; stored as 2")
        notes.append(f"router_jitter_noise (sparsemixer's threshold) is not in the GGUF file: "
                     f"{PHIMOE_ROUTER_JITTER_NOISE}, transformers' default and Phi-3.5-MoE's")
        norm_kind = NORM_KIND_LAYER_BIAS if "blk.0.attn_norm.bias" in f else NORM_KIND_LAYER
        hp = replace(_longrope(f, m, hp, notes), n_experts_active=2, norm_kind=norm_kind)
        return replace(a, hp=hp, rules=_on_moe_layers(a.kinds, RouteRule(
            scoring=SCORING_SPARSEMIXER, select_on=SELECT_LOGITS,
            sparsemixer_eps=PHIMOE_ROUTER_JITTER_NOISE)))
    if arch == "granitemoe":
        hp = replace(hp, attn_scale=m.number("attention.scale"),
                     embedding_scale=m.number("embedding_scale"),
                     residual_scale=m.number("residual_scale"),
                     logit_divisor=m.number("logit_scale"))
        return replace(a, hp=hp, rules=_on_moe_layers(a.kinds, RouteRule(
            select_on=SELECT_LOGITS, shared=SHARED_PLAIN if hp.d_ff_shared else SHARED_NONE)))
    if arch == "dbrx":
        notes.append(f"moe_normalize_expert_weights (the p of the top-k weights' p-norm) is not "
                     f"in the GGUF file: {DBRX_NORMALIZE_P:g}, transformers' default and DBRX's")
        rule = RouteRule(normalize=NORM_P, norm_p=DBRX_NORMALIZE_P)
        return replace(a, hp=replace(hp, norm_kind=NORM_KIND_LAYER),
                       rules=_on_moe_layers(a.kinds, rule))
    return a


def _longrope(f: GGUFFile, m: _Meta, hp: HParams, notes: list[str]) -> HParams:
    """PhiMoE's LongRoPE as llama.cpp runs it up to the original context: the short factors and
    cos, sin times `rope.scaling.attn_factor`. Beyond `rope.scaling.original_context_length`
    llama.cpp takes the long factors instead, so when they differ the context stops there."""
    if "rope_factors_short.weight" not in f:
        if "rope_factors_long.weight" in f:
            raise ConversionError(f"{f.path}: rope_factors_long.weight without "
                                  "rope_factors_short.weight")
        return hp
    short = f.tensor_f32("rope_factors_short.weight")
    if not (np.isfinite(short) & (short > 0)).all():
        raise ConversionError(f"{f.path}: tensor 'rope_factors_short.weight' holds a factor that "
                              "is not a finite number > 0")
    attn = m.number("rope.scaling.attn_factor", 1.0)
    notes.append(f"LongRoPE: cos and sin times phimoe.rope.scaling.attn_factor {attn:g}, as "
                 "llama.cpp runs the file; transformers multiplies by the config's short_mscale, "
                 "which the GGUF file does not record")
    context = hp.max_context
    if "rope_factors_long.weight" in f:
        original = m.int("rope.scaling.original_context_length")
        long = f.tensor_f32("rope_factors_long.weight")
        if context > original and (short.shape != long.shape or not np.array_equal(short, long)):
            notes.append(f"LongRoPE: llama.cpp uses the long factors past "
                         f"phimoe.rope.scaling.original_context_length {original}; the short "
                         f"ones are imported, so the context is {original}")
            context = original
    return replace(hp, rope_type=ROPE_LONGROPE, rope_attn_factor=attn, max_context=context)


# ---------------------------------------------------------------------------------------------
# Families read through their transformers config


def _config_hparams(f: GGUFFile, notes: list[str]) -> _Arch:
    arch = f.architecture
    m = _Meta(f, arch)
    n_nextn = m.int("nextn_predict_layers", 0, minimum=0)
    n_blocks = m.int("block_count")
    if not 0 < n_blocks - n_nextn <= 1024:
        raise ConversionError(f"{arch}.block_count = {n_blocks} with {n_nextn} next-token "
                              "prediction layers: outside 1..1024 decoder layers")
    n_layers = n_blocks - n_nextn
    if n_nextn:
        notes.append(f"{n_nextn} multi-token-prediction layer(s) (blk.{n_layers}"
                     f"{'' if n_nextn == 1 else f'..{n_blocks - 1}'}) not imported: "
                     "transformers does not run them either")
    kinds = [LAYER_MOE if f"blk.{i}.ffn_gate_inp.weight" in f else LAYER_DENSE
             for i in range(n_layers)]
    if LAYER_MOE not in kinds:
        raise ConversionError(f"{f.path}: no layer has a router (blk.N.ffn_gate_inp); "
                              "Colibri runs Mixture-of-Experts models")
    vocab = m.get("vocab_size")
    if vocab is None:
        if "token_embd.weight" not in f:
            raise ConversionError(f"{f.path}: no token_embd.weight")
        vocab = f.tensor_info("token_embd.weight").shape[0]
    n_experts = m.int("expert_count")
    config: dict[str, Any] = {
        "num_hidden_layers": n_layers, "hidden_size": m.int("embedding_length"),
        "num_attention_heads": m.int("attention.head_count"), "vocab_size": vocab,
        "max_position_embeddings": m.int("context_length"),
        "rms_norm_eps": m.number("attention.layer_norm_rms_epsilon"),
        "tie_word_embeddings": "output.weight" not in f, "hidden_act": "silu",
        "bos_token_id": None, "eos_token_id": None,
    }
    read = {"deepseek2": _deepseek2_config, "glm4moe": _glm4moe_config,
            "ernie4_5-moe": _ernie_config}[arch]
    config.update(read(f, m, n_experts, kinds, notes))
    try:
        a = architecture_from_config(config)
    except ConversionError as exc:
        text = str(exc).removeprefix("config.json: ")
        raise ConversionError(f"{f.path}: {text} (the {arch}.* keys read as a "
                              f"{config['model_type']} config)") from exc
    if a.kinds != kinds:
        dense = [i for i, k in enumerate(kinds) if k == LAYER_DENSE]
        raise ConversionError(f"{f.path}: the layers with a router (dense: {dense}) are not "
                              f"those the {arch}.* keys describe")
    notes.extend(a.notes)
    hp = replace(a.hp, bos_token_id=_token_id(f, "bos", vocab, notes),
                 eos_token_id=_token_id(f, "eos", vocab, notes))
    return _Arch(hp, kinds, config["model_type"], a.rules, a.attention)


def _gating(f: GGUFFile, m: _Meta) -> int | None:
    gating = m.get("expert_gating_func")
    if gating not in (None, GATING_SOFTMAX, GATING_SIGMOID):
        raise ConversionError(f"{f.architecture}.expert_gating_func = {gating!r} not supported "
                              f"(supported: {GATING_SOFTMAX} softmax, {GATING_SIGMOID} sigmoid)")
    return gating


def _routing_config(m: _Meta) -> dict[str, Any]:
    """The DeepSeek-V3 router's fields (GLM-4.5's too); llama.cpp reads a missing key as 1
    group, no renormalisation, no scale."""
    scale = m.get("expert_weights_scale")
    return {"n_group": m.int("expert_group_count", 1),
            "topk_group": m.int("expert_group_used_count", 1),
            "norm_topk_prob": bool(m.get("expert_weights_norm", False)),
            "routed_scaling_factor": 1.0 if scale in (None, 0) else
            m.number("expert_weights_scale")}


def _yarn_parameters(m: _Meta, notes: list[str]) -> dict[str, Any]:
    """The one reader of the YaRN keys `rope.scaling.*`, as transformers' rope_parameters:
    factor and original context always, beta_fast, beta_slow and attention_factor (llama.cpp's
    converters write it as yarn_attn_factor; attn_factor is LongRoPE's) where the file has them,
    mscale from yarn_log_multiplier; an extrapolation factor other than 1 is refused."""
    params: dict[str, Any] = {
        "rope_type": "yarn", "factor": m.number("rope.scaling.factor"),
        "original_max_position_embeddings": m.int("rope.scaling.original_context_length")}
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                      ("yarn_attn_factor", "attention_factor")):
        if m.get(f"rope.scaling.{key}") is not None:
            params[name] = m.number(f"rope.scaling.{key}")
    ext = m.get("rope.scaling.yarn_ext_factor")
    if ext is not None and ext != 1.0:
        raise ConversionError(f"{m.arch}.rope.scaling.yarn_ext_factor = {ext!r}: "
                              "transformers' YaRN has no extrapolation factor (1.0)")
    log_mul = m.get("rope.scaling.yarn_log_multiplier")
    if log_mul is not None:
        # 0.1 * mscale_all_dim (llama.cpp's DeepSeek converter), divided back as llama.cpp
        # does; mscale itself is not written: equal to it in every published model
        mscale = float(np.float32(m.number("rope.scaling.yarn_log_multiplier"))
                       / np.float32(0.1))
        params.update(mscale=mscale, mscale_all_dim=mscale)
        notes.append(f"YaRN mscale is not in the GGUF file: taken equal to mscale_all_dim "
                     f"({mscale:g}, from rope.scaling.yarn_log_multiplier), as in the "
                     "published DeepSeek models and as llama.cpp computes")
    return params


def _rope_parameters(m: _Meta, notes: list[str], yarn: bool = False) -> dict[str, Any]:
    """rope_parameters from `rope.freq_base` and `rope.scaling.*` (YaRN where `yarn`: the only
    family whose YaRN files are tested, DeepSeek's)."""
    params: dict[str, Any] = {"rope_type": "default",
                              "rope_theta": m.number("rope.freq_base", 10000.0)}
    scaling = m.get("rope.scaling.type", "none")
    if scaling == "linear":
        params.update(rope_type="linear", factor=m.number("rope.scaling.factor"))
    elif scaling == "yarn" and yarn:
        params.update(_yarn_parameters(m, notes))
    elif scaling not in ("none", None):
        raise ConversionError(f"{m.arch}.rope.scaling.type {scaling!r} not supported "
                              f"(supported: none, linear{', yarn' if yarn else ''})")
    return params


def _deepseek2_config(f: GGUFFile, m: _Meta, n_experts: int, kinds: list[int],
                      notes: list[str]) -> dict[str, Any]:
    """DeepSeek-V2 (softmax gating) or -V3 (sigmoid gating, exp_probs_b). llama.cpp's converter
    writes the latent attention as MQA over [kv_lora_rank + rope] keys; the per-head sizes are
    key_length_mla / value_length_mla (files before them: key_length / value_length)."""
    gating = _gating(f, m)
    has_bias = any(t.name.endswith(".exp_probs_b.bias") for t in f.tensors)
    if gating is None and has_bias:
        raise ConversionError(f"{f.path}: deepseek2.expert_gating_func is not set (llama.cpp "
                              "then routes by a softmax, DeepSeek-V2's rule) but the file has "
                              "exp_probs_b tensors (DeepSeek-V3's correction bias): which "
                              "scoring the model was trained with cannot be told")
    v3 = gating == GATING_SIGMOID
    if not v3 and has_bias:
        raise ConversionError(f"{f.path}: softmax gating with exp_probs_b correction biases is "
                              "neither DeepSeek-V2 (no bias) nor DeepSeek-V3 (sigmoid)")
    rope_dim = m.int("rope.dimension_count")
    mla = m.get("attention.key_length_mla") is not None
    k_len = m.int("attention.key_length_mla" if mla else "attention.key_length")
    v_len = m.int("attention.value_length_mla" if mla else "attention.value_length")
    if k_len <= rope_dim:
        raise ConversionError(f"deepseek2.attention.key_length{'_mla' if mla else ''} = "
                              f"{k_len} leaves no non-rotary part (rope.dimension_count "
                              f"{rope_dim})")
    q_lora = m.int("attention.q_lora_rank") if m.get("attention.q_lora_rank") else None
    eps = m.number("attention.layer_norm_rms_epsilon")
    if eps != np.float32(1e-6):
        notes.append(f"the latent RMSNorms (attn_q_a_norm, attn_kv_a_norm) use 1e-6 as in "
                     f"transformers; llama.cpp uses the file's epsilon {eps:g} for them too")
    config: dict[str, Any] = {
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        "num_key_value_heads": m.int("attention.head_count"),  # MLA: every head
        "intermediate_size": m.int("feed_forward_length", m.get("expert_feed_forward_length")),
        "moe_intermediate_size": m.int("expert_feed_forward_length"),
        "n_routed_experts": n_experts, "num_experts_per_tok": m.int("expert_used_count"),
        "n_shared_experts": m.int("expert_shared_count", 0, minimum=0),
        "first_k_dense_replace": m.int("leading_dense_block_count", 0, minimum=0),
        "kv_lora_rank": m.int("attention.kv_lora_rank"), "q_lora_rank": q_lora,
        "qk_nope_head_dim": k_len - rope_dim, "qk_rope_head_dim": rope_dim, "v_head_dim": v_len,
        "attention_bias": "blk.0.attn_kv_a_mqa.bias" in f,
        "rope_parameters": _rope_parameters(m, notes, yarn=True),
    }
    routing = _routing_config(m)
    if v3:
        # llama.cpp rotates DeepSeek's rope dims in adjacent pairs, rope_interleave's rotation
        return dict(config, **routing, rope_interleave=True)
    if routing["norm_topk_prob"]:
        notes.append("deepseek2.expert_weights_norm is true: llama.cpp renormalises the top-k "
                     "weights, transformers' DeepSeek-V2 (this import) does not")
    grouped = routing["n_group"] > 1
    if grouped:
        notes.append("DeepSeek-V2's topk_method is not in the GGUF file: the expert groups "
                     f"({routing['n_group']}, {routing['topk_group']} kept) mean "
                     "group_limited_greedy, groups scored by their best expert, as published "
                     "DeepSeek-V2 and V2.5 route (llama.cpp scores them by their best two)")
    return dict(config, routed_scaling_factor=routing["routed_scaling_factor"],
                topk_method="group_limited_greedy" if grouped else "greedy",
                **({"n_group": routing["n_group"], "topk_group": routing["topk_group"]}
                   if grouped else {}))


def _gqa_config(f: GGUFFile, m: _Meta) -> dict[str, Any]:
    n_heads = m.int("attention.head_count")
    head_dim = m.int("attention.key_length", m.int("embedding_length") // n_heads)
    if m.int("attention.value_length", head_dim) != head_dim:
        raise ConversionError(f"{m.arch}.attention.value_length differs from key_length")
    return {"num_key_value_heads": m.int("attention.head_count_kv", n_heads),
            "head_dim": head_dim, "intermediate_size": m.int("feed_forward_length"),
            "moe_intermediate_size": m.int("expert_feed_forward_length")}


def _glm4moe_config(f: GGUFFile, m: _Meta, n_experts: int, kinds: list[int],
                    notes: list[str]) -> dict[str, Any]:
    """GLM-4.5: RoPE on the first rope.dimension_count dims of each head, halves paired (llama.cpp
    rotates them NeoX-style, unpermuted); sigmoid routing as DeepSeek-V3's."""
    if _gating(f, m) == GATING_SOFTMAX:
        raise ConversionError("glm4moe.expert_gating_func = 1 (softmax): GLM-4.5 routes by a "
                              "sigmoid")
    config = _gqa_config(f, m)
    head_dim = config["head_dim"]
    rotary = m.int("rope.dimension_count", head_dim // 2)
    partial = rotary / head_dim
    if rotary > head_dim or int(head_dim * partial) != rotary:
        raise ConversionError(f"glm4moe.rope.dimension_count = {rotary} is not a fraction of "
                              f"head_dim {head_dim}")
    return dict(config, model_type="glm4_moe", n_routed_experts=n_experts,
                num_experts_per_tok=m.int("expert_used_count"),
                n_shared_experts=m.int("expert_shared_count", 0, minimum=0),
                first_k_dense_replace=m.int("leading_dense_block_count", 0, minimum=0),
                use_qk_norm="blk.0.attn_q_norm.weight" in f,
                attention_bias="blk.0.attn_q.bias" in f, **_routing_config(m),
                rope_parameters=dict(_rope_parameters(m, notes), partial_rotary_factor=partial))


def _ernie_config(f: GGUFFile, m: _Meta, n_experts: int, kinds: list[int],
                  notes: list[str]) -> dict[str, Any]:
    """ERNIE 4.5: full interleaved RoPE (llama.cpp rotates adjacent pairs, unpermuted); the MoE
    layers are those with a router (llama.cpp writes the first and the interval, not the
    last); the shared experts moe_num_shared_experts x moe_intermediate_size wide."""
    config = _gqa_config(f, m)
    rotary = m.int("rope.dimension_count", config["head_dim"])
    if rotary != config["head_dim"]:
        raise ConversionError(f"ernie4_5-moe.rope.dimension_count {rotary} != head_dim "
                              f"{config['head_dim']}: ERNIE 4.5 rotates every dimension")
    n_shared = m.int("expert_shared_count", 0, minimum=0)
    width = m.get("expert_shared_feed_forward_length")
    if n_shared and width is not None and width != n_shared * config["moe_intermediate_size"]:
        notes.append(f"ernie4_5-moe.expert_shared_feed_forward_length {width} is not "
                     f"expert_shared_count x expert_feed_forward_length "
                     f"({n_shared * config['moe_intermediate_size']}), transformers' width "
                     "of the shared experts (llama.cpp's converter writes intermediate_size / "
                     "num_key_value_heads there)")
    notes.append(f"moe_norm_min (the floor of the top-k weights' sum) is not in the GGUF file: "
                 f"{ERNIE_MOE_NORM_MIN:g}, transformers' default and ERNIE 4.5's")
    moe = [i for i, k in enumerate(kinds) if k == LAYER_MOE]
    return dict(config, model_type="ernie4_5_moe", moe_num_experts=n_experts,
                moe_k=m.int("expert_used_count"), moe_num_shared_experts=n_shared,
                moe_layer_start_index=m.int("leading_dense_block_count", 0, minimum=0),
                moe_layer_end_index=moe[-1],
                moe_layer_interval=m.int("interleave_moe_layer_step", 1),
                moe_norm_min=ERNIE_MOE_NORM_MIN, use_bias="blk.0.attn_q.bias" in f,
                rope_parameters=_rope_parameters(m, notes))


def _token_id(f: GGUFFile, which: str, vocab: int, notes: list[str]) -> int:
    value = f.get(f"tokenizer.ggml.{which}_token_id")
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        notes.append(f"tokenizer.ggml.{which}_token_id {value!r} is outside the vocabulary "
                     f"({vocab}); stored as -1")
        return -1
    return value


# ---------------------------------------------------------------------------------------------
# Tensors


def _unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: it reshaped [n_head, 2, d/2, ...] rows to
    [n_head, d/2, 2, ...]; the inverse swaps the two axes back (rows may be raw block bytes)."""
    shape = rows.shape
    return (rows.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def repack_blocks(rows: np.ndarray, block_bytes: int) -> np.ndarray:
    """GGUF's interleaved blocks ([f16 d][payload] per block) -> Colibri's rows: every scale of
    the row first, then every payload, in block order (docs/format.md, "Quantised rows")."""
    n_rows, row_bytes = rows.shape
    blocks = rows.reshape(n_rows, row_bytes // block_bytes, block_bytes)
    return np.concatenate([blocks[:, :, :2].reshape(n_rows, -1),
                           blocks[:, :, 2:].reshape(n_rows, -1)], axis=1)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape without its 1s: llama-quantize writes the [1, H] shared-expert gate as [H]."""
    return tuple(d for d in shape if d != 1)


# the index of part of a tensor: rows of a fused matrix, or a per-head slice
Rows = slice | tuple[slice, ...]


class _Importer:
    def __init__(self, f: GGUFFile, hp: HParams, dtype: int, permute: bool) -> None:
        self.f, self.hp, self.dtype, self.permute = f, hp, dtype, permute
        self.specs: list[TensorSpec] = []
        self.problems: list[str] = []
        self.dequantised: dict[str, list[str]] = {}
        self.used: set[str] = set()

    def add(self, name: str, gguf_name: str, shape: tuple[int, ...], force_f32: bool = False,
            heads: int = 0, rows: Rows | None = None, source_shape: tuple[int, ...] = (),
            view: tuple[int, ...] = (), transpose: bool = False) -> None:
        """`name` of `shape` from `gguf_name`, or from its part `rows` of a tensor of
        `source_shape` (a fused tensor: DBRX's attn_qkv, a legacy DeepSeek attn_kv_b) seen as
        `view` (whole rows regrouped), the last two axes swapped when `transpose`."""
        f = self.f
        if gguf_name not in f:
            self.problems.append(f"missing tensor '{gguf_name}' (for {name})")
            return
        self.used.add(gguf_name)
        t = f.tensor_info(gguf_name)
        whole = source_shape or shape
        if t.shape != whole and _squeezed(t.shape) != _squeezed(whole):
            self.problems.append(f"tensor '{gguf_name}' has shape {list(t.shape)}, expected "
                                 f"{list(whole)} (for {name})")
            return
        qtype = f.ggml_type(gguf_name)
        unpermute = heads if self.permute else 0
        must_f32 = force_f32 or len(shape) == 1
        if must_f32:
            out = DTYPE_F32
        elif qtype in _KEPT:
            out = _KEPT[qtype]
        elif qtype in _REPACKED and not transpose:  # a transposed block is no block
            out = _REPACKED[qtype]
        else:
            out = self.dtype
            self.dequantised.setdefault(qtype.name, []).append(gguf_name)
        self.specs.append(TensorSpec(name, out, shape, self._loader(
            name, gguf_name, view or whole, qtype, out, unpermute, rows or slice(None),
            transpose)))

    def _loader(self, name: str, gguf_name: str, whole: tuple[int, ...], qtype: Q, out: int,
                heads: int, rows: Rows, transpose: bool) -> Callable[[], np.ndarray]:
        """Loads `rows` of the tensor `gguf_name` seen as `whole` (whole rows, so quantised
        rows keep their blocks)."""
        f = self.f

        def part(data: np.ndarray) -> np.ndarray:
            data = data[rows]
            return np.ascontiguousarray(data.swapaxes(-1, -2) if transpose else data)

        def load() -> np.ndarray:
            if out in (DTYPE_Q8_0, DTYPE_Q4_0) and qtype in _REPACKED:
                raw = np.asarray(f.raw(gguf_name)).reshape(-1, f.tensor_info(gguf_name).row_bytes)
                if heads:
                    raw = _unpermute(raw, heads)
                block = 34 if qtype == Q.Q8_0 else 18
                raw = raw.reshape(*whole[:-1], -1)[rows]
                return repack_blocks(raw.reshape(-1, raw.shape[-1]), block).reshape(raw.shape)
            if out != DTYPE_F32 and qtype in _KEPT and _KEPT[qtype] == out:
                data = np.array(f.tensor(gguf_name)).reshape(whole)  # bits as stored
                return part(_unpermute(data, heads) if heads else data)
            values = f.tensor_f32(gguf_name).reshape(whole)
            if heads:
                values = _unpermute(values, heads)
            return to_storage_checked(part(values), out, name)
        return load

    def unused(self, n_layers: int) -> list[str]:
        """The file's tensors no Colibri tensor was taken from, but for the next-token
        prediction layers after the last decoder layer (blk.N for N >= n_layers)."""
        def nextn(name: str) -> bool:
            parts = name.split(".")
            return parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) >= n_layers
        return [t.name for t in self.f.tensors if t.name not in self.used and not nextn(t.name)]


def _mla_attention(imp: _Importer, hp: HParams, src: str, dst: str) -> None:
    """DeepSeek's latent attention, the tensors of `mla_tensors`. llama.cpp's converter splits
    kv_b_proj per head into attn_k_b [nh, c, nope] (the key half, transposed) and attn_v_b
    [nh, vd, c], Colibri's own layout; files made before that split hold kv_b_proj itself as
    attn_kv_b, split here."""
    nh, c, nope, vd = hp.n_heads, hp.kv_lora_rank, hp.qk_nope_head_dim, hp.v_head_dim or 0
    for ours, _, theirs, shape in mla_tensors(hp):
        if ours != "attn_kv_b":
            imp.add(f"{dst}.{ours}", f"{src}.{theirs}", shape)
        elif f"{src}.attn_kv_b.weight" in imp.f and f"{src}.attn_k_b.weight" not in imp.f:
            per_head = (nh, nope + vd, c)
            imp.add(f"{dst}.attn_k_b", f"{src}.{theirs}", (nh, c, nope),
                    rows=(slice(None), slice(0, nope)), source_shape=shape, view=per_head,
                    transpose=True)
            imp.add(f"{dst}.attn_v_b", f"{src}.{theirs}", (nh, vd, c),
                    rows=(slice(None), slice(nope, None)), source_shape=shape, view=per_head)
        else:
            imp.add(f"{dst}.attn_k_b", f"{src}.attn_k_b.weight", (nh, c, nope))
            imp.add(f"{dst}.attn_v_b", f"{src}.attn_v_b.weight", (nh, vd, c))


def _plan(f: GGUFFile, a: _Arch, dtype: int) -> tuple[list[TensorSpec], dict[str, list[str]]]:
    hp, kinds = a.hp, a.kinds
    imp = _Importer(f, hp, dtype, permute=f.architecture in PERMUTED)
    V, H, d = hp.vocab_size, hp.d_model, hp.head_dim
    q_out, kv_out = hp.n_heads * d, hp.n_kv_heads * d
    E, I = hp.n_experts, hp.d_ff_expert
    norm_bias = hp.norm_kind == NORM_KIND_LAYER_BIAS
    # the second norm: DBRX's norm_attn_norm.norm_2, GLM-4.5's and GPT-OSS's
    # post_attention_layernorm
    ffn_norm = {"dbrx": "attn_output_norm", "glm4moe": "post_attention_norm",
                "gpt-oss": "post_attention_norm"}.get(
        f.architecture, "ffn_norm")
    imp.add("token_embd", "token_embd.weight", (V, H))
    for layer, kind in enumerate(kinds):
        src, dst = f"blk.{layer}", f"layers.{layer}"
        imp.add(f"{dst}.attn_norm", f"{src}.attn_norm.weight", (H,))
        if norm_bias:
            imp.add(f"{dst}.attn_norm_bias", f"{src}.attn_norm.bias", (H,))
        if hp.attention == ATTENTION_MLA:
            _mla_attention(imp, hp, src, dst)
        elif f"{src}.attn_qkv.weight" in f:  # fused (DBRX): q, k and v rows
            fused = q_out + 2 * kv_out
            for short, rows in (("q", slice(0, q_out)), ("k", slice(q_out, q_out + kv_out)),
                                ("v", slice(q_out + kv_out, fused))):
                imp.add(f"{dst}.attn_{short}", f"{src}.attn_qkv.weight",
                        (rows.stop - rows.start, H), rows=rows, source_shape=(fused, H))
        else:
            imp.add(f"{dst}.attn_q", f"{src}.attn_q.weight", (q_out, H), heads=hp.n_heads)
            imp.add(f"{dst}.attn_k", f"{src}.attn_k.weight", (kv_out, H), heads=hp.n_kv_heads)
            imp.add(f"{dst}.attn_v", f"{src}.attn_v.weight", (kv_out, H))
        if hp.flags & FLAG_QKV_BIAS and hp.attention != ATTENTION_MLA:
            imp.add(f"{dst}.attn_q_bias", f"{src}.attn_q.bias", (q_out,), heads=hp.n_heads)
            imp.add(f"{dst}.attn_k_bias", f"{src}.attn_k.bias", (kv_out,), heads=hp.n_kv_heads)
            imp.add(f"{dst}.attn_v_bias", f"{src}.attn_v.bias", (kv_out,))
        if hp.attention != ATTENTION_MLA:
            imp.add(f"{dst}.attn_o", f"{src}.attn_output.weight", (H, q_out))
        if hp.flags & FLAG_O_BIAS and hp.attention != ATTENTION_MLA:
            imp.add(f"{dst}.attn_o_bias", f"{src}.attn_output.bias", (H,))
        if hp.flags & FLAG_QK_NORM_HEAD:
            imp.add(f"{dst}.attn_q_norm", f"{src}.attn_q_norm.weight", (d,))
            imp.add(f"{dst}.attn_k_norm", f"{src}.attn_k_norm.weight", (d,))
        if hp.flags & FLAG_QK_NORM_FULL:
            imp.add(f"{dst}.attn_q_norm", f"{src}.attn_q_norm.weight", (q_out,))
            imp.add(f"{dst}.attn_k_norm", f"{src}.attn_k_norm.weight", (kv_out,))
        if a.attention and a.attention[layer].sinks:
            imp.add(f"{dst}.attn_sinks", f"{src}.attn_sinks.weight", (hp.n_heads,))
        imp.add(f"{dst}.ffn_norm", f"{src}.{ffn_norm}.weight", (H,))
        if norm_bias:
            imp.add(f"{dst}.ffn_norm_bias", f"{src}.{ffn_norm}.bias", (H,))
        rule = a.rules[layer] if a.rules else None
        if kind == LAYER_MOE:
            imp.add(f"{dst}.moe_gate", f"{src}.ffn_gate_inp.weight", (E, H), force_f32=True)
            if rule is not None and rule.gate_bias:
                imp.add(f"{dst}.moe_gate_bias", f"{src}.ffn_gate_inp.bias", (E,))
            if rule is not None and rule.correction_bias:
                imp.add(f"{dst}.moe_correction_bias", f"{src}.exp_probs_b.bias", (E,))
            imp.add(f"{dst}.moe_w1", f"{src}.ffn_gate_exps.weight", (E, I, H))
            imp.add(f"{dst}.moe_w2", f"{src}.ffn_down_exps.weight", (E, H, I))
            imp.add(f"{dst}.moe_w3", f"{src}.ffn_up_exps.weight", (E, I, H))
            if rule is not None and rule.expert_bias:
                imp.add(f"{dst}.moe_w1_bias", f"{src}.ffn_gate_exps.bias", (E, I), force_f32=True)
                imp.add(f"{dst}.moe_w2_bias", f"{src}.ffn_down_exps.bias", (E, H), force_f32=True)
                imp.add(f"{dst}.moe_w3_bias", f"{src}.ffn_up_exps.bias", (E, I), force_f32=True)
            if hp.flags & FLAG_SHARED_EXPERT or (rule is not None and rule.shared != SHARED_NONE):
                S = hp.d_ff_shared
                imp.add(f"{dst}.shared_w1", f"{src}.ffn_gate_shexp.weight", (S, H))
                imp.add(f"{dst}.shared_w2", f"{src}.ffn_down_shexp.weight", (H, S))
                imp.add(f"{dst}.shared_w3", f"{src}.ffn_up_shexp.weight", (S, H))
            if hp.flags & FLAG_SHARED_EXPERT_GATE:
                imp.add(f"{dst}.shared_gate", f"{src}.ffn_gate_inp_shexp.weight", (1, H))
        else:
            D = hp.d_ff_dense
            imp.add(f"{dst}.mlp_w1", f"{src}.ffn_gate.weight", (D, H))
            imp.add(f"{dst}.mlp_w2", f"{src}.ffn_down.weight", (H, D))
            imp.add(f"{dst}.mlp_w3", f"{src}.ffn_up.weight", (D, H))
    imp.add("output_norm", "output_norm.weight", (H,))
    if norm_bias:
        imp.add("output_norm_bias", "output_norm.bias", (H,))
    if not hp.flags & FLAG_TIED_EMBEDDINGS:
        imp.add("output", "output.weight", (V, H))
    if hp.flags & FLAG_OUTPUT_BIAS:
        imp.add("output_bias", "output.bias", (V,))
    if hp.rope_type == ROPE_LONGROPE:
        imp.add("rope_freq_factors", "rope_factors_short.weight", (hp.head_dim // 2,))
        if "rope_factors_long.weight" in f:  # read by _longrope to bound the context
            imp.used.add("rope_factors_long.weight")
    unused = imp.unused(hp.n_layers)
    if unused:
        imp.problems.append(f"{len(unused)} tensor(s) the {f.architecture} import does not "
                            f"read (importing without them would give another model): "
                            f"{', '.join(unused[:8])}{' ...' if len(unused) > 8 else ''}")
    if imp.problems:
        shown = imp.problems[:20]
        more = f"; and {len(imp.problems) - 20} more" if len(imp.problems) > 20 else ""
        raise ConversionError(f"{f.path}: {len(imp.problems)} problem(s): " + "; ".join(shown)
                              + more)
    return imp.specs, imp.dequantised


def convert_gguf(path: str | os.PathLike[str], out_path: str | os.PathLike[str],
                 dtype: str = "f32", progress: Callable[[int, int], None] | None = None,
                 quantize: str | None = None, quantize_tensors: str = "experts",
                 layout: str = DEFAULT_LAYOUT) -> list[str]:
    """Import the GGUF file at `path` as a `.colibri` file at `out_path` (atomically; nothing is
    left behind on failure). `dtype` stores tensors of types other than F32/F16/BF16/Q8_0/Q4_0;
    `quantize` then works as in `convert.convert` on the float tensors, and `layout` stores the
    q8_0/q4_0 tensors (Q8_0/Q4_0 ones included) as there. Returns the notes written to the
    metadata. Raises ConversionError."""
    path, out_path = os.fspath(path), os.fspath(out_path)
    if dtype not in DTYPE_BY_NAME:
        raise ConversionError(f"dtype {dtype!r} not supported (supported: "
                              f"{', '.join(DTYPE_BY_NAME)})")
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise ConversionError(f"output directory {out_dir} does not exist")
    f = _open(path)
    notes: list[str] = []
    a = _hparams(f, notes)
    hp, family = a.hp, a.family
    specs, dequantised = _plan(f, a, DTYPE_BY_NAME[dtype])
    for qname, names in sorted(dequantised.items()):
        notes.append(f"{len(names)} {qname} tensor(s) dequantised to {dtype} (Colibri stores "
                     f"f32, f16, bf16, q8_0 and q4_0): {', '.join(names[:8])}"
                     + (" ..." if len(names) > 8 else ""))
    specs = apply_layout(apply_quantize(specs, quantize, quantize_tensors, hp, notes), layout)
    try:
        tokenizer = tokenizer_json(f, notes)
    except TokenizerError as exc:
        tokenizer = None
        notes.append(f"tokenizer not imported: {exc}")
    if tokenizer is None:
        notes.append("no tokenizer: run with token ids (--tokens)")
    st = os.stat(path)
    metadata: dict[str, Any] = {
        "source": {"format": "gguf", "model_type": family, "architecture": f.architecture,
                   "file": os.path.basename(path), "size": st.st_size,
                   "name": f.get("general.name"), "gguf_version": f.layout.version,
                   "file_type": f.get("general.file_type")},
        "converted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "converter_version": CONVERTER_VERSION,
        "dtype": dtype,
        **({"quantize": quantize, "quantize_tensors": quantize_tensors} if quantize else {}),
        "gguf_metadata": {k: v for k, v in f.metadata(max_items=16).items()
                          if not k.startswith("tokenizer.ggml.")},
    }
    if notes:
        metadata["notes"] = notes
    plan = plan_file(hp, a.kinds, specs, tokenizer.encode("utf-8") if tokenizer else b"",
                     metadata, rules=a.rules, attention=a.attention)
    write_colibri(out_path, plan, progress)
    return notes


__all__ = ["ARCHITECTURES", "CONFIG_ARCHITECTURES", "SUPPORTED_ARCHITECTURES", "convert_gguf",
           "repack_blocks"]
