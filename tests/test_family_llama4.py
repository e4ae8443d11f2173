"""Llama 4's conversion: the multimodal `llama4` checkpoint's text model (text_config, tensors
under `language_model.`), the per-expert layout beside transformers' fused and transposed one,
the layer layout Llama4TextConfig derives when config.json does not spell it out, llama3 RoPE,
and the configs the engine would not run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf_reference = pytest.importorskip("hf_reference")

import transformers  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import colibri  # noqa: E402
from colibri.convert import ConversionError, convert  # noqa: E402
from colibri.families import architecture_from_config  # noqa: E402
from colibri.fileformat import (LAYER_CHUNKED, LAYER_DENSE, LAYER_FULL, LAYER_MOE,  # noqa: E402
                                ROPE_LLAMA3)

from test_conformance import greedy, prompt_for  # noqa: E402

VARIANT = next(v for v in hf_reference.VARIANTS
               if v.name == "llama4-interleaved-nope-chunked-top1")
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
              image_size=28, patch_size=14, vision_output_dim=64, projector_input_dim=64,
              projector_output_dim=64)


def test_a_multimodal_checkpoint_converts_its_text_model(tmp_path: Path) -> None:
    """Llama4ForConditionalGeneration saved whole: the converter reads text_config and the
    `language_model.` tensors, leaves the vision tower, and the file runs as the text model."""
    text = hf_reference.build(VARIANT)
    config = transformers.Llama4Config(text_config=text.config.to_dict(), vision_config=VISION)
    whole = transformers.Llama4ForConditionalGeneration(config).eval()
    whole.language_model.load_state_dict(text.state_dict())
    whole.save_pretrained(tmp_path / "hf")
    out = tmp_path / "m.colibri"
    convert(tmp_path / "hf", out)
    prompt = prompt_for(VARIANT)
    reference = hf_reference.run(text, prompt, 8)
    with torch.no_grad():
        whole_logits = whole(torch.tensor([prompt])).logits[0].numpy()
    np.testing.assert_allclose(whole_logits, reference.logits, rtol=0, atol=1e-5)
    with colibri.Model.open(out) as m:
        assert m.arch == "llama4" and m.metadata["user"]["source"]["model_type"] == "llama4"
        logits = colibri.Session(m).prefill(prompt)
        assert np.abs(logits - reference.logits).max() <= 1e-4 * max(
            1.0, float(np.abs(reference.logits).max()))
        assert greedy(m, prompt, 8) == reference.generated


def test_per_expert_tensors_convert_as_the_fused_ones(tmp_path: Path) -> None:
    """experts.E.gate_proj/up_proj/down_proj give the same file as transformers' fused,
    transposed gate_up_proj [E, H, 2I] (gate columns first) and down_proj [E, I, H]."""
    model = hf_reference.build(VARIANT)
    fused_dir = hf_reference.save(model, tmp_path / "fused")
    tensors = load_file(fused_dir / "model.safetensors")
    for name in [n for n in tensors if n.endswith("experts.gate_up_proj")]:
        prefix = name.removesuffix("gate_up_proj")
        gate_up, down = tensors.pop(name), tensors.pop(prefix + "down_proj")
        inter = gate_up.shape[2] // 2
        for e in range(gate_up.shape[0]):
            tensors[f"{prefix}{e}.gate_proj.weight"] = np.ascontiguousarray(gate_up[e, :, :inter].T)
            tensors[f"{prefix}{e}.up_proj.weight"] = np.ascontiguousarray(gate_up[e, :, inter:].T)
            tensors[f"{prefix}{e}.down_proj.weight"] = np.ascontiguousarray(down[e].T)
    per_expert_dir = tmp_path / "per-expert"
    per_expert_dir.mkdir()
    (per_expert_dir / "config.json").write_bytes((fused_dir / "config.json").read_bytes())
    save_file(tensors, per_expert_dir / "model.safetensors", metadata={"format": "pt"})
    convert(fused_dir, tmp_path / "a.colibri")
    convert(per_expert_dir, tmp_path / "b.colibri")
    with colibri.Model.open(tmp_path / "a.colibri") as a, \
            colibri.Model.open(tmp_path / "b.colibri") as b:
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        for t in a.tensors:
            np.testing.assert_array_equal(a.tensor(t.name), b.tensor(t.name))
        w1 = a.tensor("layers.1.moe_w1")
        gate_up = model.model.layers[1].feed_forward.experts.gate_up_proj.detach().numpy()
        np.testing.assert_array_equal(w1, gate_up[:, :, :32].transpose(0, 2, 1))


def _config(**changes: object) -> dict:
    return {"model_type": "llama4_text", **{k: v for k, v in VARIANT.config.items()
                                            if v is not None}, **changes}


def test_the_layer_layout_llama4textconfig_derives() -> None:
    """Without moe_layers, no_rope_layers and layer_types: MoE every
    interleave_moe_layer_step-th layer, no RoPE on every no_rope_layer_interval-th, chunked
    attention where RoPE is, the L2 norm there and the query temperature elsewhere."""
    arch = architecture_from_config(_config(num_hidden_layers=8, no_rope_layer_interval=3,
                                            interleave_moe_layer_step=3))
    assert arch.kinds == [LAYER_DENSE, LAYER_DENSE, LAYER_MOE] * 2 + [LAYER_DENSE] * 2
    nope = [a.no_rope for a in arch.attention]
    assert nope == [False, False, True, False, False, True, False, False]
    assert [a.mask for a in arch.attention] == [LAYER_FULL if n else LAYER_CHUNKED for n in nope]
    assert [a.qk_l2_norm for a in arch.attention] == [not n for n in nope]
    assert [a.temperature_floor for a in arch.attention] == [4 if n else 0 for n in nope]
    assert arch.hp.attention_chunk_size == 8 and arch.hp.d_ff_shared == 32
    rule = arch.rule(2)
    assert rule.weight_inputs and rule.shared and not rule.expert_bias


def test_llama3_rope_parameters_are_stored() -> None:
    variant = next(v for v in hf_reference.VARIANTS if "llama3" in v.name)
    hp = architecture_from_config({"model_type": "llama4_text", **{
        k: v for k, v in variant.config.items() if v is not None}}).hp
    assert (hp.rope_type, hp.rope_factor, hp.rope_original_max_context) == (ROPE_LLAMA3, 8.0, 64)
    assert (hp.rope_low_freq_factor, hp.rope_high_freq_factor) == (1.0, 8.0)


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"layer_types": ["sliding_attention"] * 4}, "layer_types"),
    ({"no_rope_layers": [1, 1]}, "no_rope_layers"),
    ({"attention_chunk_size": None}, "attention_chunk_size"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 64}}, "high_freq_factor"),
])
def test_configs_the_engine_would_not_run_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        architecture_from_config(_config(**changes))


def test_a_multimodal_config_needs_its_text_config() -> None:
    with pytest.raises(ConversionError, match="text_config"):
        architecture_from_config({"model_type": "llama4"})
    arch = architecture_from_config({"model_type": "llama4",
                                     "text_config": dataclasses.asdict(VARIANT)["config"]})
    assert arch.hf_prefix == "language_model." and arch.hp.n_layers == 4
