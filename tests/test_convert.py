"""Tests of the Hugging Face -> .colibri converter (app/colibri/convert.py).

Tiny random models of the four v1 families are built with transformers at test time and saved in
every layout the converter must read: per-expert names (the default save), fused 3-D expert
tensors (`save_original_format=False`), bf16, and sharded with an index. Each conversion is read
back with the small independent reader below (struct at the offsets of docs/format.md, numpy for
the data), never through the C engine, and compared with the model's in-memory parameters, which
transformers 5 holds fused (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]).

torch and transformers are test-only dependencies; the converter itself imports neither.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from colibri import fileformat as ff  # noqa: E402
from colibri.convert import ConversionError, convert  # noqa: E402

COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)

CONFIGS = {
    "mixtral": lambda **kw: transformers.MixtralConfig(
        intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, **{**COMMON, **kw}),
    "qwen2_moe": lambda **kw: transformers.Qwen2MoeConfig(
        intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1],
        **{**COMMON, **kw}),
    "qwen3_moe": lambda **kw: transformers.Qwen3MoeConfig(
        intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        head_dim=16, norm_topk_prob=True, attention_bias=True, **{**COMMON, **kw}),
    "olmoe": lambda **kw: transformers.OlmoeConfig(
        intermediate_size=32, num_experts=4, num_experts_per_tok=2, clip_qkv=3.0,
        eos_token_id=[5, 7], **{**COMMON, **kw}),
}
FAMILIES = list(CONFIGS)
ARCH = {"mixtral": 1, "qwen2_moe": 2, "qwen3_moe": 3, "olmoe": 4}


def make_model(family: str, seed: int = 0, **overrides):
    """A tiny model whose every parameter is random: default inits (ones for norms, zeros for
    biases) would hide a norm or bias mapped to the wrong place."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family](**overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


def params_f32(model) -> dict[str, np.ndarray]:
    return {n: p.detach().to(torch.float32).numpy().copy() for n, p in model.named_parameters()}


# ---------------------------------------------------------------------------------------------
# An independent .colibri reader (docs/format.md), numpy + struct only

