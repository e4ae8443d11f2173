#!/usr/bin/env python3
"""Write the bundled demo model's weights back as a Hugging Face checkpoint, so `colibri diff`
can compare the demo against transformers without retraining it (tools/train_demo.py keeps its
checkpoint only in build/demo-hf).

    python tools/demo_checkpoint.py OUT_DIR [--file resources/demo/demo.colibri]

The checkpoint is MixtralForCausalLM (transformers 5.23's fused expert parameters) holding the
file's values exactly, in float32: the f16 weights widened, the f32 norms and routers as they
are, the embedding tied to the LM head as the demo was trained; its config is the file's
hyper-parameters and its tokenizer.json the file's own. Needs the `reference` extra (torch,
transformers).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import transformers

from colibri.engine import Model

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"


def state_dict(model: Model) -> dict[str, torch.Tensor]:
    """transformers' Mixtral names for the file's tensors (gate_up_proj = [w1; w3] per expert,
    the gate first, as MixtralExperts splits it)."""
    def t(name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(model.tensor_f32(name)))

    sd = {"model.embed_tokens.weight": t("token_embd"), "model.norm.weight": t("output_norm"),
          "lm_head.weight": t("token_embd")}
    for layer in range(model.hparams.n_layers):
        hf, ours = f"model.layers.{layer}.", f"layers.{layer}."
        for proj, name in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                           ("o_proj", "attn_o")):
            sd[f"{hf}self_attn.{proj}.weight"] = t(ours + name)
        sd[f"{hf}input_layernorm.weight"] = t(ours + "attn_norm")
        sd[f"{hf}post_attention_layernorm.weight"] = t(ours + "ffn_norm")
        sd[f"{hf}mlp.gate.weight"] = t(ours + "moe_gate")
        sd[f"{hf}mlp.experts.gate_up_proj"] = torch.cat([t(ours + "moe_w1"), t(ours + "moe_w3")],
                                                        dim=1)
        sd[f"{hf}mlp.experts.down_proj"] = t(ours + "moe_w2")
    return sd


def write_checkpoint(path: str | Path, out: str | Path) -> None:
    with Model.open(path) as model:
        hp = model.hparams
        if model.arch != "mixtral" or hp.n_moe_layers != hp.n_layers:
            raise SystemExit(f"{path}: not a Mixtral file like the demo ({model.arch})")
        config = transformers.MixtralConfig(
            vocab_size=hp.vocab_size, hidden_size=hp.d_model, intermediate_size=hp.d_ff_expert,
            num_hidden_layers=hp.n_layers, num_attention_heads=hp.n_heads,
            num_key_value_heads=hp.n_kv_heads, num_local_experts=hp.n_experts,
            num_experts_per_tok=hp.n_experts_active, max_position_embeddings=hp.max_context,
            rope_theta=hp.rope_theta, rms_norm_eps=float(np.float32(hp.norm_eps)),
            tie_word_embeddings=True, bos_token_id=None, eos_token_id=hp.eos_token_id,
            pad_token_id=None)
        hf = transformers.MixtralForCausalLM(config)
        hf.load_state_dict(state_dict(model), strict=True)
        out = Path(out)
        hf.save_pretrained(out)
        (out / "tokenizer.json").write_text(model.tokenizer.to_str())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the checkpoint directory to write")
    ap.add_argument("--file", default=str(DEMO))
    args = ap.parse_args()
    write_checkpoint(args.file, args.out)
    print(f"wrote {args.out}: {args.file}'s weights as a MixtralForCausalLM checkpoint")


if __name__ == "__main__":
    main()
