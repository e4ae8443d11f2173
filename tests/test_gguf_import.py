"""GGUF import against transformers, on files written by llama.cpp's own converter and quantiser
(tests/fixtures/gguf/, made by tools/make_gguf_fixtures.py; see its README).

The fixtures' weights are not committed: each family's model is rebuilt here from the recorded
config and seed (torch is pinned), and the f32 file is first checked to hold exactly those
weights. Then, for every family:
- the f32 and bf16 imports meet the conformance tolerances of tests/test_conformance.py (logits,
  router logits, top-k sets, greedy tokens), the bf16 reference running on bf16-rounded weights;
- the Q8_0 and Q4_0 imports keep llama.cpp's blocks exactly (the values equal the gguf
  package's dequantisation), and Colibri's own q8_0/q4_0 of the same weights are the same bytes;
- the imported tokenizer encodes like the Hugging Face tokenizer the GGUF was made from;
- the header and every layer's routing rule are those the Hugging Face conversion of the same
  checkpoint writes.
Files edited with the gguf package stand for what llama.cpp's pinned converter does not write:
older DeepSeek files (attn_kv_b), other ggml types, keys llama.cpp's graphs would read another
way.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf_reference = pytest.importorskip("hf_reference")

import gguf  # noqa: E402

import colibri  # noqa: E402
from colibri import fileformat  # noqa: E402
from colibri.bench import gguf_weight_bytes_per_token, weight_bytes_per_token  # noqa: E402
from colibri.cli import main  # noqa: E402
from colibri.convert import ConversionError, convert  # noqa: E402
from colibri.convert_gguf import (  # noqa: E402
    CONFIG_ARCHITECTURES, PERMUTED, convert_gguf, repack_blocks,
)
from colibri.formats.gguf_file import GGUFFile  # noqa: E402
from test_conformance import TOLERANCE, greedy, routing_disagreements  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gguf"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text())
FAMILIES = list(MANIFEST["configs"])
PROMPT_LENGTH, N_GENERATE = 40, 16
TEXTS = ["def fill(text, width=70):\n    return '\\n'.join(wrap(text))  # ✓",
         "Hello  world\t\ttabs\n\n  indented 12345 I've they'll",
         "<|endoftext|>import os", "  leading spaces", "ünïcödé 日本語"]


def reference_model(family: str) -> Any:
    variant = hf_reference.Variant(f"{family}-gguf", family, MANIFEST["configs"][family])
    return hf_reference.build(variant, seed=MANIFEST["seed"])


def prompt() -> list[int]:
    rng = np.random.default_rng(1234)
    return [int(t) for t in rng.integers(0, MANIFEST["configs"]["mixtral"]["vocab_size"],
                                         PROMPT_LENGTH)]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """imported(family, kind) -> path of the .colibri import of `<family>-<kind>.gguf`."""
    directory = tmp_path_factory.mktemp("gguf-imports")
    cache: dict[tuple[str, str], Path] = {}

    def get(family: str, kind: str) -> Path:
        if (family, kind) not in cache:
            out = directory / f"{family}-{kind}.colibri"
            convert_gguf(FIXTURES / f"{family}-{kind}.gguf", out)
            cache[family, kind] = out
        return cache[family, kind]
    return get


def test_fixtures_are_the_recorded_files() -> None:
    import hashlib
    for entry in MANIFEST["files"]:
        data = (FIXTURES / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]
    assert {e["file"] for e in MANIFEST["files"]} == {p.name for p in FIXTURES.glob("*.gguf")}


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_fixture_holds_the_rebuilt_weights(family: str) -> None:
    """The rebuild is the model llama.cpp converted (so the comparisons below mean something),
    and for `llama` and `granitemoe` files the q/k rows come back in Hugging Face's order;
    DeepSeek's kv_b_proj is split as the import expects."""
    params = {k: v.detach().numpy() for k, v in reference_model(family).state_dict().items()}
    f = GGUFFile.open(str(FIXTURES / f"{family}-f32.gguf"))
    if family == "dbrx":  # its own names, q/k/v fused
        embd, q = "transformer.wte.weight", f.tensor("blk.0.attn_qkv.weight")[:64]
        expected = params["transformer.blocks.0.norm_attn_norm.attn.Wqkv.weight"][:64]
    elif f.architecture == "deepseek2":  # MLA: kv_b_proj split per head, the key half transposed
        config = MANIFEST["configs"][family]
        nh, c = config["num_attention_heads"], config["kv_lora_rank"]
        nope = config["qk_nope_head_dim"]
        kv_b = params["model.layers.0.self_attn.kv_b_proj.weight"].reshape(nh, -1, c)
        np.testing.assert_array_equal(f.tensor("blk.0.attn_k_b.weight"),
                                      kv_b[:, :nope].transpose(0, 2, 1))
        np.testing.assert_array_equal(f.tensor("blk.0.attn_v_b.weight"), kv_b[:, nope:])
        embd, q = "model.embed_tokens.weight", f.tensor("blk.0.attn_q_a.weight")
        expected = params["model.layers.0.self_attn.q_a_proj.weight"]
    else:
        embd, q = "model.embed_tokens.weight", f.tensor("blk.0.attn_q.weight")
        expected = params["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(f.tensor("token_embd.weight"), params[embd])
    if f.architecture in PERMUTED:
        assert not np.array_equal(q, expected)  # permuted by llama.cpp's converter
    else:
        np.testing.assert_array_equal(q, expected)


@pytest.mark.parametrize("outtype", ["f32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_import_matches_transformers(family: str, outtype: str, imported: Any) -> None:
    model = reference_model(family)
    if outtype != "f32":
        hf_reference.round_like_converter(model, outtype)
        if family == "dbrx":  # llama.cpp's DBRX converter stores every matrix, router included,
            with torch.no_grad():  # in the outtype; the import widens it to f32 exactly
                for layer in model.transformer.blocks:
                    w = layer.ffn.router.layer.weight
                    w.copy_(w.to(torch.bfloat16).to(torch.float32))
    tokens = prompt()
    reference = hf_reference.run(model, tokens, N_GENERATE)
    with colibri.Model.open(imported(family, outtype)) as m:
        session = colibri.Session(m)
        logits = session.prefill(tokens)
        scale = max(1.0, float(np.abs(reference.logits).max()))
        worst = float(np.abs(logits - reference.logits).max())
        assert worst <= TOLERANCE[outtype] * scale, f"logits differ by {worst:.3g}"
        np.testing.assert_allclose(session.trace.router_logits, reference.router_logits,
                                   atol=TOLERANCE[outtype] * 10, rtol=0)
        assert routing_disagreements(session.trace, reference, m) == []
        assert greedy(m, tokens, N_GENERATE) == reference.generated


def _unpermute_like_import(architecture: str, name: str, values: np.ndarray,
                           hp: Any) -> np.ndarray:
    if architecture not in PERMUTED or not name.endswith((".attn_q", ".attn_k")):
        return values
    heads = hp.n_heads if name.endswith(".attn_q") else hp.n_kv_heads
    rows = values.shape[0]
    return (values.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2)
            .reshape(values.shape))


_GGUF_NAMES = {"token_embd": "token_embd.weight", "output": "output.weight",
               "attn_q": "attn_q.weight", "attn_k": "attn_k.weight", "attn_v": "attn_v.weight",
               "attn_o": "attn_output.weight", "moe_w1": "ffn_gate_exps.weight",
               "moe_w2": "ffn_down_exps.weight", "moe_w3": "ffn_up_exps.weight",
               "shared_w1": "ffn_gate_shexp.weight", "shared_w2": "ffn_down_shexp.weight",
               "shared_w3": "ffn_up_shexp.weight", "shared_gate": "ffn_gate_inp_shexp.weight",
               "mlp_w1": "ffn_gate.weight", "mlp_w2": "ffn_down.weight", "mlp_w3": "ffn_up.weight"}

# DeepSeek's latent attention
_GGUF_NAMES.update(attn_q_a="attn_q_a.weight", attn_q_b="attn_q_b.weight",
                   attn_kv_a="attn_kv_a_mqa.weight", attn_k_b="attn_k_b.weight",
                   attn_v_b="attn_v_b.weight")


def gguf_name(name: str, source: GGUFFile, hp: Any) -> tuple[str, slice]:
    """The GGUF tensor a Colibri tensor comes from, and its rows (q, k and v of DBRX's fused
    attn_qkv)."""
    if not name.startswith("layers."):
        return _GGUF_NAMES[name], slice(None)
    _, layer, short = name.split(".")
    fused = f"blk.{layer}.attn_qkv.weight"
    if short in ("attn_q", "attn_k", "attn_v") and fused in source:
        q, kv = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
        rows = {"attn_q": slice(0, q), "attn_k": slice(q, q + kv),
                "attn_v": slice(q + kv, q + 2 * kv)}[short]
        return fused, rows
    return f"blk.{layer}.{_GGUF_NAMES[short]}", slice(None)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_quantised_imports_keep_llama_cpps_blocks(family: str, qtype: str,
                                                  imported: Any) -> None:
    """Every Q8_0/Q4_0 tensor is repacked, not requantised: its values are exactly the gguf
    package's dequantisation of llama.cpp's blocks, and its rows (those its panels hold, for the
    tensors the default layout puts in panels) are llama.cpp's reference quantiser (the gguf
    package's) on the same f32 weights, rearranged scales-first. Colibri's own quantiser gives
    the same bytes (docs/format.md: llama.cpp's arithmetic)."""
    source = GGUFFile.open(str(FIXTURES / f"{family}-{qtype}.gguf"))
    code = fileformat.QUANT_BY_NAME[qtype]
    with colibri.Model.open(imported(family, qtype)) as m, \
            colibri.Model.open(imported(family, "f32")) as full:
        repacked = 0
        for t in m.tensors:
            if fileformat.rows_dtype_name(t.dtype) != qtype:
                continue
            repacked += 1
            name, rows = gguf_name(t.name, source, m.hparams)
            src = source.tensor_info(name)
            expected = gguf.quants.dequantize(np.asarray(source.raw(src.name)),
                                              source.ggml_type(src.name)).reshape(src.shape)
            expected = _unpermute_like_import(source.architecture, t.name, expected[rows],
                                              m.hparams)
            np.testing.assert_array_equal(m.tensor_f32(t.name), expected, err_msg=t.name)
            weights = full.tensor_f32(t.name)
            llama = gguf.quants.quantize(weights.reshape(-1, t.shape[-1]),
                                         gguf.GGMLQuantizationType[qtype.upper()])
            got = np.asarray(m.tensor(t.name))
            if t.dtype != qtype:  # panels: the rows they hold
                got = fileformat.from_panels(got, code, t.shape[-1]).reshape(
                    *t.shape[:-1], fileformat.row_bytes(code, t.shape[-1]))
            np.testing.assert_array_equal(
                repack_blocks(llama, 34 if qtype == "q8_0" else 18).reshape(got.shape), got,
                err_msg=t.name)
            own = fileformat.quantize(weights, code)
            np.testing.assert_array_equal(own, got, err_msg=t.name)
        assert repacked >= 3 * m.hparams.n_layers  # at least every expert tensor


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpp_recipe_gives_llama_quantizes_file(family: str, qtype: str, imported: Any,
                                                     tmp_path: Path) -> None:
    """`--quantize-tensors llama.cpp` on the Hugging Face checkpoint stores every tensor as
    llama-quantize's Q8_0 / Q4_0 stores it: the same dtype (the fixtures' LM head rows of 64 are
    Q8_0 in llama.cpp's Q4_0 too) and the same bytes as the import of llama.cpp's file."""
    hf = hf_reference.save(reference_model(family), tmp_path / "hf")
    out = tmp_path / "recipe.colibri"
    convert(hf, out, "f32", quantize=qtype[:2], quantize_tensors="llama.cpp")
    with colibri.Model.open(out) as ours, colibri.Model.open(imported(family, qtype)) as llama:
        assert sorted(t.name for t in ours.tensors) == sorted(t.name for t in llama.tensors)
        for t in ours.tensors:
            assert t.dtype == llama.tensor_info(t.name).dtype, t.name
            np.testing.assert_array_equal(np.asarray(ours.tensor(t.name)),
                                          np.asarray(llama.tensor(t.name)), err_msg=t.name)
        # the embeddings are quantised too: as the LM head (q8_0) when tied to it
        tied = ours.hparams.flags & fileformat.FLAG_TIED_EMBEDDINGS
        assert ours.tensor_info("token_embd").dtype == ("q8_0" if tied else qtype)


@pytest.mark.parametrize("kind", ["f32", "bf16", "q8_0", "q4_0"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bytes_per_token_of_a_gguf_file_and_its_import(family: str, kind: str,
                                                       imported: Any) -> None:
    """The weight bytes one token reads, counted from the GGUF tensor table as llama.cpp reads
    it, equal the count from the import's tensor table (the import keeps every type): what
    tools/bench_vs_llamacpp.py puts side by side."""
    source = GGUFFile.open(str(FIXTURES / f"{family}-{kind}.gguf"))
    # routers stored in 16 bits (llama.cpp's DBRX converter) are f32 in every .colibri file
    widened = sum(2 * int(np.prod(t.shape)) for t in source.tensors
                  if t.name.endswith("ffn_gate_inp.weight")
                  and source.ggml_type(t.name) in (gguf.GGMLQuantizationType.F16,
                                                   gguf.GGMLQuantizationType.BF16))
    with colibri.Model.open(imported(family, kind)) as m:
        assert gguf_weight_bytes_per_token(source) + widened == weight_bytes_per_token(m) > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_encodes_like_the_source_tokenizer(family: str, imported: Any) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(FIXTURES / f"{family}-hf")
    with colibri.Model.open(imported(family, "f32")) as m:
        ours = m.tokenizer
        for text in TEXTS:
            assert ours.encode(text).ids == hf.encode(text), text
            assert ours.decode(ours.encode(text).ids, skip_special_tokens=True) == hf.decode(
                hf.encode(text), skip_special_tokens=True), text


def test_cli_converts_a_gguf_file_and_runs_a_prompt(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.colibri"
    assert main(["convert", str(FIXTURES / "qwen3_moe-q4_0.gguf"), str(out)]) == 0
    assert main(["validate", str(out)]) == 0
    assert main(["run", str(out), "--prompt", "def wrap(text):", "-n", "4"]) == 0
    printed = capsys.readouterr().out
    assert "prompt: def wrap(text):" in printed and "text:" in printed
    with colibri.Model.open(out) as m:
        meta = m.metadata["user"]
        assert meta["source"]["format"] == "gguf" and meta["source"]["model_type"] == "qwen3_moe"


@pytest.mark.parametrize("family", FAMILIES)
def test_header_and_routing_equal_the_hugging_face_conversion(family: str, imported: Any,
                                                              tmp_path: Path) -> None:
    """What the GGUF keys say, read back, is what the family's config says: every header field
    and every layer's routing rule equal the Hugging Face conversion's, but for the special
    tokens, which the import takes from the GGUF vocabulary (the fixtures' configs have none),
    and a LongRoPE file's context, which ends where llama.cpp's long factors begin."""
    hf = hf_reference.save(reference_model(family), tmp_path / "hf")
    convert(hf, tmp_path / "hf.colibri")
    with colibri.Model.open(tmp_path / "hf.colibri") as ours, \
            colibri.Model.open(imported(family, "f32")) as theirs:
        skip: tuple[str, ...] = ("bos_token_id", "eos_token_id")
        a, b = ours.hparams.to_dict(), theirs.hparams.to_dict()
        if b["rope_type"] == fileformat.ROPE_LONGROPE:
            # llama.cpp takes the long factors past the original context, transformers the short
            # ones at every length: the import stops where they part (docs/formats.md)
            rope = MANIFEST["configs"][family]["rope_parameters"]
            assert b["max_context"] == rope["original_max_position_embeddings"]
            skip += ("max_context",)
        assert {k: v for k, v in a.items() if k not in skip} == \
            {k: v for k, v in b.items() if k not in skip}
        for layer in range(ours.hparams.n_layers):
            left, right = (dataclasses.asdict(m.routing(layer)) for m in (ours, theirs))
            assert {k: v for k, v in left.items() if not k.endswith("_tensor")} == \
                {k: v for k, v in right.items() if not k.endswith("_tensor")}, layer


def rewrite(src: GGUFFile, path: Path, tensors: dict[str, Any] | None = None,
            keys: dict[str, Any] | None = None) -> None:
    """`src` written again with the gguf package at `path`: `tensors` maps a name to an array,
    to (raw bytes, ggml type), or to None (dropped), added or replacing src's own; `keys` maps a
    key to None (dropped) or to (value, GGUFValueType), added or replacing src's own."""
    tensors, keys = tensors or {}, keys or {}
    w = gguf.GGUFWriter(str(path), src.architecture)
    for kv in src.key_values:
        if kv.key == "general.architecture" or kv.key in keys:
            continue
        value = src.get(kv.key)
        if isinstance(value, list):
            w.add_array(kv.key, value)
        else:
            w.add_key_value(kv.key, value, gguf.GGUFValueType(kv.type))
    for key, typed in keys.items():
        if typed is not None:
            w.add_key_value(key, typed[0], typed[1])
    for t in src.tensors:
        if t.name not in tensors:
            w.add_tensor(t.name, np.array(src.tensor(t.name)))
    for name, value in tensors.items():
        if isinstance(value, tuple):
            w.add_tensor(name, value[0], raw_dtype=value[1])
        elif value is not None:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("qtype", ["f32", "q8_0"])
def test_an_older_deepseek_file_with_attn_kv_b_is_split_per_head(qtype: str, imported: Any,
                                                                  tmp_path: Path) -> None:
    """DeepSeek files made before llama.cpp's converter split kv_b_proj hold it whole
    (attn_kv_b [nh * (nope + vd), c]) and their key_length / value_length are the heads' (no
    *_mla keys). The import splits it as the newer converter does: f32 gives the newer file's
    import exactly; from Q8_0 rows, attn_v_b keeps llama.cpp's blocks (whole rows) and attn_k_b,
    transposed, is the blocks' values, dequantised (with a note)."""
    config = MANIFEST["configs"]["deepseek_v3"]
    nh, c, nope = config["num_attention_heads"], config["kv_lora_rank"], config["qk_nope_head_dim"]
    vd, rope = config["v_head_dim"], config["qk_rope_head_dim"]
    kv_b: dict[str, np.ndarray] = {}
    src = GGUFFile.open(str(FIXTURES / "deepseek_v3-f32.gguf"))
    edits: dict[str, Any] = {}
    for t in src.tensors:
        if not t.name.endswith("attn_k_b.weight"):
            continue
        k_b = src.tensor(t.name).transpose(0, 2, 1)                          # [nh, nope, c]
        v_name = t.name.replace("attn_k_b", "attn_v_b")
        v_b = src.tensor(v_name)                                             # [nh, vd, c]
        fused = t.name.replace("attn_k_b", "attn_kv_b")
        kv_b[fused] = np.concatenate([k_b, v_b], axis=1).reshape(nh * (nope + vd), c)
        edits[t.name] = edits[v_name] = None
        edits[fused] = kv_b[fused] if qtype == "f32" else (
            gguf.quants.quantize(kv_b[fused], gguf.GGMLQuantizationType.Q8_0),
            gguf.GGMLQuantizationType.Q8_0)

    u32 = gguf.GGUFValueType.UINT32
    rewrite(src, tmp_path / "old.gguf", edits,
            keys={"deepseek2.attention.key_length_mla": None,
                  "deepseek2.attention.value_length_mla": None,
                  "deepseek2.attention.key_length": (nope + rope, u32),
                  "deepseek2.attention.value_length": (vd, u32)})
    notes = convert_gguf(tmp_path / "old.gguf", tmp_path / "old.colibri", layout="rows")
    with colibri.Model.open(tmp_path / "old.colibri") as old, \
            colibri.Model.open(imported("deepseek_v3", "f32")) as new:
        assert old.hparams == new.hparams
        if qtype == "f32":
            assert sorted(t.name for t in old.tensors) == sorted(t.name for t in new.tensors)
            for t in new.tensors:
                np.testing.assert_array_equal(old.tensor_f32(t.name), new.tensor_f32(t.name),
                                              err_msg=t.name)
            return
        assert any("Q8_0 tensor(s) dequantised to f32" in n and "attn_kv_b" in n for n in notes)
        for layer in range(old.hparams.n_layers):
            name = f"blk.{layer}.attn_kv_b.weight"
            blocks = gguf.quants.quantize(kv_b[name], gguf.GGMLQuantizationType.Q8_0)
            values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
            values = values.reshape(nh, nope + vd, c)
            k_b, v_b = f"layers.{layer}.attn_k_b", f"layers.{layer}.attn_v_b"
            assert old.tensor_info(k_b).dtype == "f32" and old.tensor_info(v_b).dtype == "q8_0"
            np.testing.assert_array_equal(old.tensor_f32(k_b),
                                          values[:, :nope].transpose(0, 2, 1))
            np.testing.assert_array_equal(old.tensor_f32(v_b), values[:, nope:])
            rows = blocks.reshape(nh, nope + vd, -1)[:, nope:].reshape(nh * vd, -1)
            np.testing.assert_array_equal(np.asarray(old.tensor(v_b)).reshape(nh * vd, -1),
                                          repack_blocks(rows, 34))


_U32, _F32, _STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING


@pytest.mark.parametrize("family,keys,extra,message", [
    # a DeepSeek-V3 file whose converter saw no scoring_func: llama.cpp would route by softmax
    ("deepseek_v3", {"deepseek2.expert_gating_func": None}, None,
     r"deepseek2.expert_gating_func is not set .* exp_probs_b"),
    ("deepseek_v3", {"deepseek2.expert_gating_func": (4, _U32)}, None,
     r"deepseek2.expert_gating_func = 4 not supported"),
    ("deepseek_v3", {"deepseek2.expert_group_count": (3, _U32)}, None,
     r"n_group 3 does not divide the 4 routed experts \(the deepseek2.\* keys read as a "
     r"deepseek_v3 config\)"),
    ("deepseek_v3", {"deepseek2.attention.kv_lora_rank": ("64", _STR)}, None,
     r"deepseek2.attention.kv_lora_rank = '64', expected an integer"),
    ("deepseek_v3", {}, "blk.0.attn_output.bias",
     r"1 tensor\(s\) the deepseek2 import does not read .*: blk.0.attn_output.bias"),
    ("glm4_moe", {"glm4moe.expert_gating_func": (1, _U32)}, None, r"GLM-4.5 routes by a sigmoid"),
    ("glm4_moe", {"glm4moe.rope.scaling.type": ("yarn", _STR)}, None,
     r"glm4moe.rope.scaling.type 'yarn' not supported \(supported: none, linear\)"),
    ("glm4_moe", {}, "blk.0.attn_output.bias",
     r"1 tensor\(s\) the glm4moe import does not read .*: blk.0.attn_output.bias"),
    ("ernie4_5_moe", {"ernie4_5-moe.rope.dimension_count": (8, _U32)}, None,
     r"rope.dimension_count 8 != head_dim 16"),
])
def test_what_the_import_cannot_run_faithfully_is_refused_by_name(
        family: str, keys: dict[str, Any], extra: str | None, message: str,
        tmp_path: Path) -> None:
    """Keys the families' graphs would read otherwise, impossible values and tensors the import
    would drop are ConversionErrors naming the key or tensor, and no file is written."""
    src = GGUFFile.open(str(FIXTURES / f"{family}-f32.gguf"))
    tensors = {} if extra is None else {extra: np.zeros(
        src.tensor_info(extra.replace("attn_output.bias", "attn_output.weight")).shape[0],
        np.float32)}
    rewrite(src, tmp_path / "edited.gguf", tensors, keys)
    with pytest.raises(ConversionError, match=message):
        convert_gguf(tmp_path / "edited.gguf", tmp_path / "m.colibri")
    assert not (tmp_path / "m.colibri").exists()


@pytest.mark.parametrize("family,prefix,keys", [
    ("deepseek_v3", "deepseek2", {}),
    ("gpt_oss", "gpt-oss", {"rope.scaling.type": ("yarn", _STR),
                            "rope.scaling.factor": (4.0, _F32),
                            "rope.scaling.original_context_length": (64, _U32)}),
])
def test_yarn_keys_are_read_alike_for_every_family(family: str, prefix: str,
                                                   keys: dict[str, Any], tmp_path: Path) -> None:
    """DeepSeek (through a transformers config) and GPT-OSS (straight to the header) read the
    same YaRN keys: the attention factor is yarn_attn_factor, as llama.cpp's converters write
    it (DeepSeek read attn_factor, LongRoPE's), and an extrapolation factor is refused alike."""
    src = GGUFFile.open(str(FIXTURES / f"{family}-f32.gguf"))
    keys = {f"{prefix}.{k}": v for k, v in keys.items()}
    rewrite(src, tmp_path / "yarn.gguf", {}, {**keys,
            f"{prefix}.rope.scaling.yarn_attn_factor": (1.25, _F32),
            f"{prefix}.rope.scaling.yarn_beta_fast": (16.0, _F32),
            f"{prefix}.rope.scaling.attn_factor": (3.0, _F32)})
    convert_gguf(tmp_path / "yarn.gguf", tmp_path / "yarn.colibri")
    with colibri.Model.open(tmp_path / "yarn.colibri") as m:
        hp = m.hparams
        assert (hp.rope_type, hp.rope_factor, hp.rope_original_max_context) == (
            fileformat.ROPE_YARN, 4.0, 64)
        assert (hp.rope_attn_factor, hp.rope_beta_fast, hp.rope_beta_slow) == (1.25, 16.0, 1.0)
    rewrite(src, tmp_path / "ext.gguf", {}, {
        **keys, f"{prefix}.rope.scaling.yarn_ext_factor": (0.5, _F32)})
    with pytest.raises(ConversionError, match=rf"{prefix}.rope.scaling.yarn_ext_factor = 0.5"):
        convert_gguf(tmp_path / "ext.gguf", tmp_path / "ext.colibri")


def test_config_architectures_are_every_family_they_name() -> None:
    """Each family CONFIG_ARCHITECTURES reads through is a family of the fixtures, so each is
    proven by the tests above."""
    assert {m for models in CONFIG_ARCHITECTURES.values() for m in models} <= set(FAMILIES)


def test_other_types_are_dequantised_with_a_note(tmp_path: Path) -> None:
    """A type Colibri does not store (here Q5_1 experts, written with the gguf package from the
    f32 fixture) is dequantised to --dtype and the metadata says so."""
    src = GGUFFile.open(str(FIXTURES / "mixtral-f32.gguf"))
    path = tmp_path / "q5_1.gguf"
    q5 = {t.name: gguf.quants.quantize(src.tensor_f32(t.name), gguf.GGMLQuantizationType.Q5_1)
          for t in src.tensors if "_exps" in t.name}
    rewrite(src, path, {name: (q, gguf.GGMLQuantizationType.Q5_1) for name, q in q5.items()})
    out = tmp_path / "m.colibri"
    notes = convert_gguf(path, out, dtype="bf16")
    assert any("Q5_1 tensor(s) dequantised to bf16" in n for n in notes)
    with colibri.Model.open(out) as m:
        assert m.tensor_info("layers.0.moe_w1").dtype == "bf16"
        expected = gguf.quants.dequantize(q5["blk.0.ffn_gate_exps.weight"],
                                          gguf.GGMLQuantizationType.Q5_1)
        bits = fileformat.to_bf16_bits(np.asarray(expected, np.float32))
        np.testing.assert_array_equal(np.asarray(m.tensor("layers.0.moe_w1")), bits)
        assert any("Q5_1" in n for n in m.metadata["user"]["notes"])


def test_broken_or_unsupported_gguf_is_a_conversion_error(tmp_path: Path) -> None:
    corpus = Path(__file__).resolve().parent / "corpus" / "formats"
    with pytest.raises(ConversionError, match="not a valid GGUF file: .*llama.cpp expects 256"):
        convert_gguf(corpus / "gap.gguf", tmp_path / "m.colibri")
    with pytest.raises(ConversionError, match="a dense llama model"):
        convert_gguf(corpus / "valid.gguf", tmp_path / "m.colibri")
    assert main(["convert", str(corpus / "gap.gguf"), str(tmp_path / "m.colibri")]) == 1
    assert list(tmp_path.iterdir()) == []


def test_mxfp4_experts_of_a_gpt_oss_file_are_dequantised_exactly(imported: Any,
                                                                 tmp_path: Path) -> None:
    """A GPT-OSS file with MXFP4 experts (as published GPT-OSS GGUF files hold them;
    `llama-quantize ... MXFP4_MOE`): the import dequantises them with the gguf package, the
    values llama.cpp computes with, and says so; every MXFP4 value is exact in bf16, so a bf16
    import stores the same values."""
    path = FIXTURES / "gpt_oss-mxfp4_moe.gguf"
    source = GGUFFile.open(str(path))
    assert source.ggml_type("blk.0.ffn_gate_exps.weight") == gguf.GGMLQuantizationType.MXFP4
    notes = convert_gguf(path, tmp_path / "f32.colibri")
    assert any(n.startswith("6 MXFP4 tensor(s) dequantised to f32") for n in notes)
    convert_gguf(path, tmp_path / "bf16.colibri", dtype="bf16")
    with colibri.Model.open(tmp_path / "f32.colibri") as m, \
            colibri.Model.open(tmp_path / "bf16.colibri") as half:
        for layer in range(m.hparams.n_layers):
            for ours, theirs in (("moe_w1", "ffn_gate_exps"), ("moe_w2", "ffn_down_exps"),
                                 ("moe_w3", "ffn_up_exps")):
                name = f"blk.{layer}.{theirs}.weight"
                expected = gguf.quants.dequantize(np.asarray(source.raw(name)),
                                                  gguf.GGMLQuantizationType.MXFP4)
                values = m.tensor_f32(f"layers.{layer}.{ours}")
                np.testing.assert_array_equal(values, expected.reshape(values.shape))
                assert half.tensor_info(f"layers.{layer}.{ours}").dtype == "bf16"
                np.testing.assert_array_equal(half.tensor_f32(f"layers.{layer}.{ours}"), values)
        assert m.routing(0).activation == fileformat.EXPERT_SWIGLU_CLAMPED and m.routing(0).sinks


def test_phimoe_longrope_imports_the_short_factors_and_llama_cpps_attention_factor(
        imported: Any) -> None:
    """llama.cpp's converter writes both factor sets and its own attention factor; up to the
    original context llama.cpp runs the short set, which transformers' PhiMoE runs at every
    length (the fixture's mscales equal llama.cpp's factor, so test_import_matches_transformers
    holds). Past it llama.cpp takes the long set, so the import's context stops there."""
    source = GGUFFile.open(str(FIXTURES / "phimoe-f32.gguf"))
    with colibri.Model.open(imported("phimoe", "q4_0")) as m:
        hp = m.hparams
        assert (hp.rope_type, hp.max_context) == (fileformat.ROPE_LONGROPE, 64)
        assert hp.rope_attn_factor == source.get("phimoe.rope.scaling.attn_factor")
        np.testing.assert_array_equal(m.tensor("rope_freq_factors"),
                                      source.tensor_f32("rope_factors_short.weight"))
        notes = " ".join(m.metadata["user"]["notes"])
        assert "short_mscale" in notes and "the context is 64" in notes


def test_phimoe_longrope_keeps_the_context_when_both_factor_sets_are_equal(
        tmp_path: Path) -> None:
    src = GGUFFile.open(str(FIXTURES / "phimoe-f32.gguf"))
    path = tmp_path / "same.gguf"
    rewrite(src, path, {"rope_factors_long.weight": src.tensor_f32("rope_factors_short.weight")})
    notes = convert_gguf(path, tmp_path / "m.colibri")
    with colibri.Model.open(tmp_path / "m.colibri") as m:
        assert m.hparams.max_context == src.get("phimoe.context_length") == 256
    assert not any("the context is" in n for n in notes)


def test_longrope_factors_elsewhere_or_non_positive_are_refused(tmp_path: Path) -> None:
    phimoe = GGUFFile.open(str(FIXTURES / "phimoe-f32.gguf"))
    zero = np.array(phimoe.tensor_f32("rope_factors_short.weight"))
    zero[3] = 0.0
    rewrite(phimoe, tmp_path / "zero.gguf", {"rope_factors_short.weight": zero})
    with pytest.raises(ConversionError, match="'rope_factors_short.weight' holds a factor"):
        convert_gguf(tmp_path / "zero.gguf", tmp_path / "m.colibri")
    mixtral = GGUFFile.open(str(FIXTURES / "mixtral-f32.gguf"))
    rewrite(mixtral, tmp_path / "mixtral.gguf", {"rope_factors_short.weight": np.ones(
        8, np.float32)})
    with pytest.raises(ConversionError, match="LongRoPE .* in a llama file; .* PhiMoE only"):
        convert_gguf(tmp_path / "mixtral.gguf", tmp_path / "m.colibri")
    assert list(tmp_path.glob("*.colibri")) == []