def read_colibri(path) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"COLI"
    version, n_experts, n_layers, header_size, n_tensors = struct.unpack_from("<5I", data, 4)
    (routing_off, data_off, table_off, tok_off, tok_size, meta_off, meta_size,
     file_size) = struct.unpack_from("<8Q", data, 0x18)
    assert version == 2 and header_size == 512 and file_size == len(data)
    assert data_off % 64 == 0
    hp = {"n_experts": n_experts, "n_layers": n_layers}
    fields = [(0x58, "I", "arch"), (0x5C, "I", "flags"), (0x60, "I", "d_model"),
              (0x64, "I", "n_heads"), (0x68, "I", "n_kv_heads"), (0x6C, "I", "head_dim"),
              (0x70, "I", "vocab_size"), (0x74, "I", "max_context"), (0x78, "I", "d_ff_expert"),
              (0x7C, "I", "d_ff_dense"), (0x80, "I", "d_ff_shared"),
              (0x84, "I", "n_experts_active"), (0x88, "I", "sliding_window"),
              (0x8C, "I", "rope_type"), (0x90, "d", "rope_theta"), (0x98, "f", "rope_factor"),
              (0xA8, "f", "norm_eps"), (0xAC, "f", "clip_qkv"), (0xB4, "i", "bos_token_id"),
              (0xB8, "i", "eos_token_id"), (0xBC, "I", "n_moe_layers"),
              (0xC8, "I", "attention"), (0xDC, "I", "v_head_dim"), (0xE0, "I", "rotary_dim"),
              (0xE4, "I", "rope_layout"), (0xE8, "f", "attn_scale")]
    for off, code, name in fields:
        hp[name] = struct.unpack_from("<" + code, data, off)[0]
    header_crc, tables_crc = struct.unpack_from("<II", data, 0xC0)
    assert header_crc == zlib.crc32(data[0xC8:0x200], zlib.crc32(data[:0xC0]))
    assert data[0x100:0x200] == bytes(256)
    routing_bytes = data[routing_off:routing_off + 128 * n_layers]
    table_bytes = data[table_off:table_off + 128 * n_tensors]
    assert tables_crc == zlib.crc32(routing_bytes + table_bytes)
    routing = []
    for i in range(n_layers):
        entry = routing_bytes[128 * i:128 * (i + 1)]
        fields = struct.unpack_from("<7I6I3fIfI", entry, 0)
        names = ("layer", "kind", "gate", "gate_bias", "top_k", "n_experts", "scoring",
                 "select_on", "correction", "n_groups", "n_groups_kept", "group_score",
                 "normalize", "norm_eps", "norm_p", "scale", "shared", "sparsemixer_eps",
                 "attention")
        routing.append(dict(zip(names, fields)))
        assert entry[0x4C:] == bytes(128 - 0x4C)
    tensors, names, prev_end = {}, [], data_off
    np_dtype = {0: np.float32, 1: np.float16, 2: np.uint16}
    for i in range(n_tensors):
        entry = table_bytes[128 * i:128 * (i + 1)]
        name = entry[:64].rstrip(b"\0").decode("ascii")
        dtype, ndim = struct.unpack_from("<II", entry, 0x40)
        shape = struct.unpack_from("<4Q", entry, 0x48)[:ndim]
        offset, nbytes, crc = struct.unpack_from("<QQI", entry, 0x68)
        assert offset % 64 == 0 and offset >= prev_end and offset + nbytes <= file_size
        assert nbytes == int(np.prod(shape)) * ff.DTYPE_SIZES[dtype]
        raw = data[offset:offset + nbytes]
        assert zlib.crc32(raw) == crc
        prev_end = offset + nbytes
        stored = np.frombuffer(raw, dtype=np_dtype[dtype]).reshape(shape)
        tensors[name] = {"dtype": dtype, "shape": tuple(shape), "stored": stored,
                         "f32": ff.storage_to_f32(stored, dtype), "raw": raw}
        names.append(name)
    return {"hp": hp, "routing": routing, "tensors": tensors, "names": names,
            "tokenizer": data[tok_off:tok_off + tok_size],
            "metadata": json.loads(data[meta_off:meta_off + meta_size]) if meta_size else {},
            "data": data[data_off:], "table": table_bytes, "routing_bytes": routing_bytes}


# ---------------------------------------------------------------------------------------------
# The expected Colibri tensors, from the model's in-memory (fused) parameters

