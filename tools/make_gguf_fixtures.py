#!/usr/bin/env python3
"""Make tests/fixtures/gguf/: small GGUF files written by llama.cpp's own tools.

For each family Colibri imports from GGUF and llama.cpp's converter reads (mixtral, qwen2_moe,
qwen3_moe, olmoe, gpt_oss, llama4, phimoe, granitemoe, granitemoeshared, dbrx, deepseek_v2,
deepseek_v3, glm4_moe, ernie4_5_moe) this script
  1. trains a small tokenizer on a few of Python's own source files: a SentencePiece BPE model
     (`tokenizer.model`, with byte fallback, as Mixtral ships) for mixtral, a byte-level BPE
     (`tokenizers`) with Qwen2's pre-tokenizer for the Qwen families and GPT-2's for OLMoE,
     DeepSeek-V2's, DeepSeek-V3's and GLM-4.5's split expressions for theirs, SentencePiece
     for ERNIE 4.5 as for Mixtral;
  2. builds a small random transformers model with `tests/hf_reference.py`'s builder (fixed
     seed) and saves it the standard way, with the tokenizer;
  3. converts it with llama.cpp's `convert_hf_to_gguf.py` (outtypes f32 and bf16) and quantises
     the f32 file with `llama-quantize` (Q8_0 and Q4_0, llama.cpp's default tensor mix; for
     gpt_oss also MXFP4_MOE, the experts in MXFP4 as published GPT-OSS GGUF files hold them).
The weights are not committed: `manifest.json` records each family's config and seed, and the
tests rebuild the same model (torch is pinned) and check it against the f32 file. The
tokenizer files are committed beside the GGUF files (`<family>-hf/`).

llama.cpp identifies a BPE tokenizer's pre-tokenizer by hashing how it encodes a test string,
and knows only released tokenizers; these are trained here, so the script tells the converter
which pre-tokenizer each one was built with ('qwen2', 'olmo', 'deepseek-llm', 'deepseek-v3',
'glm4': the same regular expressions).

    python tools/make_gguf_fixtures.py        # needs `pip install -e .[fixtures]`, cmake, ~10 min
    python tools/make_gguf_fixtures.py gpt_oss llama4   # (re)make only these families
    python tools/make_gguf_fixtures.py --check  # the committed files against manifest.json

The llama.cpp version is tools/llamacpp.py's (the llama-cpp-python sdist it vendors).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "gguf"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

import llamacpp  # noqa: E402
from colibri.formats import gguf_tokenizer  # noqa: E402

VOCAB = 512
SEED = 7
_BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
# Every row length a multiple of 32 so that Q8_0/Q4_0 apply to every matrix.
CONFIGS: dict[str, dict[str, Any]] = {
    "mixtral": dict(_BASE, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                    rope_theta=1e6),
    "qwen2_moe": dict(_BASE, intermediate_size=128, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                      decoder_sparse_step=1, norm_topk_prob=False),
    "qwen3_moe": dict(_BASE, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=True),
    "olmoe": dict(_BASE, num_key_value_heads=4, intermediate_size=32, num_experts=4,
                  num_experts_per_tok=2),
    # what llama.cpp's gpt-oss graph assumes and GGUF does not store: swiglu alpha 1.702 and
    # limit 7, attention biases, every second layer sliding from layer 0; default RoPE (ggml's
    # YaRN floors and ceils the correction range, transformers' GPT-OSS does not)
    "gpt_oss": dict(_BASE, head_dim=16, intermediate_size=64, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=8,
                    rope_parameters={"rope_type": "default", "rope_theta": 150000.0}),
    # llama.cpp's llama4 graph fixes the chunk (8192), the NoPE interval (4), the temperature
    # (floor 8192, scale 0.1) and the q/k norm (unless 128 experts): Llama4TextConfig's defaults
    "llama4": dict(_BASE, num_hidden_layers=4, head_dim=16, intermediate_size=32,
                   intermediate_size_mlp=64, num_local_experts=4, num_experts_per_tok=1,
                   interleave_moe_layer_step=2),
    # Phi-3.5-MoE's LongRoPE; both mscales are llama.cpp's attention factor for 256 / 64
    # (sqrt(1 + ln 4 / ln 64)), which the GGUF file records instead of them
    "phimoe": dict(_BASE, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                   attention_bias=True, lm_head_bias=True, rope_parameters={
                       "rope_type": "longrope", "rope_theta": 10000.0,
                       "short_factor": [1.0, 1.2, 1.5, 2.0, 2.6, 3.3, 4.1, 5.0],
                       "long_factor": [1.1, 1.9, 3.2, 5.0, 7.5, 11.0, 15.0, 20.0],
                       "short_mscale": 1.1547005383792517, "long_mscale": 1.1547005383792517,
                       "original_max_position_embeddings": 64}),
    "granitemoe": dict(_BASE, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                       embedding_multiplier=12.0, attention_multiplier=0.015625,
                       residual_multiplier=0.22, logits_scaling=6.0),
    "granitemoeshared": dict(_BASE, intermediate_size=64, num_local_experts=4,
                             num_experts_per_tok=2, shared_intermediate_size=64,
                             embedding_multiplier=12.0, attention_multiplier=0.015625,
                             residual_multiplier=0.22, logits_scaling=6.0),
    # rope_theta in attn_config equal to what transformers runs (rope_parameters' 10000):
    # llama.cpp's converter takes attn_config's, transformers 5.23 never reads it
    "dbrx": dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
                 bos_token_id=None, eos_token_id=None, pad_token_id=None,
                 attn_config=dict(kv_n_heads=2, clip_qkv=1.0, rope_theta=10000.0),
                 ffn_config=dict(ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2,
                                 moe_normalize_expert_weights=1.0)),
    # MLA's rows (q_a/q_b/kv_a/k_b/v_b) all multiples of 32 and its widths all different (so
    # that no transposition goes unseen), group-limited routing over 2 groups, a routed scale;
    # q_lora_rank set: llama.cpp reads a direct q_proj (V2-Lite's) only in 26, 27 or 48 layers
    "deepseek_v2": dict(_BASE, num_key_value_heads=4, intermediate_size=128,
                        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=64,
                        q_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
                        v_head_dim=24, topk_method="group_limited_greedy", n_group=2,
                        topk_group=1, routed_scaling_factor=2.0),
    # DeepSeek-V3's YaRN (mscale = mscale_all_dim, as published), q_lora_rank, 2 groups
    "deepseek_v3": dict(_BASE, num_key_value_heads=4, intermediate_size=128,
                        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                        n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
                        kv_lora_rank=64, q_lora_rank=32, qk_nope_head_dim=32,
                        qk_rope_head_dim=16, v_head_dim=24, norm_topk_prob=True,
                        routed_scaling_factor=2.5, rope_interleave=True,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                         "factor": 4.0, "original_max_position_embeddings": 64,
                                         "mscale": 1.0, "mscale_all_dim": 1.0,
                                         "beta_fast": 32.0, "beta_slow": 1.0}),
    # half the head rotated (the default), q/k norms and biases, one MTP layer (added below)
    "glm4_moe": dict(_BASE, intermediate_size=128, moe_intermediate_size=32,
                     n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                     n_shared_experts=1, first_k_dense_replace=1, use_qk_norm=True,
                     attention_bias=True, norm_topk_prob=True, routed_scaling_factor=2.5,
                     num_nextn_predict_layers=1),
    # llama.cpp writes intermediate_size / num_key_value_heads as the shared experts' width:
    # 128 / 2 = 2 x 32, as it holds for ERNIE-4.5-21B-A3B
    "ernie4_5_moe": dict(_BASE, intermediate_size=128, moe_intermediate_size=32,
                         moe_num_experts=4, moe_k=2, moe_num_shared_experts=2,
                         moe_layer_start_index=1),
}
TOKENIZER = {"mixtral": "spm", "qwen2_moe": "qwen2", "qwen3_moe": "qwen2", "olmoe": "olmo",
             "gpt_oss": "qwen2", "llama4": "qwen2", "phimoe": "spm", "granitemoe": "olmo",
             "granitemoeshared": "olmo", "dbrx": "qwen2", "deepseek_v2": "deepseek-llm",
             "deepseek_v3": "deepseek-v3", "glm4_moe": "glm4", "ernie4_5_moe": "spm"}
# What llama.cpp's converter needs of a config.json that transformers 5.23 does not write: the
# architecture name it registers PhiMoE under (transformers saves 'PhimoeForCausalLM').
CONFIG_JSON_EDITS: dict[str, dict[str, Any]] = {
    "phimoe": {"architectures": ["PhiMoEForCausalLM"]},
    # DeepSeek-V3's published config.json names its scoring function (llama.cpp's converter
    # writes expert_gating_func from it; transformers' class has no such field)
    "deepseek_v3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
}
# SentencePiece tokenizers that prepend no space (add_prefix_space false in
# tokenizer_config.json, as llama.cpp's ERNIE converter expects it there)
NO_PREFIX_SPACE = ("ernie4_5_moe",)
# Tensors a published checkpoint has that transformers 5.23 neither builds nor saves, added to
# the saved checkpoint before conversion: GLM-4.5's multi-token-prediction layer after the last.
CHECKPOINT_EXTRAS = {"glm4_moe": "the MTP layer model.layers.2 (eh_proj, enorm, hnorm, "
                                 "shared_head.norm and a MoE decoder layer), random"}
OUTTYPES = ("f32", "bf16")
QUANTS = ("Q8_0", "Q4_0")
EXTRA_QUANTS = {"gpt_oss": ("MXFP4_MOE",)}
CORPUS_FILES = ("textwrap.py", "string.py", "fnmatch.py", "shlex.py")

# Qwen2's pre-tokenizer (tokenizer.json of Qwen2/Qwen3; llama.cpp's 'qwen2').
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The split expressions, applied in turn, of the released tokenizers whose pre-tokenizer
# llama.cpp names so (DeepSeek's are long: llama-vocab.cpp's, as the import has them).
SPLITS: dict[str, tuple[str, ...]] = {
    "qwen2": (QWEN2_REGEX,),
    "glm4": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),  # Llama 3's, GLM-4.5's tokenizer.json
    **{name: tuple(gguf_tokenizer.PRE_REGEX[name] or ())
       for name in ("deepseek-v3", "deepseek-llm")},
}
# Special tokens per pre-tokenizer (GLM's converter looks up [gMASK], <|user|>, <|endoftext|>
# and <|observation|>); GPT-2's for the others.
SPECIALS: dict[str, list[str]] = {
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "glm4": ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
             "<|user|>", "<|assistant|>", "<|observation|>"],
    "deepseek-v3": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"],
    "deepseek-llm": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
}


def log(message: str) -> None:
    print(f"[fixtures] {message}", file=sys.stderr, flush=True)


def corpus() -> str:
    lib = Path(sysconfig.get_paths()["stdlib"])
    return "\n".join((lib / name).read_text(encoding="utf-8") for name in CORPUS_FILES)


def spm_tokenizer(directory: Path, text: str, prefix_space: bool = True) -> None:
    """tokenizer.model (SentencePiece BPE, byte fallback, Llama's normalisation) and the
    tokenizer.json transformers makes from it; without `prefix_space` no space is prepended
    (the tokenizer_config's add_prefix_space false, which llama.cpp's ERNIE converter reads)."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "corpus.txt").write_text(text, encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(Path(tmp) / "corpus.txt"), model_prefix=str(Path(tmp) / "sp"),
            vocab_size=VOCAB, model_type="bpe", byte_fallback=True, character_coverage=1.0,
            split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            add_dummy_prefix=prefix_space,
            remove_extra_whitespaces=False, normalization_rule_name="identity", num_threads=1,
            minloglevel=2, max_sentence_length=1 << 20, seed_sentencepiece_size=100000)
        shutil.copy(Path(tmp) / "sp.model", directory / "tokenizer.model")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "legacy": False,
        **({} if prefix_space else {"add_prefix_space": False})}))
    AutoTokenizer.from_pretrained(directory).save_pretrained(directory)


