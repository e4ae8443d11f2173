"""Converting Hugging Face MoE checkpoints to `.colibri` files.

This module owns the step from a Hugging Face model directory (`config.json`, one or many
`*.safetensors` files, optionally `model.safetensors.index.json` and `tokenizer.json`) to one
`.colibri` file laid out by `colibri.fileformat`. It supports the four v1 families, Mixtral,
Qwen2-MoE, Qwen3-MoE and OLMoE, in both on-disk expert layouts that transformers 5 writes:
per-expert tensors (the default `save_pretrained`, and what Hub checkpoints hold) and fused 3-D
tensors (`save_pretrained(..., save_original_format=False)`).

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
from colibri.fileformat import (
    ARCH_MIXTRAL, ARCH_OLMOE, ARCH_QWEN2_MOE, ARCH_QWEN3_MOE, BLOCK_BYTES, BLOCK_ELEMS, DTYPE_BF16,
    DTYPE_BY_NAME, DTYPE_F16, QUANT_BY_NAME, quantize as quantize_blocks,
    DTYPE_F32, FLAG_NORM_TOPK, FLAG_O_BIAS, FLAG_QK_NORM_FULL, FLAG_QK_NORM_HEAD, FLAG_QKV_BIAS,
    FLAG_SHARED_EXPERT, FLAG_SHARED_EXPERT_GATE, FLAG_TIED_EMBEDDINGS, LAYER_DENSE, LAYER_MOE,
    TensorSpec, plan_file, storage_to_f32, to_storage, write_colibri,
)
from colibri.formats import safetensors_file
from colibri.formats.common import TensorEntry
from colibri.formats.safetensors_file import Checkpoint
from colibri.values import QUANTIZE_TENSORS, HParams

CONVERTER_VERSION = "1"

SUPPORTED_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")

_ARCH_CODES = {"mixtral": ARCH_MIXTRAL, "qwen2_moe": ARCH_QWEN2_MOE, "qwen3_moe": ARCH_QWEN3_MOE,
               "olmoe": ARCH_OLMOE}


class ConversionError(Exception):
    """The checkpoint cannot be converted; the message says which file, field or tensor, and why."""


# ---------------------------------------------------------------------------------------------
# Safetensors reading (validated by colibri.formats first, then read with safe_open)

# The checkpoint dtypes the converter reads (what transformers writes for these families).
SOURCE_DTYPES = ("F32", "F16", "BF16", "F64")


def _format_problems(problems: Sequence[Any]) -> str:
    errs = [p for p in problems if p.severity == "error"]
    shown = "; ".join(f"{p.message} (at byte 0x{p.offset:X})" for p in errs[:5])
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
# Config: config.json plus the transformers 5.23 class defaults for the fields it omits

# Defaults copied from transformers 5.23 models/<family>/configuration_<family>.py (the dataclass
# field defaults, after __post_init__), so that a config.json that omits a field converts to what
# `from_pretrained` would build. rope_theta is the class's `default_theta` (10000 unless the class
# overrides it; Mixtral sets 1e6).
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "mixtral": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=None,
        max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False, sliding_window=None, num_experts_per_tok=2,
        num_local_experts=8, rope_theta=1e6),
    "qwen2_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
        sliding_window=4096, max_window_layers=28, decoder_sparse_step=1,
        moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_experts_per_tok=4,
        num_experts=60, norm_topk_prob=False, mlp_only_layers=None, qkv_bias=True,
        layer_types=None, bos_token_id=None, eos_token_id=None, rope_theta=10000.0),
    "qwen3_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
        use_sliding_window=False, sliding_window=4096, decoder_sparse_step=1,
        moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128, norm_topk_prob=False,
        mlp_only_layers=None, bos_token_id=None, eos_token_id=None, rope_theta=10000.0),
    "olmoe": dict(
        vocab_size=50304, hidden_size=2048, intermediate_size=2048, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=None, max_position_embeddings=4096,
        rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=50279, tie_word_embeddings=False,
        attention_bias=False, clip_qkv=None, num_experts_per_tok=8, num_experts=64,
        norm_topk_prob=False, rope_theta=10000.0),
}

# Alternative spellings: transformers' attribute_map aliases num_experts <-> num_local_experts,
# and saves whichever is the class's real field (Qwen3-MoE writes num_local_experts).
_ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}


class _Config:
    def __init__(self, raw: dict[str, Any], model_type: str):
        self.raw = raw
        self.model_type = model_type
        self.defaults = _CLASS_DEFAULTS[model_type]

    def get(self, key: str) -> Any:
        """config.json's value (null counts as absent only where noted), else the class default."""
        for k in (key, _ALIASES.get(key)):
            if k is not None and k in self.raw:
                return self.raw[k]
        for k in (key, _ALIASES.get(key)):
            if k is not None and k in self.defaults:
                return self.defaults[k]
        return None

    def int(self, key: str, minimum: int = 1) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConversionError(f"config.json: {key} = {value!r}, expected an integer "
                                  f">= {minimum}")
        return value


