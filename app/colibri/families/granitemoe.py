"""GraniteMoE (`granitemoe`, IBM Granite 3.x MoE): the router ranks its logits and a softmax over
the k chosen gives the weights; every layer MoE; the µP multipliers: embeddings times
embedding_multiplier, attention scores scaled by attention_multiplier (instead of head_dim^-1/2),
each block's output times residual_multiplier before it is added, logits divided by
logits_scaling. Experts are 3-D in both saves: block_sparse_moe.input_linear [E, 2I, H] (gate
rows, then up rows) and output_linear [E, H, I] with the router block_sparse_moe.router.layer,
or in memory (the fused save) block_sparse_moe.experts.gate_up_proj / down_proj and
block_sparse_moe.router."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import (ARCH_GRANITEMOE, FLAG_O_BIAS, FLAG_QKV_BIAS, LAYER_MOE,
                                SELECT_LOGITS, SHARED_NONE, SHARED_PLAIN, RouteRule)

MODEL_TYPE = "granitemoe"
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
    max_position_embeddings=2048, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False, attention_bias=False, embedding_multiplier=1.0,
    logits_scaling=1.0, residual_multiplier=1.0, attention_multiplier=1.0, num_local_experts=8,
    num_experts_per_tok=2, rope_theta=10000.0)


def granite_architecture(cfg: Config, arch: int, d_ff_shared: int = 0) -> Architecture:
    """GraniteMoE and GraniteMoeShared: all but the shared expert."""
    common.silu_only(cfg)
    hp = common.base_hparams(cfg, arch, cfg.int("num_local_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("intermediate_size"), 0)
    flags = hp.flags
    if cfg.flag("attention_bias"):
        flags |= FLAG_QKV_BIAS | FLAG_O_BIAS  # q, k, v and o alike
    multiplier = {key: cfg.number(key, strict=True) for key in (
        "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")}
    hp = replace(common.apply_rope(hp, common.rope(cfg)), flags=flags, d_ff_shared=d_ff_shared,
                 attn_scale=multiplier["attention_multiplier"],
                 embedding_scale=multiplier["embedding_multiplier"],
                 residual_scale=multiplier["residual_multiplier"],
                 logit_divisor=multiplier["logits_scaling"])
    rule = RouteRule(select_on=SELECT_LOGITS,
                     shared=SHARED_PLAIN if d_ff_shared else SHARED_NONE)
    n = hp.n_layers
    return Architecture(hp, [LAYER_MOE] * n, [rule] * n, common.attention_masks(n, None))


def architecture(cfg: Config) -> Architecture:
    return granite_architecture(cfg, ARCH_GRANITEMOE)


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    common.norms(p, a, layer)
    common.gqa_attention(p, a, layer)
    base = f"model.layers.{layer}.block_sparse_moe"
    E, I, H = a.hp.n_experts, a.hp.d_ff_expert, a.hp.d_model
    fused = p.has(f"{base}.experts.gate_up_proj") or p.has(f"{base}.experts.down_proj")
    original = p.has(f"{base}.input_linear.weight") or p.has(f"{base}.output_linear.weight")
    if fused and original:
        p.problem(f"layer {layer} has both '{base}.experts.gate_up_proj' and "
                  f"'{base}.input_linear.weight'")
        return
    router = f"{base}.router.weight" if fused or p.has(f"{base}.router.weight") \
        else f"{base}.router.layer.weight"
    common.router(p, a, layer, router)
    if fused:
        p.fused_experts(f"layers.{layer}", f"{base}.experts.gate_up_proj",
                        f"{base}.experts.down_proj", E, I, H)
    else:
        p.fused_experts(f"layers.{layer}", f"{base}.input_linear.weight",
                        f"{base}.output_linear.weight", E, I, H)


def shared_mlp(p: Planner, a: Architecture, layer: int) -> None:
    """GraniteMoeShared's shared_mlp: input_linear [2S, H] (gate rows, then up rows) and
    output_linear [H, S]."""
    src, dst = f"model.layers.{layer}.shared_mlp", f"layers.{layer}"
    S, H = a.hp.d_ff_shared, a.hp.d_model
    if not S:
        raise ConversionError("internal: a shared MLP without shared_intermediate_size")
    p.part(f"{dst}.shared_w1", f"{src}.input_linear.weight", (2 * S, H), slice(0, S), (S, H))
    p.single(f"{dst}.shared_w2", f"{src}.output_linear.weight", (H, S))
    p.part(f"{dst}.shared_w3", f"{src}.input_linear.weight", (2 * S, H), slice(S, 2 * S), (S, H))
