"""Colibri against Hugging Face transformers, family by family.

Each variant is a small random model built by transformers with a fixed seed, saved the standard
way, converted with `colibri convert`, and run by the engine on a 40-token prompt. A family counts
as supported only when all of these hold for all of its variants:
- logits at every position within 1e-4 * max(1, max|logit|) (f32 weights) or 1e-3 (f16/bf16, with
  the reference run in f32 on the same rounded weights; bf16 stored in 16-row panels, the
  `bf16-panels` layout, too);
- the router logits and the selection scores (what the rule ranks: sigmoid + correction bias for
  DeepSeek-V3, ...) within 10 times that;
- the same top-k expert set, and the same kept groups, at every (position, MoE layer) where the
  reference's selection margin (colibri.margins: the expert gap, or the group gap when closer)
  exceeds 1e-4;
- the same 16 greedily generated tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf_reference = pytest.importorskip("hf_reference")

import colibri  # noqa: E402
from colibri.convert import convert  # noqa: E402
from colibri.margins import group_limits, selection_margins  # noqa: E402

PROMPT_LENGTH = 40
N_GENERATE = 16
TOLERANCE = {"f32": 1e-4, "f16": 1e-3, "bf16": 1e-3, "bf16-panels": 1e-3}


def prompt_for(variant: hf_reference.Variant) -> list[int]:
    rng = np.random.default_rng(1234)
    return [int(t) for t in rng.integers(0, variant.config["vocab_size"], PROMPT_LENGTH)]


def colibri_file(variant: hf_reference.Variant, dtype: str, tmp_path: Path):
    """(reference, path of the converted file) for one variant and storage dtype."""
    model = hf_reference.build(variant)
    hf_dir = hf_reference.save(model, tmp_path / "hf")
    out = tmp_path / f"{variant.name}-{dtype}.colibri"
    if dtype == "bf16-panels":  # bf16 values, the matrices of whole panels stored as bf16x16
        convert(hf_dir, out, dtype="bf16", layout="bf16-panels")
        dtype = "bf16"
    else:
        convert(hf_dir, out, dtype=dtype)
    if dtype != "f32":
        hf_reference.round_like_converter(model, dtype)
    reference = hf_reference.run(model, prompt_for(variant), N_GENERATE)
    return reference, out


def greedy(model: colibri.Model, prompt: list[int], n: int) -> list[int]:
    session = colibri.Session(model)
    logits = session.prefill(prompt)[-1]
    out = []
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = session.step(token)
    return out


def routing_disagreements(trace: colibri.Trace, reference: hf_reference.Reference,
                          model: colibri.Model) -> list[tuple[int, int]]:
    """(position, moe layer) pairs whose expert sets or kept groups differ although the
    reference's decision was more than 1e-4 from going another way."""
    margin, _ = selection_margins(reference.selection_scores, reference.expert_ids,
                                  reference.chosen_groups, group_limits(model),
                                  model.hparams.n_experts_active)
    decisive = ~(margin <= 1e-4)  # NaN (no margin at all) counts as decisive
    mismatches = []
    for pos, layer in zip(*np.nonzero(decisive)):
        same = set(trace.expert_ids[pos, layer].tolist()) == set(
            reference.expert_ids[pos, layer].tolist())
        if reference.chosen_groups.shape[2]:
            same &= set(trace.chosen_groups[pos, layer].tolist()) == set(
                reference.chosen_groups[pos, layer].tolist())
        if not same:
            mismatches.append((int(pos), int(layer)))
    return mismatches


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "bf16-panels"])
@pytest.mark.parametrize("variant", hf_reference.VARIANTS, ids=str)
def test_engine_matches_transformers(variant, dtype, tmp_path):
    reference, path = colibri_file(variant, dtype, tmp_path)
    prompt = prompt_for(variant)
    with colibri.Model.open(path) as model:
        if dtype == "bf16-panels" and not any(t.dtype == "bf16x16" for t in model.tensors):
            pytest.skip("no matrix of whole 16-row panels (odd dimensions): the bf16 case")
        session = colibri.Session(model)
        logits = session.prefill(prompt)
        trace = session.trace

        scale = max(1.0, float(np.abs(reference.logits).max()))
        worst = np.abs(logits - reference.logits).max(axis=-1)
        assert worst.max() <= TOLERANCE[dtype] * scale, (
            f"logits differ by {worst.max():.3g} (scale {scale:.3g}) first at position "
            f"{int(np.argmax(worst > TOLERANCE[dtype] * scale))}")

        np.testing.assert_allclose(trace.router_logits, reference.router_logits,
                                   atol=TOLERANCE[dtype] * 10, rtol=0)
        np.testing.assert_allclose(trace.selection_scores, reference.selection_scores,
                                   atol=TOLERANCE[dtype] * 10, rtol=0)
        assert routing_disagreements(trace, reference, model) == []

        assert greedy(model, prompt, N_GENERATE) == reference.generated