def bpe_tokenizer(directory: Path, text: str, pre: str) -> None:
    """A byte-level BPE tokenizer.json: the split expressions of SPLITS[pre] (Qwen2's, GLM-4.5's,
    DeepSeek's) or GPT-2's (OLMoE's GPT-NeoX)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pre in SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            *(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SPLITS[pre]),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = SPECIALS[pre]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = ["<|endoftext|>", "<|padding|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<｜end▁of▁sentence｜>" if pre.startswith("deepseek") else "<|endoftext|>",
        "bos_token": None, "unk_token": None, "add_bos_token": False}))


def hf_checkpoint(family: str, directory: Path) -> None:
    import hf_reference

    variant = hf_reference.Variant(f"{family}-gguf", family, CONFIGS[family])
    model = hf_reference.build(variant, seed=SEED)
    model.save_pretrained(directory)
    if family in CHECKPOINT_EXTRAS:
        mtp_layer(directory, CONFIGS[family])
    if family in CONFIG_JSON_EDITS:
        config = json.loads((directory / "config.json").read_text())
        config.update(CONFIG_JSON_EDITS[family])
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def mtp_layer(directory: Path, config: dict[str, Any]) -> None:
    """Add GLM-4.5's multi-token-prediction layer to the saved checkpoint, as the published
    checkpoints hold it after the last decoder layer: eh_proj [H, 2H], enorm, hnorm,
    shared_head.norm and a MoE decoder layer shaped like the last one, random (seeded)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    last, mtp = config["num_hidden_layers"] - 1, config["num_hidden_layers"]
    rng = np.random.default_rng(SEED)
    H = config["hidden_size"]
    prefix = f"model.layers.{last}."
    extra = {f"model.layers.{mtp}.{k[len(prefix):]}": v for k, v in tensors.items()
             if k.startswith(prefix)}
    extra.update({f"model.layers.{mtp}.eh_proj.weight": np.zeros((H, 2 * H), np.float32),
                  **{f"model.layers.{mtp}.{n}.weight": np.zeros(H, np.float32)
                     for n in ("enorm", "hnorm", "shared_head.norm")}})
    for name, value in extra.items():
        tensors[name] = (rng.standard_normal(value.shape) * 0.08).astype(np.float32)
    save_file(tensors, path, metadata={"format": "pt"})


