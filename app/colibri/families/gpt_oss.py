"""GPT-OSS (`gpt_oss`): a router with a bias, top-k of its logits weighted by a softmax over the
chosen; experts with biases after each projection and a clamped SwiGLU between them
(swiglu_alpha, swiglu_limit); attention with q/k/v/o biases and a learned sink logit per head;
sliding-window and full layers as layer_types says (alternating by default); YaRN RoPE by default.

Experts are stored fused in every transformers format, transposed: `mlp.experts.gate_up_proj`
[E, H, 2I] with the gate and up columns interleaved (even columns the gate), `down_proj`
[E, I, H], and their biases [E, 2I] and [E, H]. Published checkpoints (openai/gpt-oss-*) hold the
two matrices as MXFP4 instead: `gate_up_proj_blocks` [E, 2I, H/32, 16] and `_scales` [E, 2I, H/32]
(rows already [out, in]), likewise `down_proj_blocks`/`_scales` [E, H, I/32(, 16)]. The converter
dequantises them exactly (each value is an FP4 code times a power of two) and stores them in
`--dtype`, or `--quantize`'s q8_0/q4_0."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.families.qwen3_moe import window_size
from colibri.fileformat import (ARCH_GPT_OSS, EXPERT_SWIGLU_CLAMPED, FLAG_O_BIAS, FLAG_QKV_BIAS,
                                LAYER_MOE, LAYER_FULL, LAYER_SLIDING, SELECT_LOGITS,
                                LayerAttention, RouteRule)

MODEL_TYPE = "gpt_oss"
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
DEFAULTS: dict[str, Any] = dict(
    num_hidden_layers=36, num_local_experts=128, vocab_size=201088, hidden_size=2880,
    intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
    sliding_window=128, tie_word_embeddings=False, max_position_embeddings=131072,
    rms_norm_eps=1e-5, num_experts_per_tok=4, swiglu_alpha=1.702, swiglu_limit=7.0,
    layer_types=None, bos_token_id=None, eos_token_id=None, attention_bias=True,
    rope_theta=150000.0)
# GptOssConfig.__post_init__'s RoPE when config.json gives none.
DEFAULT_ROPE: dict[str, Any] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False,
                                "original_max_position_embeddings": 4096}

# The 16 values of an FP4 (e2m1) code: transformers' integrations/mxfp4.py FP4_VALUES.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 -> float32: blocks [..., G, 16] uint8 (two FP4 codes per byte, the low nibble first),
    scales [..., G] uint8 (E8M0: the exponent + 127) -> [..., G * 32], value = FP4 * 2^(scale -
    127), as transformers' convert_moe_packed_tensors computes it (before its transpose)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ConversionError(f"MXFP4 blocks {list(blocks.shape)} do not match scales "
                              f"{list(scales.shape)}")
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    values = FP4_VALUES[codes] * np.exp2(scales.astype(np.float32) - 127.0)[..., None]
    return values.reshape(*scales.shape[:-1], scales.shape[-1] * 32)


def layer_types(cfg: Config, n_layers: int) -> list[bool]:
    """Which layers slide: layer_types, else GptOssConfig's default (the even layers)."""
    types = cfg.get("layer_types")
    if types is None:
        return [(i + 1) % 2 == 1 for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(
            t not in ("sliding_attention", "full_attention") for t in types):
        raise ConversionError(f"config.json: layer_types = {types!r}, expected a list of "
                              f"{n_layers} 'sliding_attention' / 'full_attention'")
    return [t == "sliding_attention" for t in types]


def architecture(cfg: Config) -> Architecture:
    if not (cfg.raw.get("rope_parameters") or cfg.raw.get("rope_scaling")):
        cfg = Config({**cfg.raw, "rope_parameters": DEFAULT_ROPE}, cfg.model_type, cfg.defaults,
                     cfg.aliases)
    quant = cfg.raw.get("quantization_config")
    if quant is not None and not (isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"):
        raise ConversionError(f"config.json: quantization_config = {quant!r} not supported "
                              "(supported: MXFP4 experts, quant_method 'mxfp4')")
    hp = common.base_hparams(cfg, ARCH_GPT_OSS, cfg.int("num_local_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("intermediate_size"), 0)
    hp = common.apply_rope(hp, common.rope(cfg))
    sliding = layer_types(cfg, hp.n_layers)
    if any(sliding):
        hp = replace(hp, sliding_window=window_size(cfg))
    if cfg.flag("attention_bias"):
        hp = replace(hp, flags=hp.flags | FLAG_QKV_BIAS | FLAG_O_BIAS)
    rule = RouteRule(select_on=SELECT_LOGITS, gate_bias=True, expert_bias=True,
                     activation=EXPERT_SWIGLU_CLAMPED,
                     act_alpha=cfg.number("swiglu_alpha", strict=True),
                     act_limit=cfg.number("swiglu_limit", strict=True))
    n = hp.n_layers
    return Architecture(hp, [LAYER_MOE] * n, [rule] * n,
                        [LayerAttention(LAYER_SLIDING if s else LAYER_FULL, sinks=True)
                         for s in sliding])


def _experts(p: Planner, a: Architecture, layer: int, src: str) -> None:
    """moe_w1/w2/w3 from the fused, transposed, interleaved matrices or their MXFP4 blocks."""
    E, I, H = a.hp.n_experts, a.hp.d_ff_expert, a.hp.d_model
    dst = f"layers.{layer}"
    if p.has(f"{src}.gate_up_proj_blocks") or p.has(f"{src}.down_proj_blocks"):
        if H % 32 or I % 32:
            p.problem(f"MXFP4 experts of layer {layer}: hidden_size {H} and intermediate_size "
                      f"{I} must be multiples of 32")
            return
        gate_up = [(f"{src}.gate_up_proj_blocks", (E, 2 * I, H // 32, 16)),
                   (f"{src}.gate_up_proj_scales", (E, 2 * I, H // 32))]
        down = [(f"{src}.down_proj_blocks", (E, H, I // 32, 16)),
                (f"{src}.down_proj_scales", (E, H, I // 32))]
        p.expert_pieces(f"{dst}.moe_w1", (I, H), gate_up,
                        lambda b, s: dequantize_mxfp4(b, s)[0::2], raw=True)
        p.expert_pieces(f"{dst}.moe_w2", (H, I), down, dequantize_mxfp4, raw=True)
        p.expert_pieces(f"{dst}.moe_w3", (I, H), gate_up,
                        lambda b, s: dequantize_mxfp4(b, s)[1::2], raw=True)
        return
    gate_up = [(f"{src}.gate_up_proj", (E, H, 2 * I))]
    p.expert_pieces(f"{dst}.moe_w1", (I, H), gate_up, lambda w: w[:, 0::2].T)
    p.expert_pieces(f"{dst}.moe_w2", (H, I), [(f"{src}.down_proj", (E, I, H))], lambda w: w.T)
    p.expert_pieces(f"{dst}.moe_w3", (I, H), gate_up, lambda w: w[:, 1::2].T)


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    hp = a.hp
    E, I, H = hp.n_experts, hp.d_ff_expert, hp.d_model
    src, dst = f"model.layers.{layer}", f"layers.{layer}"
    common.norms(p, a, layer)
    common.gqa_attention(p, a, layer)
    p.single(f"{dst}.attn_sinks", f"{src}.self_attn.sinks", (hp.n_heads,))
    common.router(p, a, layer, f"{src}.mlp.router.weight")
    p.single(f"{dst}.moe_gate_bias", f"{src}.mlp.router.bias", (E,))
    _experts(p, a, layer, f"{src}.mlp.experts")
    bias = [(f"{src}.mlp.experts.gate_up_proj_bias", (E, 2 * I))]
    p.expert_pieces(f"{dst}.moe_w1_bias", (I,), bias, lambda b: b[0::2], force_f32=True)
    p.expert_pieces(f"{dst}.moe_w3_bias", (I,), bias, lambda b: b[1::2], force_f32=True)
    p.expert_pieces(f"{dst}.moe_w2_bias", (H,), [(f"{src}.mlp.experts.down_proj_bias", (E, H))],
                    lambda b: b, force_f32=True)
