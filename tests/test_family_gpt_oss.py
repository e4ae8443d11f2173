"""GPT-OSS's conversion: the fused, transposed experts with interleaved gate and up columns, the
MXFP4 experts of published checkpoints (built here: blocks and scales written the way OpenAI's
checkpoints hold them, the reference dequantised by transformers' own integration), and the
config defaults transformers fills in.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf_reference = pytest.importorskip("hf_reference")

from safetensors.numpy import load_file, save_file  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402

import colibri  # noqa: E402
from colibri.convert import ConversionError, convert  # noqa: E402
from colibri.families import architecture_from_config  # noqa: E402
from colibri.families.gpt_oss import FP4_VALUES  # noqa: E402
from colibri.fileformat import LAYER_FULL, LAYER_SLIDING, ROPE_YARN  # noqa: E402

from test_conformance import greedy, prompt_for  # noqa: E402

VARIANT = next(v for v in hf_reference.VARIANTS if v.name == "gpt_oss-yarn-alternating-clamped")


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., n] float32 -> (blocks [..., n/32, 16] uint8, scales [..., n/32] uint8): per block of
    32, the power of two that brings its largest magnitude to at most 6, each value the nearest
    FP4 code (the low nibble holds the even element)."""
    x = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(x).max(-1)
    exp = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int32)
    scaled = x / np.exp2(exp)[..., None]
    codes = np.abs(scaled[..., None] - FP4_VALUES).argmin(-1).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exp + 127).astype(np.uint8)


def mxfp4_checkpoint(model: torch.nn.Module, directory: Path) -> None:
    """Save `model` as a published GPT-OSS checkpoint holds it: every expert matrix as MXFP4
    blocks and scales (gate_up_proj [E, H, 2I] as [E, 2I, H/32, 16] + [E, 2I, H/32], down_proj
    [E, I, H] as [E, H, I/32, 16] + [E, H, I/32]) and config.json's quantization_config; then
    give the model the values transformers dequantises them to."""
    model.save_pretrained(directory)
    tensors = load_file(directory / "model.safetensors")
    for layer, block in enumerate(model.model.layers):
        experts = block.mlp.experts
        prefix = f"model.layers.{layer}.mlp.experts"
        for proj in ("gate_up_proj", "down_proj"):
            rows = np.ascontiguousarray(tensors.pop(f"{prefix}.{proj}").transpose(0, 2, 1))
            blocks, scales = quantize_mxfp4(rows)
            tensors[f"{prefix}.{proj}_blocks"] = blocks
            tensors[f"{prefix}.{proj}_scales"] = scales
            with torch.no_grad():
                getattr(experts, proj).copy_(convert_moe_packed_tensors(
                    torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32))
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (directory / "config.json").write_text(json.dumps(config))


def test_mxfp4_experts_convert_to_what_transformers_dequantises(tmp_path: Path) -> None:
    model = hf_reference.build(VARIANT)
    mxfp4_checkpoint(model, tmp_path / "hf")
    out = tmp_path / "m.colibri"
    convert(tmp_path / "hf", out, dtype="f32")
    with colibri.Model.open(out) as m:
        for layer, block in enumerate(model.model.layers):
            gate_up = block.mlp.experts.gate_up_proj.detach().numpy()       # [E, H, 2I]
            down = block.mlp.experts.down_proj.detach().numpy()             # [E, I, H]
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w1"),
                                          gate_up[:, :, 0::2].transpose(0, 2, 1))
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w3"),
                                          gate_up[:, :, 1::2].transpose(0, 2, 1))
            np.testing.assert_array_equal(m.tensor(f"layers.{layer}.moe_w2"),
                                          down.transpose(0, 2, 1))


def test_an_mxfp4_checkpoint_runs_as_transformers_runs_it(tmp_path: Path) -> None:
    """Conformance on the dequantised model, stored bf16: MXFP4 values are exact in bf16."""
    model = hf_reference.build(VARIANT)
    mxfp4_checkpoint(model, tmp_path / "hf")
    out = tmp_path / "m.colibri"
    convert(tmp_path / "hf", out, dtype="bf16")
    hf_reference.round_like_converter(model, "bf16")
    prompt = prompt_for(VARIANT)
    reference = hf_reference.run(model, prompt, 8)
    with colibri.Model.open(out) as m:
        logits = colibri.Session(m).prefill(prompt)
        scale = max(1.0, float(np.abs(reference.logits).max()))
        assert np.abs(logits - reference.logits).max() <= 1e-3 * scale
        assert greedy(m, prompt, 8) == reference.generated


def test_fused_experts_are_deinterleaved_and_transposed(tmp_path: Path) -> None:
    """moe_w1 = the even columns of gate_up_proj, moe_w3 the odd ones, each [I, H]; moe_w2 =
    down_proj transposed; their biases likewise, kept f32 in a bf16 file."""
    model = hf_reference.build(VARIANT)
    hf_dir = hf_reference.save(model, tmp_path / "hf")
    out = tmp_path / "m.colibri"
    convert(hf_dir, out, dtype="bf16")
    experts = model.model.layers[1].mlp.experts
    gate_up_bias = experts.gate_up_proj_bias.detach().numpy()
    with colibri.Model.open(out) as m:
        np.testing.assert_array_equal(m.tensor("layers.1.moe_w1_bias"), gate_up_bias[:, 0::2])
        np.testing.assert_array_equal(m.tensor("layers.1.moe_w3_bias"), gate_up_bias[:, 1::2])
        np.testing.assert_array_equal(m.tensor("layers.1.moe_w2_bias"),
                                      experts.down_proj_bias.detach().numpy())
        w1 = m.tensor_f32("layers.1.moe_w1")
        bf16 = experts.gate_up_proj.detach().to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(w1, bf16[:, :, 0::2].transpose(0, 2, 1))
        assert m.tensor_info("layers.1.moe_w1_bias").dtype == "f32"
        np.testing.assert_array_equal(m.tensor("layers.0.attn_sinks"),
                                      model.model.layers[0].self_attn.sinks.detach().numpy())


def _config(**changes: object) -> dict:
    return {"model_type": "gpt_oss", **{k: v for k, v in VARIANT.config.items()
                                        if v is not None}, **changes}


def test_a_config_without_rope_parameters_means_yarn() -> None:
    """GptOssConfig.__post_init__ fills in YaRN (factor 32 over 4096 positions, truncate off)
    and alternating layer types when config.json has neither."""
    arch = architecture_from_config(_config())
    hp = arch.hp
    assert (hp.rope_type, hp.rope_factor, hp.rope_original_max_context) == (ROPE_YARN, 32.0, 4096)
    assert (hp.rope_truncate, hp.rope_theta) == (0, 150000.0)
    assert hp.rope_attn_factor == pytest.approx(0.1 * np.log(32.0) + 1.0)
    assert [a.mask for a in arch.attention] == [LAYER_SLIDING, LAYER_FULL]
    assert all(a.sinks for a in arch.attention)


@pytest.mark.parametrize("changes, message", [
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"swiglu_limit": 0}, "swiglu_limit"),
    ({"sliding_window": None}, "sliding_window"),
])
def test_configs_the_engine_would_not_run_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        architecture_from_config(_config(**changes))