def expected_tensors(family: str, params: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    out = {"token_embd": params["model.embed_tokens.weight"],
           "output_norm": params["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output"] = params["lm_head.weight"]
    for layer in range(cfg.num_hidden_layers):
        src, dst = f"model.layers.{layer}", f"layers.{layer}"
        out[f"{dst}.attn_norm"] = params[f"{src}.input_layernorm.weight"]
        out[f"{dst}.ffn_norm"] = params[f"{src}.post_attention_layernorm.weight"]
        for short in "qkvo":
            out[f"{dst}.attn_{short}"] = params[f"{src}.self_attn.{short}_proj.weight"]
            bias = params.get(f"{src}.self_attn.{short}_proj.bias")
            if bias is not None:
                out[f"{dst}.attn_{short}_bias"] = bias
        for short in "qk":
            norm = params.get(f"{src}.self_attn.{short}_norm.weight")
            if norm is not None:
                out[f"{dst}.attn_{short}_norm"] = norm
        gate_up = params.get(f"{src}.mlp.experts.gate_up_proj")
        if gate_up is None:  # a dense layer
            out[f"{dst}.mlp_w1"] = params[f"{src}.mlp.gate_proj.weight"]
            out[f"{dst}.mlp_w2"] = params[f"{src}.mlp.down_proj.weight"]
            out[f"{dst}.mlp_w3"] = params[f"{src}.mlp.up_proj.weight"]
            continue
        i = gate_up.shape[1] // 2
        out[f"{dst}.moe_gate"] = params[f"{src}.mlp.gate.weight"]
        out[f"{dst}.moe_w1"] = gate_up[:, :i]
        out[f"{dst}.moe_w2"] = params[f"{src}.mlp.experts.down_proj"]
        out[f"{dst}.moe_w3"] = gate_up[:, i:]
        if f"{src}.mlp.shared_expert.gate_proj.weight" in params:
            out[f"{dst}.shared_w1"] = params[f"{src}.mlp.shared_expert.gate_proj.weight"]
            out[f"{dst}.shared_w2"] = params[f"{src}.mlp.shared_expert.down_proj.weight"]
            out[f"{dst}.shared_w3"] = params[f"{src}.mlp.shared_expert.up_proj.weight"]
            out[f"{dst}.shared_gate"] = params[f"{src}.mlp.shared_expert_gate.weight"]
    return out


def stays_f32(name: str, shape) -> bool:
    return len(shape) == 1 or name.endswith(".moe_gate")


def reference_storage(values: np.ndarray, dtype: int) -> np.ndarray:
    """The documented conversion, computed independently of colibri.fileformat (torch rounds
    f32 -> bf16 to nearest even, like the converter must)."""
    if dtype == ff.DTYPE_F32:
        return values.astype(np.float32)
    if dtype == ff.DTYPE_F16:
        return values.astype(np.float16)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(
        torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


# ---------------------------------------------------------------------------------------------
# Fixtures: one tiny model per family, saved in every layout, once per test session

@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for family in FAMILIES:
        model = make_model(family)
        dirs = {}
        for layout, kwargs in (("per_expert", {}), ("fused", {"save_original_format": False}),
                               ("sharded", {"max_shard_size": "40KB"})):
            dirs[layout] = root / f"{family}_{layout}"
            model.save_pretrained(dirs[layout], **kwargs)
        params = params_f32(model)
        model_bf16 = model.to(torch.bfloat16)
        for layout, kwargs in (("bf16", {}), ("bf16_fused", {"save_original_format": False})):
            dirs[layout] = root / f"{family}_{layout}"
            model_bf16.save_pretrained(dirs[layout], **kwargs)
        out[family] = {"dirs": dirs, "params": params, "params_bf16": params_f32(model_bf16),
                       "config": model.config}
    return out


def check_file(family, parsed, expected, config, dtype: int):
    names = parsed["names"]
    assert set(names) == set(expected)
    for name, want in expected.items():
        got = parsed["tensors"][name]
        assert got["shape"] == want.shape, name
        want_dtype = ff.DTYPE_F32 if stays_f32(name, want.shape) else dtype
        assert got["dtype"] == want_dtype, name
        np.testing.assert_array_equal(got["stored"], reference_storage(want, want_dtype),
                                      err_msg=name)
    # Experts adjacent and in the order w1, w2, w3.
    for layer in range(config.num_hidden_layers):
        if f"layers.{layer}.moe_w1" in names:
            i = names.index(f"layers.{layer}.moe_w1")
            assert names[i:i + 3] == [f"layers.{layer}.moe_w{k}" for k in (1, 2, 3)]


def check_header(family, parsed, config):
    hp = parsed["hp"]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert hp["arch"] == ARCH[family]
    assert hp["n_layers"] == config.num_hidden_layers
    assert hp["n_experts"] == 4 and hp["n_experts_active"] == 2
    assert (hp["d_model"], hp["n_heads"], hp["n_kv_heads"], hp["head_dim"]) == (64, 4, 2, head_dim)
    assert hp["vocab_size"] == 128 and hp["max_context"] == 256
    assert hp["rope_type"] == 0 and hp["rope_factor"] == 1.0
    assert hp["rope_theta"] == config.rope_parameters["rope_theta"]
    assert hp["norm_eps"] == pytest.approx(config.rms_norm_eps, rel=1e-6)
    assert hp["sliding_window"] == 0
    flags = {
        "mixtral": 0,
        "qwen2_moe": ff.FLAG_QKV_BIAS,
        "qwen3_moe": ff.FLAG_QKV_BIAS | ff.FLAG_O_BIAS | ff.FLAG_QK_NORM_HEAD,
        "olmoe": ff.FLAG_QK_NORM_FULL,
    }[family]
    assert hp["flags"] == flags
    assert (hp["attention"], hp["v_head_dim"], hp["rotary_dim"], hp["rope_layout"]) == (
        ff.ATTENTION_GQA, head_dim, head_dim, ff.ROPE_HALVES)
    assert hp["attn_scale"] == np.float32(head_dim ** -0.5)
    # each family's rule as its MoE routing entries state it (docs/format.md, "The routing rule")
    normalize, shared = {"mixtral": (ff.NORM_SUM, ff.SHARED_NONE),
                         "qwen2_moe": (ff.NORM_NONE, ff.SHARED_SIGMOID_GATE),
                         "qwen3_moe": (ff.NORM_SUM, ff.SHARED_NONE),
                         "olmoe": (ff.NORM_NONE, ff.SHARED_NONE)}[family]
    d_ff = {"mixtral": (96, 0, 0), "qwen2_moe": (32, 96, 48), "qwen3_moe": (32, 0, 0),
            "olmoe": (32, 0, 0)}[family]
    assert (hp["d_ff_expert"], hp["d_ff_dense"], hp["d_ff_shared"]) == d_ff
    assert hp["clip_qkv"] == (3.0 if family == "olmoe" else 0.0)
    assert (hp["bos_token_id"], hp["eos_token_id"]) == {
        "mixtral": (1, 2), "olmoe": (-1, 5)}.get(family, (-1, -1))
    kinds = [0 if family == "qwen2_moe" and layer == 1 else 1
             for layer in range(config.num_hidden_layers)]
    assert hp["n_moe_layers"] == sum(kinds)
    index = {n: i for i, n in enumerate(parsed["names"])}
    for layer, r in enumerate(parsed["routing"]):
        assert (r["layer"], r["kind"], r["attention"]) == (layer, kinds[layer], ff.LAYER_FULL)
        assert (r["gate_bias"], r["correction"]) == (0xFFFFFFFF, 0xFFFFFFFF)
        if r["kind"] == 1:
            assert (r["gate"], r["top_k"], r["n_experts"]) == (
                index[f"layers.{layer}.moe_gate"], 2, 4)
            assert (r["scoring"], r["select_on"], r["n_groups"], r["n_groups_kept"],
                    r["group_score"]) == (ff.SCORING_SOFTMAX, ff.SELECT_SCORES, 1, 1, 0)
            assert (r["normalize"], r["norm_eps"], r["scale"], r["shared"]) == (
                normalize, 0.0, 1.0, shared)
        else:
            assert (r["gate"], r["top_k"], r["n_experts"], r["scoring"], r["scale"],
                    r["shared"]) == (0xFFFFFFFF, 0, 0, 0, 0.0, 0)


# ---------------------------------------------------------------------------------------------
# Round trips

@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_per_expert_f32(saved, family, tmp_path):
    s = saved[family]
    out = tmp_path / "m.colibri"
    calls = []
    warnings = convert(s["dirs"]["per_expert"], out,
                       progress=lambda done, total: calls.append((done, total)))
    parsed = read_colibri(out)
    check_header(family, parsed, s["config"])
    check_file(family, parsed, expected_tensors(family, s["params"], s["config"]), s["config"],
               ff.DTYPE_F32)
    n = len(parsed["names"])
    assert calls == [(i + 1, n) for i in range(n)]
    meta = parsed["metadata"]
    assert meta["source"] == {"model_type": family, "architectures": s["config"].architectures}
    assert meta["dtype"] == "f32" and meta["converter_version"]
    assert meta["converted_at"].endswith("+00:00")
    with open(os.path.join(s["dirs"]["per_expert"], "config.json")) as f:
        assert meta["hf_config"] == json.load(f)
    assert parsed["tokenizer"] == b""
    assert len(warnings) == 1 and "no tokenizer.json" in warnings[0] and "token ids" in warnings[0]
    assert [p.name for p in tmp_path.iterdir()] == ["m.colibri"]  # no temporary left behind


@pytest.mark.parametrize("family", FAMILIES)
def test_stacked_experts_equal_per_expert_sources(saved, family, tmp_path):
    d = saved[family]["dirs"]["per_expert"]
    convert(d, tmp_path / "m.colibri")
    t = read_colibri(tmp_path / "m.colibri")["tensors"]
    src = safetensors_numpy.load_file(os.path.join(d, "model.safetensors"))
    names = {"mixtral": ("block_sparse_moe.experts.{e}.w1.weight",
                         "block_sparse_moe.experts.{e}.w2.weight",
                         "block_sparse_moe.experts.{e}.w3.weight")}.get(
        family, ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.down_proj.weight",
                 "mlp.experts.{e}.up_proj.weight"))
    for e in range(4):
        for k, pattern in zip((1, 2, 3), names):
            np.testing.assert_array_equal(t[f"layers.0.moe_w{k}"]["f32"][e],
                                          src["model.layers.0." + pattern.format(e=e)])


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_and_sharded_inputs_give_identical_files(saved, family, tmp_path):
    dirs = saved[family]["dirs"]
    assert os.path.exists(os.path.join(dirs["sharded"], "model.safetensors.index.json"))
    assert len([n for n in os.listdir(dirs["sharded"]) if n.endswith(".safetensors")]) > 1
    files = {}
    for layout in ("per_expert", "fused", "sharded"):
        files[layout] = tmp_path / f"{layout}.colibri"
        convert(dirs[layout], files[layout], dtype="bf16")
    ref = read_colibri(files["per_expert"])
    for layout in ("fused", "sharded"):
        other = read_colibri(files[layout])
        assert other["hp"] == ref["hp"]
        assert other["table"] == ref["table"] and other["routing_bytes"] == ref["routing_bytes"]
        assert other["data"] == ref["data"]
        meta, ref_meta = dict(other["metadata"]), dict(ref["metadata"])
        for m in (meta, ref_meta):
            del m["converted_at"]
        assert meta == ref_meta


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_dtype_conversion(saved, family, dtype, tmp_path):
    s = saved[family]
    convert(s["dirs"]["fused"], tmp_path / "m.colibri", dtype=dtype)
    parsed = read_colibri(tmp_path / "m.colibri")
    check_file(family, parsed, expected_tensors(family, s["params"], s["config"]), s["config"],
               ff.DTYPE_BY_NAME[dtype])
    assert parsed["metadata"]["dtype"] == dtype


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", ["bf16", "bf16_fused"])
def test_bf16_source(saved, layout, dtype, tmp_path):
    for family in FAMILIES:
        s = saved[family]
        out = tmp_path / f"{family}.colibri"
        convert(s["dirs"][layout], out, dtype=dtype)
        parsed = read_colibri(out)
        expected = expected_tensors(family, s["params_bf16"], s["config"])
        check_file(family, parsed, expected, s["config"], ff.DTYPE_BY_NAME[dtype])
        if dtype == "bf16":  # bf16 -> bf16 is bit-exact
            bits = torch.from_numpy(np.ascontiguousarray(expected["token_embd"])).to(
                torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            np.testing.assert_array_equal(parsed["tensors"]["token_embd"]["stored"], bits)


def test_tied_embeddings(tmp_path):
    model = make_model("olmoe", tie_word_embeddings=True)
    model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "m.colibri")
    parsed = read_colibri(tmp_path / "m.colibri")
    assert "output" not in parsed["tensors"]
    assert parsed["hp"]["flags"] & ff.FLAG_TIED_EMBEDDINGS
    np.testing.assert_array_equal(parsed["tensors"]["token_embd"]["f32"],
                                  params_f32(model)["model.embed_tokens.weight"])


def test_tokenizer_embedded_unchanged(saved, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(saved["mixtral"]["dirs"]["per_expert"], d)
    blob = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"é": 0}}},
                      ensure_ascii=False).encode("utf-8") + b"\n\x00tail"
    (d / "tokenizer.json").write_bytes(blob)
    assert convert(d, tmp_path / "m.colibri") == []
    assert read_colibri(tmp_path / "m.colibri")["tokenizer"] == blob


