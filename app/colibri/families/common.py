"""What every family's conversion shares: reading config.json against the transformers class
defaults, RoPE parameters, the header limits, and the tensor mappings several families reuse
(GQA and MLA attention, dense MLPs, routed and shared experts).

A family module (one per transformers `model_type`, next to this one) says what its config means
(`Architecture`: header fields, layer kinds, each MoE layer's routing rule, each layer's
attention) and which Hugging Face tensors make each Colibri tensor, through a `Planner` that
colibri.convert implements. Nothing here reads tensor data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from colibri.fileformat import (
    ATTENTION_MLA, FLAG_O_BIAS, FLAG_OUTPUT_BIAS, FLAG_QK_NORM_FULL, FLAG_QK_NORM_HEAD,
    FLAG_QKV_BIAS, FLAG_TIED_EMBEDDINGS, LAYER_FULL, LAYER_MOE, LAYER_SLIDING,
    NORM_KIND_LAYER_BIAS, ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3, ROPE_YARN, SHARED_NONE,
    LayerAttention, RouteRule,
)
from colibri.values import HParams


class ConversionError(Exception):
    """The checkpoint cannot be converted; the message says which file, field or tensor, and why."""


# ---------------------------------------------------------------------------------------------
# config.json


class Config:
    """config.json of one family, falling back to the transformers 5.23 class defaults (the
    dataclass field defaults after __post_init__) for the fields it omits, so a config that
    omits a field converts to what `from_pretrained` would build."""

    def __init__(self, raw: dict[str, Any], model_type: str, defaults: dict[str, Any],
                 aliases: dict[str, str]):
        self.raw = raw
        self.model_type = model_type
        self.defaults = defaults
        self.aliases = aliases

    def _names(self, key: str) -> tuple[str, ...]:
        alias = self.aliases.get(key)
        return (key,) if alias is None else (key, alias)

    def get(self, key: str) -> Any:
        """config.json's value (null counts as absent only where noted), else the class default."""
        for source in (self.raw, self.defaults):
            for k in self._names(key):
                if k in source:
                    return source[k]
        return None

    def int(self, key: str, minimum: int = 1) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConversionError(f"config.json: {key} = {value!r}, expected an integer "
                                  f">= {minimum}")
        return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise ConversionError(f"config.json: {key} = {value!r}, expected true or false")
        return value

    def number(self, key: str, minimum: float = 0.0, strict: bool = False) -> float:
        """A finite number >= minimum (> minimum when strict)."""
        value = self.get(key)
        number = finite_number(value, key)
        if number < minimum or (strict and number == minimum):
            raise ConversionError(f"config.json: {key} = {value!r}, expected a number "
                                  f"{'>' if strict else '>='} {minimum:g}")
        return number

    def int_list(self, key: str) -> list[int]:
        value = self.get(key) or []
        if not isinstance(value, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise ConversionError(f"config.json: {key} = {value!r}, expected a list of layer "
                                  "indices")
        return value


def finite_number(value: Any, what: str) -> float:
    """A config number that must be finite (json.loads accepts Infinity, NaN and integers too
    large for a float, so each is refused here with the field's name)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConversionError(f"config.json: {what} = {value!r}, expected a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConversionError(f"config.json: {what} = {value!r}, expected a finite number")
    return number


def positive_number(value: Any, what: str) -> float:
    """A config number that must be finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConversionError(f"config.json: {what} = {value!r}, expected a number > 0")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and number > 0):
        raise ConversionError(f"config.json: {what} = {value!r}, expected a finite number > 0")
    return number


def token_id(value: Any) -> int:
    """bos/eos: None -> -1, a list -> its first element."""
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < 2**31:
        raise ConversionError(f"config.json: token id {value!r} is not a 32-bit integer")
    return value


# ---------------------------------------------------------------------------------------------
# RoPE


