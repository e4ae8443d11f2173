"""DBRX (`dbrx`): a softmax over every expert, top-k of the probabilities, the chosen weights
divided by their p-norm (ffn_config.moe_normalize_expert_weights; none when null); every layer
MoE; LayerNorm without bias (eps 1e-5, nn.LayerNorm's default) for every norm; the fused Wqkv
projection [H + 2 kv_n_heads d, H] (split into q, k and v rows here) whose output is clamped to
[-clip_qkv, clip_qkv] before RoPE. The experts are stored 2-D, stacked along the rows:
ffn.experts.mlp.w1 and v1 [E*I, H] (gate, up) and w2 [E*I, H] (the down projection transposed).

transformers 5.23 builds RoPE from rope_parameters (rope_theta 10000 unless the config says
otherwise) and only stores attn_config.rope_theta; the converter does what it runs, and notes
the difference when the two disagree (Databricks' own config has rope_theta 500000 there).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import (ARCH_DBRX, LAYER_MOE, NORM_KIND_LAYER, NORM_NONE, NORM_P,
                                RouteRule)

MODEL_TYPE = "dbrx"
ALIASES = {"num_hidden_layers": "n_layers", "hidden_size": "d_model",
           "num_attention_heads": "n_heads", "max_position_embeddings": "max_seq_len"}
DEFAULTS: dict[str, Any] = dict(
    d_model=2048, n_heads=16, n_layers=24, max_seq_len=2048, vocab_size=32000,
    bos_token_id=None, eos_token_id=None, tie_word_embeddings=False, rope_theta=10000.0,
    rms_norm_eps=1e-5)  # nn.LayerNorm's eps: DBRX's config has none
# DbrxAttentionConfig's and DbrxFFNConfig's class defaults
ATTN_DEFAULTS: dict[str, Any] = dict(clip_qkv=None, kv_n_heads=1)
FFN_DEFAULTS: dict[str, Any] = dict(ffn_act_fn=None, ffn_hidden_size=3584, moe_num_experts=4,
                                    moe_top_k=1, moe_normalize_expert_weights=1.0)


def _sub_config(cfg: Config, key: str, defaults: dict[str, Any]) -> dict[str, Any]:
    value = cfg.raw.get(key)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ConversionError(f"config.json: {key} = {value!r}, expected an object")
    return {**defaults, **value}


def architecture(cfg: Config) -> Architecture:
    attn = _sub_config(cfg, "attn_config", ATTN_DEFAULTS)
    ffn = _sub_config(cfg, "ffn_config", FFN_DEFAULTS)
    if cfg.flag("tie_word_embeddings"):
        raise ConversionError("config.json: tie_word_embeddings = true is not supported "
                              "(transformers refuses it for DBRX)")
    act = ffn["ffn_act_fn"] or {"name": "silu"}
    if not isinstance(act, dict) or act.get("name", "silu") not in ("silu", "swish"):
        raise ConversionError(f"config.json: ffn_config.ffn_act_fn = {act!r} is not supported "
                              "(the engine's experts compute silu(gate) * up)")
    # the sub-configs' fields under the names base_hparams reads
    flat = Config({**cfg.raw, "num_key_value_heads": attn["kv_n_heads"],
                   "num_local_experts": ffn["moe_num_experts"],
                   "num_experts_per_tok": ffn["moe_top_k"],
                   "intermediate_size": ffn["ffn_hidden_size"]},
                  cfg.model_type, cfg.defaults, cfg.aliases)
    d_model, n_heads = flat.int("hidden_size"), flat.int("num_attention_heads")
    if d_model % n_heads:
        raise ConversionError(f"config.json: d_model {d_model} not divisible by n_heads {n_heads}")
    hp = common.base_hparams(flat, ARCH_DBRX, flat.int("num_local_experts"),
                             flat.int("num_experts_per_tok"), flat.int("intermediate_size"), 0,
                             head_dim=d_model // n_heads)
    rope = common.rope(flat)
    notes = []
    stated = attn.get("rope_theta")
    if stated is not None and stated != rope.theta:
        notes.append(f"attn_config.rope_theta {stated} is not what transformers 5.23 runs "
                     f"(rope_parameters' rope_theta, {rope.theta:g}); converted as it runs")
    clip = attn["clip_qkv"]
    p = ffn["moe_normalize_expert_weights"]
    rule = (RouteRule(normalize=NORM_NONE) if p is None else
            RouteRule(normalize=NORM_P,
                      norm_p=common.positive_number(p, "ffn_config.moe_normalize_expert_weights")))
    hp = replace(common.apply_rope(hp, rope), norm_kind=NORM_KIND_LAYER, norm_eps=1e-5,
                 clip_qkv=0.0 if clip is None else common.positive_number(clip,
                                                                          "attn_config.clip_qkv"))
    n = hp.n_layers
    return Architecture(hp, [LAYER_MOE] * n, [rule] * n, common.attention_masks(n, None), notes)


def embedding_tensors(p: Planner, a: Architecture) -> None:
    p.single("token_embd", "transformer.wte.weight", (a.hp.vocab_size, a.hp.d_model))


def head_tensors(p: Planner, a: Architecture) -> None:
    common.head(p, a, norm="transformer.norm_f")


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    hp = a.hp
    src, dst = f"transformer.blocks.{layer}", f"layers.{layer}"
    H, E, I = hp.d_model, hp.n_experts, hp.d_ff_expert
    q, kv = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
    common.norms(p, a, layer, attn="norm_attn_norm.norm_1", ffn="norm_attn_norm.norm_2", src=src)
    wqkv = f"{src}.norm_attn_norm.attn.Wqkv.weight"
    for short, rows in (("q", slice(0, q)), ("k", slice(q, q + kv)),
                        ("v", slice(q + kv, q + 2 * kv))):
        p.part(f"{dst}.attn_{short}", wqkv, (q + 2 * kv, H), rows, (rows.stop - rows.start, H))
    p.single(f"{dst}.attn_o", f"{src}.norm_attn_norm.attn.out_proj.weight", (H, q))
    common.router(p, a, layer, f"{src}.ffn.router.layer.weight")
    experts = f"{src}.ffn.experts.mlp"
    p.expert_rows(f"{dst}.moe_w1", f"{experts}.w1", E, I, H)
    p.expert_rows(f"{dst}.moe_w2", f"{experts}.w2", E, I, H, transpose=True)  # -> [E, H, I]
    p.expert_rows(f"{dst}.moe_w3", f"{experts}.v1", E, I, H)
