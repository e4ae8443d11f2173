"""atheris fuzz target for the converter's input handling (run by tools/run_fuzz.sh).

Two inputs a user hands the converter and that can be anything: config.json and the header of a
.safetensors file. The first input byte picks the target; the rest is either
  * config.json bytes, parsed and turned into what they mean (`architecture_from_config`: the
    family modules of colibri.families, the whole path up to the tensor plan), or a
    structure-aware variant: one of the families' real configs with a few fields replaced by
    values of arbitrary JSON types; or
  * a .safetensors file (8-byte header length, JSON header, data), read by
    `read_safetensors_header`.
The contract: every input either converts or raises ConversionError with a message; any other
exception (TypeError, OverflowError, RecursionError, MemoryError...) or a hang is a finding.
Seeds: tests/fuzz/seeds/. Findings become regression tests in tests/test_convert_hostile.py.
"""

from __future__ import annotations

import json

import atheris

from atheris_main import run, scratch_path

with atheris.instrument_imports():
    from colibri import convert
    from colibri.families import FAMILIES

FAMILY_CONFIGS = [
    {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
     "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 64,
     "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None},
    {"model_type": "qwen2_moe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
     "moe_intermediate_size": 8, "shared_expert_intermediate_size": 16, "num_hidden_layers": 3,
     "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
     "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
     "max_position_embeddings": 64, "use_sliding_window": True, "sliding_window": 8,
     "max_window_layers": 4, "layer_types": None},
    {"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16, "head_dim": 8,
     "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
     "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    {"model_type": "olmoe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 8,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_experts": 4,
     "num_experts_per_tok": 2, "clip_qkv": 8.0, "eos_token_id": [2, 3]},
    {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
     "moe_intermediate_size": 8, "num_hidden_layers": 3, "num_attention_heads": 4,
     "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
     "topk_group": 1, "first_k_dense_replace": 1, "kv_lora_rank": 8, "q_lora_rank": 12,
     "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4,
     "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "mscale_all_dim": 1.0}},
    {"model_type": "deepseek_v2", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
     "num_attention_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1, "kv_lora_rank": 8,
     "q_lora_rank": None, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4},
    {"model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
     "moe_intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "use_qk_norm": True, "attention_bias": True},
    {"model_type": "ernie4_5_moe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
     "moe_intermediate_size": 8, "num_hidden_layers": 3, "num_attention_heads": 4,
     "num_key_value_heads": 2, "moe_num_experts": 4, "moe_k": 2, "moe_layer_interval": 2},
    {"model_type": "phimoe", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 8,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
     "num_local_experts": 4, "num_experts_per_tok": 2, "router_jitter_noise": 0.01,
     "attention_bias": True, "lm_head_bias": True, "sliding_window": 8},
    {"model_type": "granitemoeshared", "vocab_size": 64, "hidden_size": 16,
     "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
     "shared_intermediate_size": 16, "embedding_multiplier": 12.0, "attention_multiplier": 0.25,
     "residual_multiplier": 0.22, "logits_scaling": 6.0, "attention_bias": True},
    {"model_type": "dbrx", "vocab_size": 64, "d_model": 16, "n_heads": 4, "n_layers": 2,
     "max_seq_len": 64, "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 5e5},
     "ffn_config": {"ffn_hidden_size": 8, "moe_num_experts": 4, "moe_top_k": 2,
                    "moe_normalize_expert_weights": 1.0}},
]
KEYS = sorted({k for c in FAMILY_CONFIGS for k in c}
              | {k for f in FAMILIES.values() for k in f.defaults}
              | {"rope_scaling", "partial_rotary_factor", "attention_bias", "qkv_bias",
                 "attn_config", "ffn_config", "kv_n_heads", "clip_qkv", "ffn_hidden_size",
                 "moe_num_experts", "moe_top_k", "moe_normalize_expert_weights", "ffn_act_fn"})

SAFETENSORS_PATH = scratch_path("convert") + ".safetensors"


def any_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> object:
    kind = fdp.ConsumeIntInRange(0, 9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-4, 70)
    if kind == 3:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 16))
    if kind == 4:
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if kind == 5:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if kind == 6:
        return fdp.PickValueInList(["default", "linear", "yarn", "sliding_attention",
                                    "full_attention"])
    if kind in (7, 8):
        return [any_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {fdp.PickValueInList(KEYS + ["type", "factor", "rope_type"]): any_value(fdp, depth + 1)
            for _ in range(fdp.ConsumeIntInRange(0, 3))}


def config_from(fdp: atheris.FuzzedDataProvider) -> object:
    if fdp.ConsumeIntInRange(0, 3) == 0:
        try:
            return json.loads(fdp.ConsumeBytes(fdp.remaining_bytes()))
        except (ValueError, RecursionError):  # not the converter's code: json itself
            return None
    config = dict(fdp.PickValueInList(FAMILY_CONFIGS))
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        config[fdp.PickValueInList(KEYS)] = any_value(fdp)
    return config


def fuzz_config(fdp: atheris.FuzzedDataProvider) -> None:
    raw = config_from(fdp)
    try:
        convert.architecture_from_config(raw)
    except convert.ConversionError:
        pass


def fuzz_safetensors(data: bytes) -> None:
    with open(SAFETENSORS_PATH, "wb") as f:
        f.write(data)
    try:
        convert.read_safetensors_header(SAFETENSORS_PATH)
    except convert.ConversionError:
        pass


def test_one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        fuzz_safetensors(data[1:])
    else:
        fuzz_config(atheris.FuzzedDataProvider(data[1:]))


if __name__ == "__main__":
    run(test_one_input, SAFETENSORS_PATH)