# ---------------------------------------------------------------------------------------------
# Config handling

def edit_config(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_older_config_rope_fields(saved, tmp_path):
    d = edit_config(saved["qwen3_moe"]["dirs"]["per_expert"], tmp_path / "hf",
                    rope_parameters=None, rope_theta=12345.0,
                    rope_scaling={"type": "linear", "factor": 4.0})
    convert(d, tmp_path / "m.colibri")
    hp = read_colibri(tmp_path / "m.colibri")["hp"]
    assert (hp["rope_type"], hp["rope_theta"], hp["rope_factor"]) == (1, 12345.0, 4.0)


def test_missing_fields_take_class_defaults(saved, tmp_path):
    # Mixtral's class defaults: rope_theta 1e6, bos 1, eos 2, rms_norm_eps 1e-5.
    d = edit_config(saved["mixtral"]["dirs"]["per_expert"], tmp_path / "hf", rope_parameters=None,
                    bos_token_id=None, eos_token_id=None, rms_norm_eps=None, head_dim=None)
    convert(d, tmp_path / "m.colibri")
    hp = read_colibri(tmp_path / "m.colibri")["hp"]
    assert (hp["rope_theta"], hp["bos_token_id"], hp["eos_token_id"]) == (1e6, 1, 2)
    assert hp["norm_eps"] == pytest.approx(1e-5) and hp["head_dim"] == 16


def test_sliding_window(saved, tmp_path):
    d = edit_config(saved["mixtral"]["dirs"]["per_expert"], tmp_path / "a", sliding_window=8)
    convert(d, tmp_path / "a.colibri")
    parsed = read_colibri(tmp_path / "a.colibri")
    assert parsed["hp"]["sliding_window"] == 8
    assert [r["attention"] for r in parsed["routing"]] == [ff.LAYER_SLIDING] * 2
    # Qwen2-MoE's layer_types slide some layers only: each routing entry says which
    d = edit_config(saved["qwen2_moe"]["dirs"]["per_expert"], tmp_path / "b",
                    use_sliding_window=True, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"])
    convert(d, tmp_path / "b.colibri")
    parsed = read_colibri(tmp_path / "b.colibri")
    assert parsed["hp"]["sliding_window"] == 8
    assert [r["attention"] for r in parsed["routing"]] == [ff.LAYER_SLIDING, ff.LAYER_FULL]


def test_yarn_rope(saved, tmp_path):
    d = edit_config(saved["olmoe"]["dirs"]["per_expert"], tmp_path / "hf",
                    rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                     "original_max_position_embeddings": 64})
    convert(d, tmp_path / "m.colibri")
    with open(tmp_path / "m.colibri", "rb") as f:
        head = f.read(512)
    rope_type, = struct.unpack_from("<I", head, 0x8C)
    factor, = struct.unpack_from("<f", head, 0x98)
    original, = struct.unpack_from("<I", head, 0x9C)
    attn_factor, beta_fast, beta_slow, truncate = struct.unpack_from("<3fI", head, 0xF0)
    assert (rope_type, factor, original) == (ff.ROPE_YARN, 4.0, 64)
    # transformers' defaults: attention factor 0.1 ln(factor) + 1, betas 32 and 1, truncate
    assert attn_factor == np.float32(0.1 * np.log(4.0) + 1.0)
    assert (beta_fast, beta_slow, truncate) == (32.0, 1.0, 1)


def test_unsupported_rope_type(saved, tmp_path):
    d = edit_config(saved["olmoe"]["dirs"]["per_expert"], tmp_path / "hf",
                    rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(ConversionError, match="RoPE scaling type 'longrope' not supported"):
        convert(d, tmp_path / "m.colibri")


def test_unknown_model_type(saved, tmp_path):
    d = edit_config(saved["mixtral"]["dirs"]["per_expert"], tmp_path / "hf",
                    model_type="nllb_moe")
    with pytest.raises(ConversionError) as err:
        convert(d, tmp_path / "m.colibri")
    message = str(err.value)
    assert "nllb_moe" in message
    assert all(f in message for f in FAMILIES)
    assert not (tmp_path / "m.colibri").exists()


def test_bad_dtype_argument(saved, tmp_path):
    with pytest.raises(ConversionError, match="dtype 'f8'"):
        convert(saved["mixtral"]["dirs"]["per_expert"], tmp_path / "m.colibri", dtype="f8")


# ---------------------------------------------------------------------------------------------
# Broken checkpoints: a clear error naming the tensor, and never a partial or clobbered file

def rewrite_tensors(src, dst, edit):
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    tensors = safetensors_numpy.load_file(str(path))
    edit(tensors)
    safetensors_numpy.save_file(tensors, str(path))
    return dst


def test_missing_tensor_leaves_no_file_and_keeps_existing(saved, tmp_path):
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    d = rewrite_tensors(saved["qwen3_moe"]["dirs"]["per_expert"], tmp_path / "hf",
                        lambda t: t.pop(name))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConversionError, match=f"missing tensor '{name}'"):
        convert(d, out_dir / "new.colibri")
    assert list(out_dir.iterdir()) == []
    existing = out_dir / "old.colibri"
    existing.write_bytes(b"previous contents")
    with pytest.raises(ConversionError, match=name):
        convert(d, existing)
    assert existing.read_bytes() == b"previous contents"
    assert [p.name for p in out_dir.iterdir()] == ["old.colibri"]


def test_missing_lm_head(saved, tmp_path):
    d = rewrite_tensors(saved["mixtral"]["dirs"]["per_expert"], tmp_path / "hf",
                        lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ConversionError, match="missing tensor 'lm_head.weight'"):
        convert(d, tmp_path / "m.colibri")


def test_shape_mismatch(saved, tmp_path):
    name = "model.layers.0.mlp.gate.weight"

    def transpose(t):  # the transposed-router mistake
        t[name] = np.ascontiguousarray(t[name].T)

    d = rewrite_tensors(saved["olmoe"]["dirs"]["per_expert"], tmp_path / "hf", transpose)
    with pytest.raises(ConversionError, match=rf"'{name}' has shape \[64, 4\], expected \[4, 64\]"):
        convert(d, tmp_path / "m.colibri")
    assert not (tmp_path / "m.colibri").exists()


def test_fused_shape_mismatch(saved, tmp_path):
    name = "model.layers.1.mlp.experts.gate_up_proj"

    def halve(t):
        t[name] = np.ascontiguousarray(t[name][:, :32])

    d = rewrite_tensors(saved["qwen3_moe"]["dirs"]["fused"], tmp_path / "hf", halve)
    with pytest.raises(ConversionError, match=rf"'{name}' has shape \[4, 32, 64\], expected "
                                              rf"\[4, 64, 64\]"):
        convert(d, tmp_path / "m.colibri")


def test_corrupt_safetensors_header(saved, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(saved["mixtral"]["dirs"]["per_expert"], d)
    path = d / "model.safetensors"
    blob = bytearray(path.read_bytes())
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header["model.norm.weight"]["data_offsets"][1] += 10 ** 9
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(blob[8 + n:]))
    with pytest.raises(ConversionError, match="model.norm.weight.*outside the data region"):
        convert(d, tmp_path / "m.colibri")


def test_f16_overflow_is_an_error(tmp_path):
    model = make_model("mixtral")
    with torch.no_grad():
        model.model.embed_tokens.weight[3, 5] = 1e6
    model.save_pretrained(tmp_path / "hf")
    with pytest.raises(ConversionError, match="token_embd.*overflows f16"):
        convert(tmp_path / "hf", tmp_path / "m.colibri", dtype="f16")
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # the temporary file is gone too


def test_token_id_outside_vocab_becomes_minus_one(saved, tmp_path):
    # OLMoE's class default eos 50279 lands in tiny models; the format wants -1 or an id < vocab.
    d = edit_config(saved["olmoe"]["dirs"]["per_expert"], tmp_path / "hf", eos_token_id=50279,
                    bos_token_id=[3, 4])
    convert(d, tmp_path / "m.colibri")
    parsed = read_colibri(tmp_path / "m.colibri")
    assert (parsed["hp"]["bos_token_id"], parsed["hp"]["eos_token_id"]) == (3, -1)
    assert "eos_token_id 50279" in parsed["metadata"]["notes"][0]


# ---------------------------------------------------------------------------------------------
# What the configs of PhiMoE, Granite and DBRX mean (colibri.families), without tensors

def _family_config(model_type: str, **kw: object) -> dict:
    base = dict(model_type=model_type, vocab_size=64, hidden_size=16, intermediate_size=8,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                num_local_experts=4, num_experts_per_tok=2)
    return {**base, **kw}


def test_phimoe_routes_two_experts_whatever_the_config_says():
    from colibri.families import architecture_from_config

    arch = architecture_from_config(_family_config("phimoe", num_experts_per_tok=4))
    assert arch.hp.n_experts_active == 2
    assert "stored as 2" in arch.notes[0]
    assert arch.rules[0].scoring == ff.SCORING_SPARSEMIXER
    assert arch.rules[0].sparsemixer_eps == pytest.approx(0.01)   # the class default
    with pytest.raises(ConversionError, match="sparsemixer chooses 2"):
        architecture_from_config(_family_config("phimoe", num_local_experts=1,
                                                num_experts_per_tok=1))


def test_phimoe_longrope_runs_the_short_factors_and_keeps_one_mscale():
    """transformers' PhiMoE divides the frequencies by the short factors at every length and
    scales cos/sin by short_mscale up to original_max_position_embeddings: with a different
    long_mscale the file's context stops there (beyond it the result depends on batching)."""
    from colibri.families import architecture_from_config

    rope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.5, 2.0],
            "long_factor": [3.0, 4.0], "short_mscale": 1.2, "long_mscale": 1.2,
            "original_max_position_embeddings": 16}
    raw = _family_config("phimoe", hidden_size=16, num_attention_heads=4,
                         max_position_embeddings=64, rope_parameters=rope)
    arch = architecture_from_config(raw)
    assert (arch.hp.rope_type, arch.hp.rope_attn_factor, arch.hp.max_context) == (
        ff.ROPE_LONGROPE, pytest.approx(1.2), 64)
    np.testing.assert_array_equal(arch.constants["rope_freq_factors"], [1.5, 2.0])
    arch = architecture_from_config({**raw, "rope_parameters": {**rope, "long_mscale": 1.4}})
    assert arch.hp.max_context == 16 and "the context is 16" in arch.notes[0]
    with pytest.raises(ConversionError, match="short_factor = .*expected a list of 2 numbers"):
        architecture_from_config({**raw, "rope_parameters": {**rope, "short_factor": [1.0]}})
    with pytest.raises(ConversionError, match="short_factor"):
        architecture_from_config({**raw, "rope_parameters": {**rope, "short_factor": [1.0, 0]}})