def _positive_number(value: Any, what: str) -> float:
    """A config number that must be finite and > 0 (json.loads accepts Infinity, NaN and
    integers too large for a float, so each is refused here with the field's name)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConversionError(f"config.json: {what} = {value!r}, expected a number > 0")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and number > 0):
        raise ConversionError(f"config.json: {what} = {value!r}, expected a finite number > 0")
    return number


def _token_id(value: Any) -> int:
    """bos/eos: None -> -1, a list -> its first element."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < 2**31:
        raise ConversionError(f"config.json: token id {value!r} is not a 32-bit integer")
    return value


def _rope(cfg: _Config) -> tuple[int, float, float]:
    """(rope_type, rope_theta, rope_factor) from `rope_parameters` (transformers 5) or
    `rope_theta` / `rope_scaling` (older configs)."""
    params = cfg.raw.get("rope_parameters") or cfg.raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ConversionError(f"config.json: rope parameters {params!r} are not an object")
    if params and all(isinstance(v, dict) for v in params.values()):
        # Nested per layer type ({"full_attention": {...}, ...}): fine only if all equal.
        values = list(params.values())
        if any(v != values[0] for v in values[1:]):
            raise ConversionError("config.json: per-layer-type RoPE parameters differ; "
                                  "not supported")
        params = values[0]
    theta = params.get("rope_theta", cfg.raw.get("rope_theta", cfg.defaults["rope_theta"]))
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = _positive_number(theta, "rope_theta")
    partial = params.get("partial_rotary_factor", cfg.raw.get("partial_rotary_factor"))
    if partial is not None and partial != 1.0:
        raise ConversionError(f"config.json: partial_rotary_factor = {partial} not supported")
    if rope_type == "default":
        return 0, theta, 1.0
    if rope_type == "linear":
        return 1, theta, _positive_number(params.get("factor"), "linear RoPE factor")
    raise ConversionError(f"RoPE scaling type {rope_type!r} not supported (supported: "
                          "'default', 'linear')")


def _sliding_window(cfg: _Config, n_layers: int) -> int:
    mt = cfg.model_type
    if mt == "olmoe":
        return 0  # OLMoE has no sliding window
    if mt == "mixtral":
        # MixtralModel uses the sliding mask on every layer iff sliding_window is not None.
        window = cfg.get("sliding_window")
        if window is None or window == 0:
            return 0
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ConversionError(f"config.json: sliding_window = {window!r}, expected null or "
                                  "an integer >= 0")
        return window
    if not cfg.get("use_sliding_window"):
        return 0  # both Qwen configs drop sliding_window unless use_sliding_window
    window = cfg.get("sliding_window")
    if mt == "qwen3_moe":
        sliding = [True] * n_layers  # Qwen3-MoE reuses MixtralModel: all layers or none
    else:
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            # Qwen2MoeConfig.__post_init__'s rule when layer_types is not given.
            mwl = cfg.int("max_window_layers", minimum=0)
            layer_types = ["sliding_attention" if (i + 1) % 2 and i < mwl else "full_attention"
                           for i in range(n_layers)]
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise ConversionError(f"config.json: layer_types = {layer_types!r}, expected a list "
                                  f"of {n_layers} layer type names")
        sliding = [t == "sliding_attention" for t in layer_types]
    if not any(sliding):
        return 0
    if not all(sliding):
        which = [i for i, s in enumerate(sliding) if s]
        raise ConversionError(f"sliding-window attention on only some layers ({which}) is not "
                              "supported")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConversionError(f"config.json: sliding_window = {window!r}, expected an integer "
                              ">= 1")
    return window


