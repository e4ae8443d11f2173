"""Models for the routing-jitter tests (imported as a plain module: tests have no packages).

`make_tie_model`: a Mixtral-shaped tiny model whose layer-0 router has rows
    r0 = 2g, r1 = g, r2 = g, r3 = -g
so the router logits of every token are (2a, a, a, -a) with a = g . xn: experts 1 and 2 are
*exactly* equal (identical rows, identical arithmetic) and always straddle the top-2 boundary
(a > 0: 2a > a = a > -a; a < 0: -a > a = a > 2a). Plain top-k must pick expert 1 (lower index);
stable top-k with eps > 0 must pick expert 2. Layer 1 routes with a random gate.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from colibri import fileformat as ff

from tiny_models import arch_hparams, arch_tensors, storage_dtype, tokenizer_json

TIE_LAYER = 0
TIED = (1, 2)


def make_tie_model(directory: Path, seed: int = 3) -> Path:
    hp = arch_hparams("mixtral", 2, 4, 2, 32, 50, (), -1)
    kinds = [ff.LAYER_MOE, ff.LAYER_MOE]
    rng = np.random.default_rng(seed)
    values = arch_tensors(hp, kinds, rng)
    g = (rng.standard_normal(hp.d_model) / np.sqrt(hp.d_model)).astype(np.float32) * 3.0
    values[f"layers.{TIE_LAYER}.moe_gate"] = np.stack([2 * g, g, g, -g]).astype(np.float32)
    specs = ff.tensor_specs_from_arrays(
        (name, v, storage_dtype(name, v, "f32")) for name, v in values.items())
    plan = ff.plan_file(hp, kinds, specs, tokenizer=tokenizer_json(hp.vocab_size),
                        metadata={"test": "exact router tie"})
    path = directory / "tie.colibri"
    ff.write_colibri(path, plan)
    return path


def make_wide_model(directory: Path, arch: str = "qwen2_moe", dtype: str = "f16") -> Path:
    """Rows long enough (hidden 128, 8 experts, vocab 256) for the kernels' thread pool to split
    the products, as tests/quant_models.py builds them."""
    hp = arch_hparams(arch, 3, 8, 2, 128, 256, (), -1)
    hp = replace(hp, d_ff_expert=96, max_context=256, d_ff_shared=64 if hp.d_ff_shared else 0)
    kinds = [ff.LAYER_MOE] * 3
    values = arch_tensors(hp, kinds, np.random.default_rng(0))
    specs = ff.tensor_specs_from_arrays(
        (name, v, storage_dtype(name, v, dtype)) for name, v in values.items())
    plan = ff.plan_file(hp, kinds, specs, tokenizer=tokenizer_json(hp.vocab_size))
    path = directory / f"wide-{arch}-{dtype}.colibri"
    ff.write_colibri(path, plan)
    return path