@dataclass(frozen=True)
class Rope:
    """The RoPE header fields of a config (docs/format.md, "RoPE")."""

    type: int
    theta: float
    factor: float = 1.0
    partial: float = 1.0             # partial_rotary_factor: rotary_dim = int(head_dim * partial)
    original_max_context: int = 0
    attn_factor: float = 1.0
    beta_fast: float = 0.0
    beta_slow: float = 0.0
    truncate: int = 0
    params: dict[str, Any] = field(default_factory=dict, compare=False)
    low_freq_factor: float = 0.0     # llama3
    high_freq_factor: float = 0.0    # llama3

    def apply(self, hp: HParams) -> HParams:
        """`hp` with these RoPE fields."""
        return replace(hp, rope_type=self.type, rope_theta=self.theta, rope_factor=self.factor,
                       rope_original_max_context=self.original_max_context,
                       rope_attn_factor=self.attn_factor, rope_truncate=self.truncate,
                       rope_beta_fast=self.beta_fast, rope_beta_slow=self.beta_slow,
                       rope_low_freq_factor=self.low_freq_factor,
                       rope_high_freq_factor=self.high_freq_factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope(cfg: Config) -> Rope:
    """RoPE from `rope_parameters` (transformers 5) or `rope_theta` / `rope_scaling` (older
    configs): default, linear, YaRN with transformers' defaults (beta_fast 32, beta_slow 1,
    truncate, the attention factor from factor, mscale and mscale_all_dim), or llama3."""
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
    theta = positive_number(theta, "rope_theta")
    partial = params.get("partial_rotary_factor", cfg.raw.get("partial_rotary_factor",
                                                              cfg.defaults.get("partial_rotary_factor")))
    partial = 1.0 if partial is None else positive_number(partial, "partial_rotary_factor")
    if partial > 1.0:
        raise ConversionError(f"config.json: partial_rotary_factor = {partial} is above 1")
    if rope_type == "default":
        return Rope(ROPE_DEFAULT, theta, partial=partial, params=params)
    if rope_type == "linear":
        return Rope(ROPE_LINEAR, theta, positive_number(params.get("factor"),
                                                        "linear RoPE factor"), partial, params=params)
    if rope_type == "yarn":
        original = params.get("original_max_position_embeddings")
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise ConversionError(f"config.json: YaRN original_max_position_embeddings = "
                                  f"{original!r}, expected an integer >= 1")
        factor = params.get("factor")
        factor = (cfg.int("max_position_embeddings") / original if factor is None
                  else positive_number(factor, "YaRN factor"))
        attention = params.get("attention_factor")
        mscale, mscale_all = (None if params.get(k) is None else finite_number(params[k], f"YaRN {k}")
                              for k in ("mscale", "mscale_all_dim"))
        if attention is None:
            attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
                         if mscale and mscale_all else _yarn_mscale(factor))
        beta_fast = positive_number(params.get("beta_fast") or 32, "YaRN beta_fast")
        beta_slow = positive_number(params.get("beta_slow") or 1, "YaRN beta_slow")
        truncate = params.get("truncate", True)
        if not isinstance(truncate, bool):
            raise ConversionError(f"config.json: YaRN truncate = {truncate!r}, expected true or "
                                  "false")
        return Rope(ROPE_YARN, theta, factor, partial, original,
                    positive_number(attention, "YaRN attention_factor"), beta_fast, beta_slow,
                    int(truncate), params)
    if rope_type == "llama3":
        original = params.get("original_max_position_embeddings")
        if isinstance(original, bool) or not isinstance(original, int) or original < 1:
            raise ConversionError(f"config.json: llama3 original_max_position_embeddings = "
                                  f"{original!r}, expected an integer >= 1")
        return Rope(ROPE_LLAMA3, theta, positive_number(params.get("factor"), "llama3 RoPE factor"),
                    partial, original,
                    low_freq_factor=positive_number(params.get("low_freq_factor"),
                                                    "llama3 low_freq_factor"),
                    high_freq_factor=positive_number(params.get("high_freq_factor"),
                                                     "llama3 high_freq_factor"), params=params)
    raise ConversionError(f"RoPE scaling type {rope_type!r} not supported (supported: "
                          "'default', 'linear', 'yarn', 'llama3')")


# ---------------------------------------------------------------------------------------------
# What a config means


@dataclass
class Architecture:
    """A checkpoint's header fields, layer kinds, each MoE layer's routing rule (None for dense
    layers), each layer's attention (LayerAttention), and the tensors made from config.json's
    values rather than the checkpoint's (LongRoPE's rope_freq_factors). `hf_prefix` goes before
    every Hugging Face tensor name (a multimodal checkpoint's `language_model.`)."""

    hp: HParams
    kinds: list[int]
    rules: list[RouteRule | None]
    attention: list[LayerAttention]
    notes: list[str] = field(default_factory=list)
    hf_prefix: str = ""
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def rule(self, layer: int) -> RouteRule:
        rule = self.rules[layer]
        assert rule is not None, f"layer {layer} is dense"
        return rule