# ---------------------------------------------------------------------------------------------
# Hyper-parameters and layer kinds

def _hparams(cfg: _Config, notes: list[str]) -> tuple[HParams, list[int]]:
    """Header fields and layer kinds from the config; appends to `notes` any value it had to
    change (they go to the metadata under "notes")."""
    mt = cfg.model_type
    qwen = mt in ("qwen2_moe", "qwen3_moe")
    n_layers = cfg.int("num_hidden_layers")
    if n_layers > 1024:  # checked before any per-layer list is built (a 10**12 would hang)
        raise ConversionError(f"config.json: num_hidden_layers = {n_layers} outside the "
                              "supported range 1..1024")
    d_model = cfg.int("hidden_size")
    n_heads = cfg.int("num_attention_heads")
    n_kv = cfg.get("num_key_value_heads")
    n_kv = n_heads if n_kv is None else cfg.int("num_key_value_heads")
    head_dim = cfg.get("head_dim")  # null in config.json means "derive it", as in every family
    if head_dim is None:
        if d_model % n_heads:
            raise ConversionError(f"config.json: hidden_size {d_model} not divisible by "
                                  f"num_attention_heads {n_heads} and no head_dim")
        head_dim = d_model // n_heads
    else:
        head_dim = cfg.int("head_dim")
    if n_heads % n_kv:
        raise ConversionError(f"config.json: num_key_value_heads {n_kv} does not divide "
                              f"num_attention_heads {n_heads}")
    n_experts = cfg.int("num_experts")
    top_k = cfg.int("num_experts_per_tok")
    if top_k > n_experts:
        raise ConversionError(f"config.json: num_experts_per_tok {top_k} > {n_experts} experts")

    if qwen:
        mlp_only_raw = cfg.get("mlp_only_layers") or []
        if not isinstance(mlp_only_raw, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in mlp_only_raw):
            raise ConversionError(f"config.json: mlp_only_layers = {mlp_only_raw!r}, expected a "
                                  "list of layer indices")
        mlp_only = set(mlp_only_raw)
        step = cfg.int("decoder_sparse_step")
        kinds = [LAYER_MOE if i not in mlp_only and (i + 1) % step == 0 else LAYER_DENSE
                 for i in range(n_layers)]
        d_ff_expert = cfg.int("moe_intermediate_size")
        d_ff_dense = cfg.int("intermediate_size") if LAYER_DENSE in kinds else 0
    else:
        kinds = [LAYER_MOE] * n_layers  # Mixtral and OLMoE: every layer is MoE
        d_ff_expert = cfg.int("intermediate_size")  # OLMoE reuses Mixtral's experts
        d_ff_dense = 0

    flags = 0
    d_ff_shared = 0
    clip_qkv = 0.0
    if mt == "mixtral" or cfg.get("norm_topk_prob"):
        flags |= FLAG_NORM_TOPK  # Mixtral always renormalises the top-k weights
    if cfg.get("tie_word_embeddings"):
        flags |= FLAG_TIED_EMBEDDINGS
    if mt == "qwen2_moe":
        d_ff_shared = cfg.int("shared_expert_intermediate_size", minimum=0)
        if d_ff_shared > 0:
            flags |= FLAG_SHARED_EXPERT | FLAG_SHARED_EXPERT_GATE
        if cfg.get("qkv_bias"):
            flags |= FLAG_QKV_BIAS  # Qwen2-MoE: q/k/v biases, never an o bias
    if mt in ("qwen3_moe", "olmoe") and cfg.get("attention_bias"):
        flags |= FLAG_QKV_BIAS | FLAG_O_BIAS  # attention_bias covers q, k, v and o
    if mt == "qwen3_moe":
        flags |= FLAG_QK_NORM_HEAD
    if mt == "olmoe":
        flags |= FLAG_QK_NORM_FULL
        clip = cfg.get("clip_qkv")
        if clip is not None:
            clip_qkv = _positive_number(clip, "clip_qkv")

    rope_type, rope_theta, rope_factor = _rope(cfg)
    eps = _positive_number(cfg.get("rms_norm_eps"), "rms_norm_eps")

    hp = HParams(
        arch=_ARCH_CODES[mt], n_layers=n_layers, n_experts=n_experts, n_experts_active=top_k,
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        vocab_size=cfg.int("vocab_size"), max_context=cfg.int("max_position_embeddings"),
        d_ff_expert=d_ff_expert, d_ff_dense=d_ff_dense, d_ff_shared=d_ff_shared, flags=flags,
        sliding_window=_sliding_window(cfg, n_layers), rope_type=rope_type,
        rope_theta=rope_theta, rope_factor=rope_factor, norm_eps=eps, clip_qkv=clip_qkv,
        bos_token_id=_token_id(cfg.get("bos_token_id")),
        eos_token_id=_token_id(cfg.get("eos_token_id")))
    check_limits(hp)
    for attr in ("bos_token_id", "eos_token_id"):
        value = getattr(hp, attr)
        if value >= hp.vocab_size:
            # An id the model cannot produce (e.g. OLMoE's class default eos 50279 in a tiny
            # random model); the format requires -1 or an id below vocab_size.
            hp = replace(hp, **{attr: -1})
            notes.append(f"{attr} {value} is outside the vocabulary ({hp.vocab_size}); "
                         "stored as -1")
    return hp, kinds