@pytest.mark.parametrize("variant", [v for v in hf_reference.VARIANTS if v.rule_matters], ids=str)
def test_the_variant_exercises_its_routing_rule(variant, tmp_path):
    """The test above has power over the rule: transformers' choices, which the engine matched,
    differ from a plain top-k of the router logits at some decisions of the prompt."""
    model = hf_reference.build(variant)
    reference = hf_reference.run(model, prompt_for(variant), N_GENERATE)
    k = reference.expert_ids.shape[2]
    plain = np.sort(np.argsort(-reference.router_logits, axis=-1, kind="stable")[..., :k], -1)
    assert (plain != np.sort(reference.expert_ids, -1)).any(-1).sum() > 0


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
@pytest.mark.parametrize("variant", [v for v in hf_reference.VARIANTS if v.name.endswith("base")
                                     or "shared" in v.name], ids=str)
def test_round_trip_through_the_engine_equals_the_source(variant, fused, tmp_path):
    """convert -> Model.open -> every tensor, read through the engine's zero-copy views, equals
    the Hugging Face parameter it came from (stacked experts against the per-expert slices)."""
    model = hf_reference.build(variant)
    hf_dir = tmp_path / "hf"
    model.save_pretrained(hf_dir, save_original_format=not fused)
    out = tmp_path / "m.colibri"
    convert(hf_dir, out, dtype="f32")
    params = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    with colibri.Model.open(out) as m:
        for layer in range(m.hparams.n_layers):
            prefix = f"model.layers.{layer}."
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.attn_q"),
                                          params[prefix + "self_attn.q_proj.weight"])
            if m.routing(layer).kind != "moe":
                continue
            router, experts = hf_reference.moe_block(variant.family)
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_gate"),
                                          params[prefix + router])
            gate_up = params[prefix + experts + ".gate_up_proj"]      # [E, 2I, H]
            inter = gate_up.shape[1] // 2
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w1"), gate_up[:, :inter])
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w3"), gate_up[:, inter:])
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w2"),
                                          params[prefix + experts + ".down_proj"])
        np.testing.assert_array_equal(m.tensor("token_embd"), params["model.embed_tokens.weight"])
        np.testing.assert_array_equal(m.tensor("output_norm"), params["model.norm.weight"])


def test_dbrx_fused_tensors_round_trip(tmp_path):
    """DBRX's own layout through the converter: Wqkv's rows split into q, k and v; the experts'
    rows [E*I, H] stacked per expert, w2 transposed to the down projection [E, H, I]."""
    variant = next(v for v in hf_reference.VARIANTS if v.family == "dbrx")
    model = hf_reference.build(variant)
    convert(hf_reference.save(model, tmp_path / "hf"), tmp_path / "m.colibri", dtype="f32")
    params = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    with colibri.Model.open(tmp_path / "m.colibri") as m:
        hp = m.hparams
        E, I, H = hp.n_experts, hp.d_ff_expert, hp.d_model
        q, kv = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
        for layer in range(hp.n_layers):
            src = f"transformer.blocks.{layer}."
            wqkv = params[src + "norm_attn_norm.attn.Wqkv.weight"]
            for name, rows in (("attn_q", wqkv[:q]), ("attn_k", wqkv[q:q + kv]),
                               ("attn_v", wqkv[q + kv:])):
                np.testing.assert_array_equal(m.tensor(f"layers.{layer}.{name}"), rows)
            experts = src + "ffn.experts.mlp."
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w1"),
                                          params[experts + "w1"].reshape(E, I, H))
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w3"),
                                          params[experts + "v1"].reshape(E, I, H))
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w2"),
                                          params[experts + "w2"].reshape(E, I, H).transpose(0, 2, 1))