def attention_masks(n_layers: int, sliding: Sequence[bool] | None) -> list[LayerAttention]:
    """Each layer's plain attention: sliding where `sliding` says, else full causal."""
    return [LayerAttention(LAYER_SLIDING if sliding and sliding[i] else LAYER_FULL)
            for i in range(n_layers)]


def check_limits(hp: HParams) -> None:
    """The header limits of docs/format.md, so that a checkpoint the engine would refuse fails
    here with the config field's name rather than later in `colibri validate`."""
    limits = (("num_hidden_layers", hp.n_layers, 1, 1024),
              ("num_experts", hp.n_experts, 1, 4096),
              ("hidden_size", hp.d_model, 1, 65536),
              ("num_attention_heads", hp.n_heads, 1, 1024),
              ("num_key_value_heads", hp.n_kv_heads, 1, hp.n_heads),
              ("head_dim", hp.head_dim, 2 if hp.attention != ATTENTION_MLA else 1, 1024),
              ("vocab_size", hp.vocab_size, 1, 16_777_216),
              ("max_position_embeddings", hp.max_context, 1, 1_048_576))
    for field_name, value, low, high in limits:
        if not low <= value <= high:
            raise ConversionError(f"config.json: {field_name} = {value} outside the supported "
                                  f"range {low}..{high}")
    rotary = hp.rotary_dim if hp.rotary_dim is not None else hp.head_dim
    if rotary % 2 or rotary < 2:
        raise ConversionError(f"{rotary} rotary dimensions per head (head_dim {hp.head_dim}); "
                              "RoPE needs an even number")


def tokens_in_vocab(hp: HParams, notes: list[str]) -> HParams:
    """`hp` with a bos or eos outside the vocabulary stored as -1 (and a note saying so)."""
    for attr in ("bos_token_id", "eos_token_id"):
        value = getattr(hp, attr)
        if value >= hp.vocab_size:
            # An id the model cannot produce (e.g. OLMoE's class default eos 50279 in a tiny
            # random model); the format requires -1 or an id below vocab_size.
            hp = replace(hp, **{attr: -1})
            notes.append(f"{attr} {value} is outside the vocabulary ({hp.vocab_size}); "
                         "stored as -1")
    return hp


def base_hparams(cfg: Config, arch: int, n_experts: int, top_k: int, d_ff_expert: int,
                 d_ff_dense: int, head_dim: int | None = None) -> HParams:
    """The header fields every family reads the same way (layers, heads, vocabulary, norms,
    RoPE, special tokens); the family sets the rest (HParams is frozen: `dataclasses.replace`)."""
    n_layers = cfg.int("num_hidden_layers")
    if n_layers > 1024:  # checked before any per-layer list is built (a 10**12 would hang)
        raise ConversionError(f"config.json: num_hidden_layers = {n_layers} outside the "
                              "supported range 1..1024")
    d_model = cfg.int("hidden_size")
    n_heads = cfg.int("num_attention_heads")
    n_kv = cfg.get("num_key_value_heads")
    n_kv = n_heads if n_kv is None else cfg.int("num_key_value_heads")
    if head_dim is None:
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
    if top_k > n_experts:
        raise ConversionError(f"config.json: num_experts_per_tok {top_k} > {n_experts} experts")
    return HParams(arch=arch, n_layers=n_layers, n_experts=n_experts, n_experts_active=top_k,
                   d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
                   vocab_size=cfg.int("vocab_size"),
                   max_context=cfg.int("max_position_embeddings"),
                   d_ff_expert=d_ff_expert, d_ff_dense=d_ff_dense,
                   flags=FLAG_TIED_EMBEDDINGS if cfg.flag("tie_word_embeddings") else 0,
                   norm_eps=positive_number(cfg.get("rms_norm_eps"), "rms_norm_eps"),
                   bos_token_id=token_id(cfg.get("bos_token_id")),
                   eos_token_id=token_id(cfg.get("eos_token_id")))


