"""Llama 4, the text model (`llama4_text`, Llama4ForCausalLM; and the text part of `llama4`
checkpoints, Llama4ForConditionalGeneration, whose text_config it reads and whose
`language_model.` tensors it converts, leaving the vision tower): top-k (1 by default) of the
router logits, each chosen expert's sigmoid scaling that expert's *input*, a shared expert added
ungated; MoE layers every interleave_moe_layer_step (or those moe_layers lists), dense MLPs of
intermediate_size_mlp elsewhere; RoPE on interleaved pairs on the layers no_rope_layers marks 1,
followed by a weightless RMS ("L2") norm of each q and k head (use_qk_norm), and no RoPE on the
others (NoPE), whose queries are scaled by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1
(attn_temperature_tuning); chunked attention (attention_chunk_size) on the layers layer_types
names, by default the RoPE layers.

Experts are fused and transposed in transformers' layout: `feed_forward.experts.gate_up_proj`
[E, H, 2I] (the first I columns the gate, the next I the up projection) and `down_proj` [E, I, H];
per-expert `feed_forward.experts.E.gate_proj/up_proj/down_proj` are read too."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import (ARCH_LLAMA4, FLAG_O_BIAS, FLAG_QKV_BIAS, LAYER_CHUNKED,
                                LAYER_DENSE, LAYER_FULL, LAYER_MOE, ROPE_INTERLEAVED,
                                SCORING_SIGMOID, SELECT_LOGITS, SHARED_PLAIN, LayerAttention,
                                RouteRule)

MODEL_TYPE = "llama4_text"
# The multimodal checkpoint: its text_config, its tensors under `language_model.`
MULTIMODAL = "llama4"
OTHER_MODEL_TYPES = (MULTIMODAL,)
TEXT_PREFIX = "language_model."
ALIASES = {"num_experts": "num_local_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
    num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
    hidden_act="silu", max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, bos_token_id=1,
    eos_token_id=2, tie_word_embeddings=False, num_experts_per_tok=1, num_local_experts=16,
    moe_layers=None, interleave_moe_layer_step=1, use_qk_norm=True, no_rope_layers=None,
    no_rope_layer_interval=4, attention_chunk_size=8192, layer_types=None,
    attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, attention_bias=False,
    rope_theta=500000.0)


def moe_kinds(cfg: Config, n_layers: int) -> list[int]:
    """moe_layers, else every interleave_moe_layer_step-th layer (Llama4TextConfig's rule)."""
    if cfg.get("moe_layers") is None:
        step = cfg.int("interleave_moe_layer_step")
        moe = set(range(step - 1, n_layers, step))
    else:
        moe = set(cfg.int_list("moe_layers"))
    return [LAYER_MOE if i in moe else LAYER_DENSE for i in range(n_layers)]


def rope_layers(cfg: Config, n_layers: int) -> list[bool]:
    """Which layers apply RoPE: no_rope_layers (1 = RoPE), else all but every
    no_rope_layer_interval-th."""
    listed = cfg.get("no_rope_layers")
    if not listed:
        interval = cfg.int("no_rope_layer_interval")
        return [(i + 1) % interval != 0 for i in range(n_layers)]
    if not isinstance(listed, list) or len(listed) < n_layers or any(
            v not in (0, 1) or isinstance(v, bool) for v in listed[:n_layers]):
        raise ConversionError(f"config.json: no_rope_layers = {listed!r}, expected a list of "
                              f"{n_layers} or more 0s and 1s")
    return [v == 1 for v in listed[:n_layers]]


def chunked_layers(cfg: Config, use_rope: list[bool]) -> list[bool]:
    """Which layers attend within chunks: layer_types, else the RoPE layers."""
    types = cfg.get("layer_types")
    if types is None:
        return list(use_rope)
    if not isinstance(types, list) or len(types) != len(use_rope) or any(
            t not in ("chunked_attention", "full_attention") for t in types):
        raise ConversionError(f"config.json: layer_types = {types!r}, expected a list of "
                              f"{len(use_rope)} 'chunked_attention' / 'full_attention'")
    return [t == "chunked_attention" for t in types]


def text_config(cfg: Config) -> Config:
    """The text model's config: config.json itself, or a llama4 checkpoint's text_config."""
    if cfg.model_type != MULTIMODAL:
        return cfg
    text = cfg.raw.get("text_config")
    if not isinstance(text, dict):
        raise ConversionError("config.json: a llama4 checkpoint needs a text_config object")
    return Config(text, MODEL_TYPE, DEFAULTS, ALIASES)


def architecture(cfg: Config) -> Architecture:
    prefix = TEXT_PREFIX if cfg.model_type == MULTIMODAL else ""
    cfg = text_config(cfg)
    if cfg.get("hidden_act") != "silu":
        raise ConversionError(f"config.json: hidden_act = {cfg.get('hidden_act')!r} not "
                              "supported (supported: 'silu')")
    n_layers = cfg.int("num_hidden_layers")
    kinds = moe_kinds(cfg, min(n_layers, 1025))
    hp = common.base_hparams(cfg, ARCH_LLAMA4, cfg.int("num_local_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("intermediate_size"),
                             cfg.int("intermediate_size_mlp") if LAYER_DENSE in kinds else 0)
    hp = replace(common.apply_rope(hp, common.rope(cfg)), rope_layout=ROPE_INTERLEAVED,
                 d_ff_shared=hp.d_ff_expert)
    if cfg.flag("attention_bias"):
        hp = replace(hp, flags=hp.flags | FLAG_QKV_BIAS | FLAG_O_BIAS)
    use_rope = rope_layers(cfg, hp.n_layers)
    chunked = chunked_layers(cfg, use_rope)
    if any(chunked):
        hp = replace(hp, attention_chunk_size=cfg.int("attention_chunk_size"))
    qk_norm = cfg.flag("use_qk_norm")
    tuning = cfg.flag("attn_temperature_tuning")
    floor = cfg.int("floor_scale") if tuning and not all(use_rope) else 0
    scale = common.finite_number(cfg.get("attn_scale"), "attn_scale") if floor else 0.0
    attention = [LayerAttention(LAYER_CHUNKED if chunked[i] else LAYER_FULL,
                                no_rope=not use_rope[i], qk_l2_norm=qk_norm and use_rope[i],
                                temperature_floor=0 if use_rope[i] else floor,
                                temperature_scale=0.0 if use_rope[i] else scale)
                 for i in range(hp.n_layers)]
    rule = RouteRule(scoring=SCORING_SIGMOID, select_on=SELECT_LOGITS, shared=SHARED_PLAIN,
                     weight_inputs=True)
    return Architecture(hp, kinds, [rule if k == LAYER_MOE else None for k in kinds], attention,
                        hf_prefix=prefix)


def _experts(p: Planner, a: Architecture, layer: int, src: str) -> None:
    """moe_w1/w2/w3 from the fused, transposed matrices (gate columns first), or per expert."""
    E, I, H = a.hp.n_experts, a.hp.d_ff_expert, a.hp.d_model
    dst = f"layers.{layer}"
    if not (p.has(f"{src}.experts.gate_up_proj") or p.has(f"{src}.experts.down_proj")):
        common.routed_experts(p, a, layer, src)
        return
    gate_up = [(f"{src}.experts.gate_up_proj", (E, H, 2 * I))]
    p.expert_pieces(f"{dst}.moe_w1", (I, H), gate_up, lambda w: w[:, :I].T)
    p.expert_pieces(f"{dst}.moe_w2", (H, I), [(f"{src}.experts.down_proj", (E, I, H))],
                    lambda w: w.T)
    p.expert_pieces(f"{dst}.moe_w3", (I, H), gate_up, lambda w: w[:, I:].T)


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    src = f"model.layers.{layer}.feed_forward"
    common.norms(p, a, layer)
    common.gqa_attention(p, a, layer)
    if a.kinds[layer] != LAYER_MOE:
        common.dense_mlp(p, a, layer, src)
        return
    common.router(p, a, layer, f"{src}.router.weight")
    _experts(p, a, layer, src)
    common.shared_expert(p, a, layer, f"{src}.shared_expert")
