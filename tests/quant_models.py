"""Models for the kernel and quantisation tests: the conformance-shaped tiny models of conftest,
widened so every matrix row is a multiple of 32 (hidden 128, expert intermediate 96, 8 experts,
top-2), stored in f32/f16/bf16 with optional q8_0/q4_0 matrices, in rows or (layout "panels")
in 8-row panels (q8_0x8/q4_0x8) wherever a matrix's rows are a multiple of 8."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from colibri import fileformat as ff
from tiny_models import arch_hparams, arch_tensors, tokenizer_json

QUANT_SETS = {
    "experts": ("moe_w1", "moe_w2", "moe_w3"),
    "all": ("moe_w1", "moe_w2", "moe_w3", "shared_w1", "shared_w2", "shared_w3", "mlp_w1",
            "mlp_w2", "mlp_w3", "attn_q", "attn_k", "attn_v", "attn_o", "output", "token_embd"),
}


def make_model(directory: Path, arch: str = "mixtral", dtype: str = "f32", quant: str | None = None,
               which: str = "experts", *, d_model: int = 128, d_ff: int = 96, n_layers: int = 3,
               n_experts: int = 8, top_k: int = 2, vocab: int = 256, seed: int = 0,
               layout: str = "rows") -> Path:
    hp = arch_hparams(arch, n_layers, n_experts, top_k, d_model, vocab, (), -1)
    hp = replace(hp, d_ff_expert=d_ff, max_context=256, d_ff_shared=64 if hp.d_ff_shared else 0)
    kinds = [ff.LAYER_MOE] * n_layers
    values = arch_tensors(hp, kinds, np.random.default_rng(seed))
    for name in values:  # decisive routing, as the conformance models have
        if name.endswith("moe_gate"):
            values[name] *= 3.0
    specs = []
    for name, v in values.items():
        base = name.rsplit(".", 1)[-1]
        if v.ndim == 1 or base == "moe_gate":
            specs += ff.tensor_specs_from_arrays([(name, v, ff.DTYPE_F32)])
        elif quant and base in QUANT_SETS[which] and v.shape[-1] % 32 == 0:
            q = ff.QUANT_BY_NAME[quant]
            stored = ff.quantize(ff.storage_to_f32(ff.to_storage(v, ff.DTYPE_BY_NAME[dtype]),
                                                   ff.DTYPE_BY_NAME[dtype]), q)
            if layout == "panels" and v.shape[-2] % ff.PANEL_ROWS == 0:
                q, stored = ff.PANEL_OF[q], ff.to_panels(stored, q, v.shape[-1])
            specs.append(ff.TensorSpec(name, q, v.shape, lambda s=stored: s))
        else:
            specs += ff.tensor_specs_from_arrays([(name, v, ff.DTYPE_BY_NAME[dtype])])
    plan = ff.plan_file(hp, kinds, specs, tokenizer=tokenizer_json(vocab),
                        metadata={"source": {"model_type": arch}, "test": True})
    path = directory / f"{arch}-{dtype}-{quant or 'none'}-{which}-H{d_model}-s{seed}-{layout}.colibri"
    ff.write_colibri(path, plan)
    return path