def apply_rope(hp: HParams, r: Rope) -> HParams:
    """`hp` with the RoPE fields of GQA attention: partial rotary over the first
    int(head_dim * factor) dims."""
    rotary = int(hp.head_dim * r.partial)
    return replace(r.apply(hp), rotary_dim=None if rotary == hp.head_dim else rotary)


# ---------------------------------------------------------------------------------------------
# Tensors


class Planner(Protocol):
    """Collects the output tensors (colibri.convert implements it). Missing or misshapen source
    tensors are recorded as problems and reported together before anything is written."""

    def has(self, hf_name: str) -> bool: ...

    def single(self, name: str, hf_name: str, shape: tuple[int, ...], force_f32: bool = False,
               source_shape: tuple[int, ...] | None = None) -> None: ...

    def part(self, name: str, hf_name: str, source_shape: tuple[int, ...], rows: slice,
             shape: tuple[int, ...]) -> None: ...

    def expert_rows(self, name: str, hf_name: str, n_experts: int, rows: int, cols: int,
                    transpose: bool = False) -> None: ...

    def stacked(self, name: str, hf_names: Sequence[str], shape: tuple[int, ...]) -> None: ...

    def fused_experts(self, dst: str, gate_up: str, down: str, n_experts: int, d_ff: int,
                      d_model: int) -> None: ...

    def expert_pieces(self, name: str, shape: tuple[int, ...],
                      sources: Sequence[tuple[str, tuple[int, ...]]],
                      make: Callable[..., np.ndarray], raw: bool = False,
                      force_f32: bool = False) -> None: ...

    def derived(self, name: str, shape: tuple[int, ...], hf_name: str,
                source_shape: tuple[int, ...], make: Callable[[np.ndarray], np.ndarray]) -> None: ...

    def constant(self, name: str, values: np.ndarray) -> None: ...

    def problem(self, text: str) -> None: ...


def embeddings(p: Planner, a: Architecture) -> None:
    V, H = a.hp.vocab_size, a.hp.d_model
    p.single("token_embd", "model.embed_tokens.weight", (V, H))


def head(p: Planner, a: Architecture, norm: str = "model.norm") -> None:
    """The final norm (its bias with a biased LayerNorm) and the LM head (its bias when the
    OUTPUT_BIAS flag says so) from `{norm}.weight` / `.bias` and `lm_head.weight` / `.bias`."""
    V, H = a.hp.vocab_size, a.hp.d_model
    p.single("output_norm", f"{norm}.weight", (H,))
    if a.hp.norm_kind == NORM_KIND_LAYER_BIAS:
        p.single("output_norm_bias", f"{norm}.bias", (H,))
    if not a.hp.flags & FLAG_TIED_EMBEDDINGS:
        p.single("output", "lm_head.weight", (V, H))
    if a.hp.flags & FLAG_OUTPUT_BIAS:
        p.single("output_bias", "lm_head.bias", (V,))


def norms(p: Planner, a: Architecture, layer: int, attn: str = "input_layernorm",
          ffn: str = "post_attention_layernorm", src: str | None = None) -> None:
    """attn_norm and ffn_norm (and their biases with a biased LayerNorm) from
    `{src}.{attn}.weight` and `{src}.{ffn}.weight`, src `model.layers.L` by default."""
    H, src = a.hp.d_model, src or f"model.layers.{layer}"
    for dst, name in (("attn_norm", attn), ("ffn_norm", ffn)):
        p.single(f"layers.{layer}.{dst}", f"{src}.{name}.weight", (H,))
        if a.hp.norm_kind == NORM_KIND_LAYER_BIAS:
            p.single(f"layers.{layer}.{dst}_bias", f"{src}.{name}.bias", (H,))


def gqa_attention(p: Planner, a: Architecture, layer: int) -> None:
    """q/k/v/o projections, their biases and q/k norms as the header flags say."""
    hp = a.hp
    src, dst = f"model.layers.{layer}.self_attn", f"layers.{layer}"
    h, q_out, kv_out = hp.d_model, hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
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