# Runs convert_hf_to_gguf.py as its own __main__, after telling its pre-tokenizer table about
# the tokenizer trained here (see the module docstring).
_CONVERT = """
import runpy, sys
src, pre, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path[:0] = [src, src + "/gguf-py"]
from conversion import base
if pre != "-":
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [src + "/convert_hf_to_gguf.py", *argv]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_quietly(argv: list[str]) -> None:
    """Run a llama.cpp tool; its output is shown only when it fails."""
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    if done.returncode:
        raise SystemExit(f"{done.stdout[-4000:]}\n{Path(argv[0]).name} failed ({done.returncode})")


def convert(tools: llamacpp.LlamaCpp, hf_dir: Path, out: Path, outtype: str, pre: str) -> None:
    source = tools.fetch()
    run_quietly([sys.executable, "-c", _CONVERT, str(source), pre, str(hf_dir), "--outfile",
                 str(out), "--outtype", outtype])


def quantize(tools: llamacpp.LlamaCpp, src: Path, dst: Path, qtype: str) -> None:
    run_quietly([str(tools.quantize()), str(src), str(dst), qtype])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make(families: list[str]) -> None:
    """(Re)make the fixtures of `families`, keeping the other families' files and entries."""
    tools = llamacpp.LlamaCpp()
    tools.quantize()  # build first: fail early without cmake
    text = corpus()
    OUT.mkdir(parents=True, exist_ok=True)
    old = json.loads((OUT / "manifest.json").read_text()) if (OUT / "manifest.json").exists() \
        else {"files": []}
    entries = [{k: e[k] for k in ("file", "family", "made_by")} for e in old["files"]
               if e["family"] not in families and e["family"] in CONFIGS]
    for family in families:
        log(family)
        hf_dir = OUT / f"{family}-hf"
        shutil.rmtree(hf_dir, ignore_errors=True)
        for stale in OUT.glob(f"{family}-*.gguf"):
            stale.unlink()
        hf_dir.mkdir()
        if TOKENIZER[family] == "spm":
            spm_tokenizer(hf_dir, text, prefix_space=family not in NO_PREFIX_SPACE)
        else:
            bpe_tokenizer(hf_dir, text, TOKENIZER[family])
        with tempfile.TemporaryDirectory() as tmp:
            full = Path(tmp) / "hf"
            shutil.copytree(hf_dir, full)
            hf_checkpoint(family, full)
            for name in ("config.json", "generation_config.json"):
                if (full / name).exists():
                    shutil.copy(full / name, hf_dir / name)
            pre = "-" if TOKENIZER[family] == "spm" else TOKENIZER[family]
            for outtype in OUTTYPES:
                out = OUT / f"{family}-{outtype}.gguf"
                convert(tools, full, out, outtype, pre)
                entries.append({"file": out.name, "family": family, "made_by":
                                f"convert_hf_to_gguf.py --outtype {outtype}"})
            for qtype in QUANTS + EXTRA_QUANTS.get(family, ()):
                out = OUT / f"{family}-{qtype.lower()}.gguf"
                quantize(tools, OUT / f"{family}-f32.gguf", out, qtype)
                entries.append({"file": out.name, "family": family, "made_by":
                                f"llama-quantize {family}-f32.gguf {qtype}"})
    manifest = {
        "llama_cpp_python": llamacpp.VERSION, "sdist_sha256": llamacpp.SDIST_SHA256,
        "seed": SEED, "configs": CONFIGS, "tokenizers": TOKENIZER,
        "config_json_edits": CONFIG_JSON_EDITS, "checkpoint_extras": CHECKPOINT_EXTRAS,
        "files": [dict(e, sha256=sha256(OUT / e["file"]), bytes=(OUT / e["file"]).stat().st_size)
                  for e in sorted(entries, key=lambda e: list(CONFIGS).index(e["family"]))],
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    check()


def check() -> None:
    manifest = json.loads((OUT / "manifest.json").read_text())
    bad = [e["file"] for e in manifest["files"] if sha256(OUT / e["file"]) != e["sha256"]]
    if bad:
        raise SystemExit(f"changed since they were made: {', '.join(bad)}")
    total = sum(e["bytes"] for e in manifest["files"])
    log(f"{len(manifest['files'])} files, {total} bytes, as recorded")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the committed files")
    parser.add_argument("families", nargs="*", metavar="FAMILY",
                        help=f"remake only these (default: all of {', '.join(CONFIGS)})")
    args = parser.parse_args(argv)
    unknown = set(args.families) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown families: {', '.join(sorted(unknown))}")
    if args.check:
        check()
    else:
        make(args.families or list(CONFIGS))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