@pytest.mark.parametrize("model_type", ["phimoe", "granitemoe", "granitemoeshared"])
def test_experts_other_than_silu_are_refused(model_type):
    from colibri.families import architecture_from_config

    with pytest.raises(ConversionError, match="hidden_act = 'gelu' is not supported"):
        architecture_from_config(_family_config(model_type, hidden_act="gelu"))


@pytest.mark.parametrize("field", ["embedding_multiplier", "attention_multiplier",
                                   "residual_multiplier", "logits_scaling"])
def test_granite_multipliers_must_be_positive(field):
    from colibri.families import architecture_from_config

    with pytest.raises(ConversionError, match=f"{field} = 0"):
        architecture_from_config(_family_config("granitemoe", **{field: 0}))


def test_dbrx_reads_its_sub_configs():
    from colibri.families import architecture_from_config

    raw = dict(model_type="dbrx", vocab_size=64, d_model=16, n_heads=4, n_layers=2,
               max_seq_len=64, attn_config=dict(kv_n_heads=2, clip_qkv=None, rope_theta=5e5),
               ffn_config=dict(ffn_hidden_size=8, moe_num_experts=4, moe_top_k=2,
                               moe_normalize_expert_weights=None))
    arch = architecture_from_config(raw)
    hp = arch.hp
    assert (hp.n_kv_heads, hp.head_dim, hp.d_ff_expert, hp.n_experts, hp.n_experts_active) == (
        2, 4, 8, 4, 2)
    assert hp.clip_qkv == 0.0 and hp.norm_kind == ff.NORM_KIND_LAYER and hp.norm_eps == 1e-5
    assert hp.rope_theta == 10000.0 and "attn_config.rope_theta 500000.0" in arch.notes[0]
    assert arch.rules[0].normalize == ff.NORM_NONE
    for bad, match in ((dict(ffn_config=dict(ffn_act_fn={"name": "gelu"})), "ffn_act_fn"),
                       (dict(tie_word_embeddings=True), "tie_word_embeddings"),
                       (dict(attn_config=[1]), "attn_config = \\[1\\], expected an object")):
        with pytest.raises(ConversionError, match=match):
            architecture_from_config({**raw, **bad})