def mla_tensors(hp: HParams) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """The latent-attention (MLA) tensors of a layer in the order they are written: Colibri's
    name, Hugging Face's (under self_attn), GGUF's (under blk.N) and the shape. The "attn_kv_b"
    entry is kv_b_proj [nh*(nope+vd), c], which each import splits per head into attn_k_b
    [nh, c, nope] (the key half, transposed) and attn_v_b [nh, vd, c]."""
    H, nh, ql, c = hp.d_model, hp.n_heads, hp.q_lora_rank, hp.kv_lora_rank
    nope, r, vd = hp.qk_nope_head_dim, hp.qk_rope_head_dim, hp.v_head_dim or 0
    bias = bool(hp.flags & FLAG_QKV_BIAS)
    out: list[tuple[str, str, str, tuple[int, ...]]] = []
    if ql:
        out.append(("attn_q_a", "q_a_proj.weight", "attn_q_a.weight", (ql, H)))
        if bias:
            out.append(("attn_q_a_bias", "q_a_proj.bias", "attn_q_a.bias", (ql,)))
        out += [("attn_q_a_norm", "q_a_layernorm.weight", "attn_q_a_norm.weight", (ql,)),
                ("attn_q_b", "q_b_proj.weight", "attn_q_b.weight", (nh * (nope + r), ql))]
    else:
        out.append(("attn_q", "q_proj.weight", "attn_q.weight", (nh * (nope + r), H)))
    out.append(("attn_kv_a", "kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", (c + r, H)))
    if bias:
        out.append(("attn_kv_a_bias", "kv_a_proj_with_mqa.bias", "attn_kv_a_mqa.bias", (c + r,)))
    out += [("attn_kv_a_norm", "kv_a_layernorm.weight", "attn_kv_a_norm.weight", (c,)),
            ("attn_kv_b", "kv_b_proj.weight", "attn_kv_b.weight", (nh * (nope + vd), c)),
            ("attn_o", "o_proj.weight", "attn_output.weight", (H, nh * vd))]
    if hp.flags & FLAG_O_BIAS:
        out.append(("attn_o_bias", "o_proj.bias", "attn_output.bias", (H,)))
    return out


def mla_attention(p: Planner, a: Architecture, layer: int) -> None:
    """DeepSeek's latent attention (docs/format.md, "MLA"), the tensors of `mla_tensors`."""
    hp = a.hp
    src, dst = f"model.layers.{layer}.self_attn", f"layers.{layer}"
    nh, c, nope, vd = hp.n_heads, hp.kv_lora_rank, hp.qk_nope_head_dim, hp.v_head_dim
    assert vd is not None

    def key_half(w: np.ndarray) -> np.ndarray:
        per_head = w.reshape(nh, nope + vd, c)
        return np.ascontiguousarray(per_head[:, :nope, :].transpose(0, 2, 1))

    def value_half(w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w.reshape(nh, nope + vd, c)[:, nope:, :])
    for ours, theirs, _, shape in mla_tensors(hp):
        if ours == "attn_kv_b":
            p.derived(f"{dst}.attn_k_b", (nh, c, nope), f"{src}.{theirs}", shape, key_half)
            p.derived(f"{dst}.attn_v_b", (nh, vd, c), f"{src}.{theirs}", shape, value_half)
        else:
            p.single(f"{dst}.{ours}", f"{src}.{theirs}", shape)


def dense_mlp(p: Planner, a: Architecture, layer: int, src: str | None = None) -> None:
    dst = f"layers.{layer}"
    src = src or f"model.layers.{layer}.mlp"
    D, H = a.hp.d_ff_dense, a.hp.d_model
    p.single(f"{dst}.mlp_w1", f"{src}.gate_proj.weight", (D, H))
    p.single(f"{dst}.mlp_w2", f"{src}.down_proj.weight", (H, D))
    p.single(f"{dst}.mlp_w3", f"{src}.up_proj.weight", (D, H))


def router(p: Planner, a: Architecture, layer: int, hf_name: str) -> None:
    """moe_gate [n_experts, d_model], kept in f32 whatever the checkpoint's dtype."""
    p.single(f"layers.{layer}.moe_gate", hf_name, (a.hp.n_experts, a.hp.d_model), force_f32=True)


def layer_start(p: Planner, a: Architecture, layer: int,
                attention: Callable[[Planner, Architecture, int], None] = gqa_attention
                ) -> str | None:
    """Where a `model.layers.L` layer's tensors start: its norms, its attention and, on a dense
    layer, its MLP. Returns the MoE block's prefix `model.layers.L.mlp`, or None on a dense layer
    (nothing more to plan)."""
    norms(p, a, layer)
    attention(p, a, layer)
    if a.kinds[layer] != LAYER_MOE:
        dense_mlp(p, a, layer)
        return None
    return f"model.layers.{layer}.mlp"