def hparams_from_config(raw: Any) -> tuple[HParams, list[int], list[str]]:
    """The parsed content of config.json -> (header fields, layer kinds, notes on values that had
    to change). Any input, of any JSON type, either converts or raises ConversionError naming
    the field (tests/fuzz/fuzz_convert.py holds it to that)."""
    if not isinstance(raw, dict):
        raise ConversionError("config.json: not a JSON object")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(f"model_type {model_type!r} not supported (supported: "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)})")
    notes: list[str] = []
    hp, kinds = _hparams(_Config(raw, model_type), notes)
    return hp, kinds, notes


def check_limits(hp: HParams) -> None:
    """The header limits of docs/format.md, so that a checkpoint the engine would refuse fails
    here with the config field's name rather than later in `colibri validate`."""
    limits = (("num_hidden_layers", hp.n_layers, 1, 1024),
              ("num_experts", hp.n_experts, 1, 4096),
              ("hidden_size", hp.d_model, 1, 65536),
              ("num_attention_heads", hp.n_heads, 1, 1024),
              ("num_key_value_heads", hp.n_kv_heads, 1, hp.n_heads),
              ("head_dim", hp.head_dim, 2, 1024),
              ("vocab_size", hp.vocab_size, 1, 16_777_216),
              ("max_position_embeddings", hp.max_context, 1, 1_048_576))
    for field_name, value, low, high in limits:
        if not low <= value <= high:
            raise ConversionError(f"config.json: {field_name} = {value} outside the supported "
                                  f"range {low}..{high}")
    if hp.head_dim % 2:
        raise ConversionError(f"head_dim {hp.head_dim} is odd; RoPE needs an even head_dim")


# ---------------------------------------------------------------------------------------------
# Tensor plan: which HF tensors make each Colibri tensor, checked before anything is written

