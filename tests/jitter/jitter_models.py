"""Models for the routing-jitter tests (imported as a plain module: tests have no packages).

`make_selection_tie_model`: a DeepSeek-V3-style rule (sigmoid + correction bias, groups) whose
layer-0 correction bias is set so that, at one position of a prompt, the lowest chosen expert and
the best unchosen one tie exactly on the selection score although their router logits are far
apart: a near-tie only the selection score shows.

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

from colibri.engine import Model, Session

from tiny_models import (V3_RULE, arch_hparams, arch_tensors, make_tiny_model, storage_dtype,
                         tokenizer_json)

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


def make_selection_tie_model(directory: Path, tokens: list[int], position: int
                             ) -> tuple[Path, tuple[int, int]]:
    """(path, (chosen, unchosen)): the tiny V3_RULE model with layer 0's correction bias of the
    best unchosen expert at `position` raised by the selection-score gap, so the two tie there."""
    tm = make_tiny_model(directory, "mixtral", n_layers=3, n_experts=8, top_k=2,
                         dense_layers=(1,), rule=V3_RULE)
    with Model.open(tm.path) as model, Session(model, max_context=len(tokens)) as s:
        s.prefill(tokens)
        sel = s.trace.selection_scores[position, 0].copy()
        chosen = [int(e) for e in s.trace.expert_ids[position, 0]]
        kept = int(s.trace.chosen_groups[position, 0, 0])
    a = chosen[-1]
    b = max((e for e in range(4 * kept, 4 * kept + 4) if e not in chosen), key=lambda e: sel[e])
    values = dict(tm.values)
    bias = values["layers.0.moe_correction_bias"].copy()
    bias[b] = np.float32(bias[b] + (sel[a] - sel[b]))
    values["layers.0.moe_correction_bias"] = bias
    specs = ff.tensor_specs_from_arrays((n, values[n], tm.dtypes[n]) for n in values)
    rules = [V3_RULE if k == ff.LAYER_MOE else None for k in tm.layer_kinds]
    plan = ff.plan_file(tm.hparams, tm.layer_kinds, specs, tokenizer=tm.tokenizer_json,
                        metadata={"test": "selection-score tie"}, rules=rules)
    path = directory / "selection-tie.colibri"
    ff.write_colibri(path, plan)
    return path, (a, b)