def moe_block(p: Planner, a: Architecture, layer: int, prefix: str,
              correction_bias: str | None = None,
              bias_source_shape: tuple[int, ...] | None = None,
              shared: str = "shared_experts") -> None:
    """A MoE block under `prefix` in the Qwen / DeepSeek layout: the router `{prefix}.gate.weight`,
    moe_correction_bias [n_experts] from the full name `correction_bias` when given, the routed
    experts, and the shared expert `{prefix}.{shared}` when the layer's rule has one."""
    router(p, a, layer, f"{prefix}.gate.weight")
    if correction_bias:
        p.single(f"layers.{layer}.moe_correction_bias", correction_bias, (a.hp.n_experts,),
                 source_shape=bias_source_shape)
    routed_experts(p, a, layer, prefix)
    if a.rule(layer).shared != SHARED_NONE:
        shared_expert(p, a, layer, f"{prefix}.{shared}")


# Per-expert names of (w1 gate, w2 down, w3 up) (moe-families.md 0.1).
QWEN_EXPERT_NAMES = ("gate_proj.weight", "down_proj.weight", "up_proj.weight")
MIXTRAL_EXPERT_NAMES = ("w1.weight", "w2.weight", "w3.weight")


def routed_experts(p: Planner, a: Architecture, layer: int, prefix: str,
                   names: tuple[str, str, str] = QWEN_EXPERT_NAMES,
                   fused_prefix: str | None = None) -> None:
    """The stacked moe_w1/w2/w3 from per-expert tensors `{prefix}.experts.{e}.{name}` or from the
    fused `{fused_prefix}.experts.gate_up_proj` [E, 2I, H] and `.down_proj` [E, H, I] (transformers
    5's in-memory layout, written by save_pretrained(save_original_format=False))."""
    hp = a.hp
    dst = f"layers.{layer}"
    E, I, H = hp.n_experts, hp.d_ff_expert, hp.d_model
    fused = fused_prefix or prefix
    gate_up, down = f"{fused}.experts.gate_up_proj", f"{fused}.experts.down_proj"
    per_expert = [[f"{prefix}.experts.{e}.{n}" for e in range(E)] for n in names]
    has_fused = p.has(gate_up) or p.has(down)
    has_per_expert = any(p.has(n) for group in per_expert for n in group)
    if has_fused and has_per_expert:
        p.problem(f"layer {layer} has both fused ('{gate_up}') and per-expert "
                  f"('{per_expert[0][0]}') expert tensors")
        return
    if has_fused:
        p.fused_experts(dst, gate_up, down, E, I, H)
        return
    p.stacked(f"{dst}.moe_w1", per_expert[0], (I, H))
    p.stacked(f"{dst}.moe_w2", per_expert[1], (H, I))
    p.stacked(f"{dst}.moe_w3", per_expert[2], (I, H))


def shared_expert(p: Planner, a: Architecture, layer: int, prefix: str) -> None:
    """shared_w1/w2/w3 from `{prefix}.{gate,down,up}_proj.weight`."""
    dst = f"layers.{layer}"
    S, H = a.hp.d_ff_shared, a.hp.d_model
    p.single(f"{dst}.shared_w1", f"{prefix}.gate_proj.weight", (S, H))
    p.single(f"{dst}.shared_w2", f"{prefix}.down_proj.weight", (H, S))
    p.single(f"{dst}.shared_w3", f"{prefix}.up_proj.weight", (S, H))


def silu_only(cfg: Config, key: str = "hidden_act") -> None:
    """The experts' activation: the engine runs SwiGLU with SiLU (transformers' "silu")."""
    act = cfg.get(key)
    if act not in ("silu", "swish"):
        raise ConversionError(f"config.json: {key} = {act!r} is not supported (the engine's "
                              "experts compute silu(gate) * up)")


def refuse(cfg: Config, key: str, why: str) -> None:
    """A switch the engine does not run: converting would give another model."""
    if cfg.flag(key):
        raise ConversionError(f"config.json: {key} = true is not supported ({why})")