_STORAGE_NP = {DTYPE_F32: np.float32, DTYPE_F16: np.float16, DTYPE_BF16: np.uint16}


@dataclass(frozen=True)
class _Piece:
    """Part of one source tensor: `index` (a tuple of ints and slices; () = all of it) into the
    tensor `name`, `count` elements, read with the safetensors library's lazy slice."""

    ckpt: Checkpoint
    name: str
    index: tuple[Any, ...]
    count: int

    def read(self) -> np.ndarray:
        part = self.ckpt.slice(self.name)[self.index if self.index else slice(None)]
        values = np.asarray(part).astype(np.float32).reshape(-1)
        if values.size != self.count:
            raise ConversionError(f"tensor '{self.name}': read {values.size} elements, expected "
                                  f"{self.count}")
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


def _loader(name: str, dtype: int, shape: tuple[int, ...], pieces: Sequence[_Piece]
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
    tensors and bad shapes are reported together, before anything is written."""

    def __init__(self, ckpt: Checkpoint, dtype: int):
        self.ckpt = ckpt
        self.tensors = {t.name: t for t in ckpt.tensors}
        self.dtype = dtype
        self.specs: list[TensorSpec] = []
        self.problems: list[str] = []
        self.used: set[str] = set()

    def source(self, hf_name: str, shape: tuple[int, ...], what: str) -> TensorEntry | None:
        t = self.tensors.get(hf_name)
        if t is None:
            self.problems.append(f"missing tensor '{hf_name}' (for {what})")
            return None
        self.used.add(hf_name)
        if t.shape != tuple(shape):
            self.problems.append(f"tensor '{hf_name}' has shape {list(t.shape)}, expected "
                                 f"{list(shape)} (for {what})")
            return None
        if t.dtype not in SOURCE_DTYPES:
            self.problems.append(f"tensor '{hf_name}' has dtype {t.dtype}, not one the converter "
                                 f"reads ({', '.join(SOURCE_DTYPES)})")
            return None
        return t

    def piece(self, t: TensorEntry, index: tuple[Any, ...] = (), count: int | None = None
              ) -> _Piece:
        return _Piece(self.ckpt, t.name, index, t.n_elements if count is None else count)

    def add(self, name: str, shape: tuple[int, ...], pieces: Sequence[_Piece] | None,
            force_f32: bool = False) -> None:
        if pieces is None:
            return
        # 1-D tensors (norms, biases) and the router stay f32 (docs/format.md, Dtypes).
        dtype = DTYPE_F32 if force_f32 or len(shape) == 1 else self.dtype
        self.specs.append(TensorSpec(name, dtype, tuple(shape), _loader(name, dtype, shape,
                                                                        pieces)))

    def single(self, name: str, hf_name: str, shape: tuple[int, ...],
               force_f32: bool = False) -> None:
        t = self.source(hf_name, shape, name)
        self.add(name, shape, None if t is None else [self.piece(t)], force_f32)

    def stacked(self, name: str, hf_names: Sequence[str], shape: tuple[int, ...]) -> None:
        """Per-expert matrices of `shape` stacked into [E, *shape]."""
        sources = [self.source(n, shape, name) for n in hf_names]
        ok = all(s is not None for s in sources)
        self.add(name, (len(hf_names), *shape),
                 [self.piece(s) for s in sources if s is not None] if ok else None)


def _attention(p: _Planner, hp: HParams, layer: int, mt: str) -> None:
    src, dst = f"model.layers.{layer}.self_attn", f"layers.{layer}"
    h, q_out, kv_out = hp.d_model, hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
    p.single(f"{dst}.attn_norm", f"model.layers.{layer}.input_layernorm.weight", (h,))
    for short, proj, out in (("q", "q_proj", q_out), ("k", "k_proj", kv_out),
                             ("v", "v_proj", kv_out)):
        p.single(f"{dst}.attn_{short}", f"{src}.{proj}.weight", (out, h))
        if hp.flags & FLAG_QKV_BIAS:
            p.single(f"{dst}.attn_{short}_bias", f"{src}.{proj}.bias", (out,))
    p.single(f"{dst}.attn_o", f"{src}.o_proj.weight", (h, q_out))
    if hp.flags & FLAG_O_BIAS:
        p.single(f"{dst}.attn_o_bias", f"{src}.o_proj.bias", (h,))
    if hp.flags & FLAG_QK_NORM_HEAD:
        p.single(f"{dst}.attn_q_norm", f"{src}.q_norm.weight", (hp.head_dim,))
        p.single(f"{dst}.attn_k_norm", f"{src}.k_norm.weight", (hp.head_dim,))
    if hp.flags & FLAG_QK_NORM_FULL:
        p.single(f"{dst}.attn_q_norm", f"{src}.q_norm.weight", (q_out,))
        p.single(f"{dst}.attn_k_norm", f"{src}.k_norm.weight", (kv_out,))
    p.single(f"{dst}.ffn_norm", f"model.layers.{layer}.post_attention_layernorm.weight", (h,))


# Per-expert names for (w1 gate, w2 down, w3 up), by conversion pattern (moe-families.md 0.1).
_PER_EXPERT = {"mixtral": ("w1.weight", "w2.weight", "w3.weight")}
_PER_EXPERT_QWEN = ("gate_proj.weight", "down_proj.weight", "up_proj.weight")


def _moe(p: _Planner, hp: HParams, layer: int, mt: str) -> None:
    dst = f"layers.{layer}"
    E, I, H = hp.n_experts, hp.d_ff_expert, hp.d_model
    # Mixtral's per-expert checkpoints use `block_sparse_moe.`; its fused form uses `mlp.`.
    prefixes = ["block_sparse_moe", "mlp"] if mt == "mixtral" else ["mlp"]
    per_expert_names = _PER_EXPERT.get(mt, _PER_EXPERT_QWEN)
    base = f"model.layers.{layer}"
    fused_gate_up = f"{base}.mlp.experts.gate_up_proj"
    fused_down = f"{base}.mlp.experts.down_proj"
    has_fused = fused_gate_up in p.tensors or fused_down in p.tensors
    candidates = [pre for pre in prefixes if f"{base}.{pre}.gate.weight" in p.tensors]
    pre = candidates[0] if candidates else ("mlp" if has_fused else prefixes[0])
    prefix = f"{base}.{pre}"
    p.single(f"{dst}.moe_gate", f"{prefix}.gate.weight", (E, H), force_f32=True)

    per_expert = [[f"{prefix}.experts.{e}.{n}" for e in range(E)] for n in per_expert_names]
    has_per_expert = any(n in p.tensors for names in per_expert for n in names)
    if has_fused and has_per_expert:
        p.problems.append(f"layer {layer} has both fused ('{fused_gate_up}') and per-expert "
                          f"('{per_expert[0][0]}') expert tensors")
        return
    if has_fused:
        gu = p.source(fused_gate_up, (E, 2 * I, H), f"{dst}.moe_w1 and {dst}.moe_w3")
        down = p.source(fused_down, (E, H, I), f"{dst}.moe_w2")
        # gate_up_proj[e] is [2I, H]: rows 0..I-1 are the gate (w1), rows I..2I-1 the up (w3).
        p.add(f"{dst}.moe_w1", (E, I, H),
              None if gu is None else [p.piece(gu, (e, slice(0, I)), I * H) for e in range(E)])
        p.add(f"{dst}.moe_w2", (E, H, I),
              None if down is None else [p.piece(down, (e,), H * I) for e in range(E)])
        p.add(f"{dst}.moe_w3", (E, I, H),
              None if gu is None else [p.piece(gu, (e, slice(I, 2 * I)), I * H)
                                       for e in range(E)])
    else:
        p.stacked(f"{dst}.moe_w1", per_expert[0], (I, H))
        p.stacked(f"{dst}.moe_w2", per_expert[1], (H, I))
        p.stacked(f"{dst}.moe_w3", per_expert[2], (I, H))

    if hp.flags & FLAG_SHARED_EXPERT:
        S = hp.d_ff_shared
        p.single(f"{dst}.shared_w1", f"{base}.mlp.shared_expert.gate_proj.weight", (S, H))
        p.single(f"{dst}.shared_w2", f"{base}.mlp.shared_expert.down_proj.weight", (H, S))
        p.single(f"{dst}.shared_w3", f"{base}.mlp.shared_expert.up_proj.weight", (S, H))
    if hp.flags & FLAG_SHARED_EXPERT_GATE:
        p.single(f"{dst}.shared_gate", f"{base}.mlp.shared_expert_gate.weight", (1, H))


def _dense(p: _Planner, hp: HParams, layer: int) -> None:
    dst, src = f"layers.{layer}", f"model.layers.{layer}.mlp"
    D, H = hp.d_ff_dense, hp.d_model
    p.single(f"{dst}.mlp_w1", f"{src}.gate_proj.weight", (D, H))
    p.single(f"{dst}.mlp_w2", f"{src}.down_proj.weight", (H, D))
    p.single(f"{dst}.mlp_w3", f"{src}.up_proj.weight", (D, H))


def _plan_tensors(tensors: Checkpoint, hp: HParams, kinds: list[int], mt: str,
                  dtype: int) -> list[TensorSpec]:
    p = _Planner(tensors, dtype)
    V, H = hp.vocab_size, hp.d_model
    p.single("token_embd", "model.embed_tokens.weight", (V, H))
    for layer, kind in enumerate(kinds):
        _attention(p, hp, layer, mt)
        if kind == LAYER_MOE:
            _moe(p, hp, layer, mt)
        else:
            _dense(p, hp, layer)
    p.single("output_norm", "model.norm.weight", (H,))
    if not hp.flags & FLAG_TIED_EMBEDDINGS:
        p.single("output", "lm_head.weight", (V, H))
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
    are q8_0 (llama.cpp's rule for Mixtral)."""
    base = name.rsplit(".", 1)[-1]
    if len(shape) < 2 or base in ("moe_gate", "shared_gate"):
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


def convert(hf_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], dtype: str = "f32",
            progress: Callable[[int, int], None] | None = None, quantize: str | None = None,
            quantize_tensors: str = "experts") -> list[str]:
    """Convert the Hugging Face checkpoint in `hf_dir` to a `.colibri` file at `out_path`;
    returns warnings about the file written (one sentence each), e.g. that it has no tokenizer.

    `dtype` ("f32", "f16" or "bf16") is the storage of every matrix except the router; 1-D
    tensors and `moe_gate` are always f32. `progress(done, total)` is called after each tensor
    is written. `quantize` ("q8" or "q4", default None) stores the matrices of the
    `quantize_tensors` set ("experts" = moe_w1/w2/w3, the default; "ffn" adds shared experts and
    dense MLPs; "all" adds attention and the LM head; "llama.cpp" is llama-quantize's Q8_0/Q4_0
    recipe, see llama_quantize_type) as q8_0/q4_0 blocks quantised from their `dtype` values;
    matrices whose rows are not a multiple of 32 stay in `dtype` (noted in the
    metadata). Raises ConversionError for an unsupported or inconsistent checkpoint; nothing is
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
    hp, kinds, notes = hparams_from_config(raw)
    model_type = raw["model_type"]
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise ConversionError(f"output directory {out_dir} does not exist")

    tensors = _open_checkpoint(hf_dir)
    specs = _plan_tensors(tensors, hp, kinds, model_type, DTYPE_BY_NAME[dtype])
    specs = apply_quantize(specs, quantize, quantize_tensors, hp, notes)

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
    plan = plan_file(hp, kinds, specs, tokenizer, metadata)
    write_colibri(out_path, plan, progress)
    return warnings
