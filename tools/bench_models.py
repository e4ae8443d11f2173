"""Build the benchmark models: a Mixtral-shaped MoE of about 0.64 B parameters (hidden 1024,
8 layers, 8 experts, top-2, expert intermediate 2816, 16 heads / 4 KV heads, vocab 32000) with
random weights, saved with transformers, then converted to .colibri in f32, bf16, q8 and q4.

With `--wide`, one layer of Mixtral-8x7B's shapes instead (hidden 4096, expert intermediate
14336, 32 heads / 8 KV heads, 8 experts, top-2, vocab 32000: 1.7 B parameters, 6.9 GB in f32), to
measure the products of a large model end to end.

With `--qwen3`, a Qwen3-MoE-shaped model of 0.71 B parameters: Qwen3-30B-A3B with its widths
halved (hidden 1024, expert intermediate 384, 16 heads / 4 KV heads of head_dim 128, q/k norms),
8 layers, 64 experts, top-8 with renormalised weights, vocab 32000, untied LM head.

With `--deepseek`, a DeepSeek-V3-shaped model of about 0.45 B parameters: hidden 1024, 8 layers
(the first dense), 32 routed experts of intermediate 512 in 4 groups of which 2 are kept, top-4,
one shared expert, sigmoid scores with a correction bias, routed scaling 2.5, and latent
attention (16 heads, q_lora_rank 384, kv_lora_rank 256, nope 64, rope 32, value 64).

Random weights are fine for speed; the router weights are scaled so routing is not degenerate
(logits spread over several units, every expert chosen). The models live outside the repository
(default /work/bench-models) and are not committed.

    python tools/bench_models.py [--out /work/bench-models] [--formats f32,bf16,q8,q4] [--wide|--qwen3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
              num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
              num_experts_per_tok=2, max_position_embeddings=4096, rms_norm_eps=1e-5,
              rope_theta=1e6, tie_word_embeddings=False)
WIDE = dict(CONFIG, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
            num_attention_heads=32, num_key_value_heads=8)
QWEN3 = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=384,
             num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=128,
             num_experts=64, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
             mlp_only_layers=[], max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6,
             tie_word_embeddings=False)
DEEPSEEK = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                moe_intermediate_size=512, num_hidden_layers=8, num_attention_heads=16,
                num_key_value_heads=16, n_routed_experts=32, num_experts_per_tok=4, n_group=4,
                topk_group=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=256,
                q_lora_rank=384, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                max_position_embeddings=4096, rms_norm_eps=1e-6, routed_scaling_factor=2.5,
                norm_topk_prob=True, tie_word_embeddings=False)
# The bench models by name: (files' name prefix, config)
MODELS = {"mixtral": ("mixtral-0.64b", CONFIG), "wide": ("mixtral-wide-1layer", WIDE),
          "qwen3": ("qwen3-moe-0.71b", QWEN3), "deepseek": ("deepseek-v3-0.45b", DEEPSEEK)}


def _model_classes(config_args: dict[str, Any]) -> tuple[Any, Any]:
    """(config class, model class): Qwen3-MoE's config names its experts `num_experts`,
    DeepSeek-V3's `n_routed_experts`."""
    import transformers

    if "n_routed_experts" in config_args:
        return transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM

    if "num_experts" in config_args:
        return transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM
    return transformers.MixtralConfig, transformers.MixtralForCausalLM


def build_hf(directory: Path, config_args: dict[str, Any] = CONFIG, seed: int = 0) -> Path:
    import torch

    if (directory / "config.json").exists():
        return directory
    config_class, model_class = _model_classes(config_args)
    config = config_class(**config_args)
    torch.manual_seed(seed)
    with torch.no_grad():
        model = model_class(config).eval()
        g = torch.Generator().manual_seed(seed + 1)
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.copy_(torch.randn(param.shape, generator=g) * 0.1)
            elif "norm" in name:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=g) * 0.02)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=g) * 0.05)
    n = sum(p.numel() for p in model.parameters())
    print(f"built {config.model_type}-shaped model: {n / 1e9:.3f} B parameters", flush=True)
    model.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/work/bench-models")
    parser.add_argument("--formats", default="f32,bf16,q8,q4")
    parser.add_argument("--wide", action="store_true", help="one layer of Mixtral-8x7B's shapes")
    parser.add_argument("--qwen3", action="store_true", help="the Qwen3-MoE-shaped model")
    parser.add_argument("--deepseek", action="store_true", help="a DeepSeek-V3-shaped model")
    args = parser.parse_args(argv)
    from colibri.convert import convert

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name, config = MODELS["wide" if args.wide else "qwen3" if args.qwen3 else
                          "deepseek" if args.deepseek else "mixtral"]
    hf = build_hf(out / f"{name}-hf", config)
    for fmt in args.formats.split(","):
        path = out / f"{name}-{fmt}.colibri"
        if path.exists():
            continue
        dtype, quant = (fmt, None) if fmt in ("f32", "f16", "bf16") else ("bf16", fmt)
        print(f"converting {path.name} (dtype {dtype}, quantize {quant})", flush=True)
        convert(str(hf), str(path), dtype, quantize=quant) if quant else convert(str(hf), str(path), dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
