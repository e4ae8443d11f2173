"""Train the bundled demo model: a small Mixtral-style MoE language model on Python's own sources.

Development-only (needs torch and transformers, the test extras). Rebuild with

    .venv/bin/python tools/train_demo.py --out resources/demo

which writes `demo.colibri` (converted with `colibri convert --dtype f16`) and `PROVENANCE.md`
(architecture, parameter count, data, steps, loss curve), then gives the file its routing
near-ties with `tools/demo_near_ties.py`. The corpus is every `.py` file of the
running interpreter's standard library, read in sorted order, so the data is on every machine
and needs no network. Training is deterministic for a given seed, corpus and thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))


def corpus_files(limit_bytes: int) -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py")
                   if "site-packages" not in p.parts and "test" not in p.parts and "tests" not in p.parts)
    chosen, total = [], 0
    for path in files:
        size = path.stat().st_size
        if total + size > limit_bytes:
            continue
        chosen.append(path)
        total += size
    return chosen


def read_corpus(files: list[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def encode_corpus(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    eot = tokenizer.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.int64)


def make_model(vocab_size: int, eot: int) -> transformers.MixtralForCausalLM:
    config = transformers.MixtralConfig(
        vocab_size=vocab_size, hidden_size=256, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, router_aux_loss_coef=0.02, output_router_logits=True,
        bos_token_id=None, eos_token_id=eot, pad_token_id=None)
    return transformers.MixtralForCausalLM(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "resources" / "demo")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--corpus-bytes", type=int, default=12_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint", type=Path, default=REPO / "build" / "demo-hf",
                        help="where the trained Hugging Face checkpoint is kept (not committed)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    started = time.time()

    files = corpus_files(args.corpus_bytes)
    texts = read_corpus(files)
    tokenizer = train_tokenizer(texts, args.vocab)
    data = encode_corpus(tokenizer, texts)
    held_out = data[-200_000:]
    train = data[:-200_000]
    print(f"corpus: {len(files)} files, {sum(len(t) for t in texts):,} chars, {len(data):,} tokens", flush=True)

    model = make_model(tokenizer.get_vocab_size(), tokenizer.token_to_id("<|endoftext|>"))
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    generator = np.random.default_rng(args.seed)

    def batch_from(source: np.ndarray) -> torch.Tensor:
        starts = generator.integers(0, len(source) - args.seq - 1, args.batch)
        return torch.from_numpy(np.stack([source[s:s + args.seq] for s in starts]))

    def evaluate() -> float:
        model.eval()
        losses = []
        eval_rng = np.random.default_rng(12345)
        with torch.no_grad():
            for _ in range(8):
                starts = eval_rng.integers(0, len(held_out) - args.seq - 1, args.batch)
                ids = torch.from_numpy(np.stack([held_out[s:s + args.seq] for s in starts]))
                out = model(ids, labels=ids)
                losses.append(float(out.loss - model.config.router_aux_loss_coef * out.aux_loss))
        model.train()
        return float(np.mean(losses))

    history = []
    model.train()
    initial_eval = evaluate()
    print(f"params {n_params:,}; held-out loss before training {initial_eval:.3f}", flush=True)
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        ids = batch_from(train)
        out = model(ids, labels=ids)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            lm_loss = float(out.loss - model.config.router_aux_loss_coef * out.aux_loss)
            history.append((step, lm_loss))
            print(f"step {step:5d}  loss {lm_loss:.3f}  aux {float(out.aux_loss):.3f}  "
                  f"{time.time() - started:.0f}s", flush=True)
    final_eval = evaluate()
    print(f"held-out loss after training {final_eval:.3f}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    hf_dir = args.checkpoint
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.config.output_router_logits = False
    model.save_pretrained(hf_dir)
    tokenizer.save(str(hf_dir / "tokenizer.json"))
    from colibri.convert import convert  # after training: the checkpoint survives a failed import

    convert(hf_dir, args.out / "demo.colibri", dtype="f16")
    size = (args.out / "demo.colibri").stat().st_size
    provenance = {
        "architecture": "Mixtral (MixtralForCausalLM): 4 layers, hidden 256, 8 heads / 4 KV heads, "
                        "8 experts of intermediate size 192, top-2, tied embeddings, context 2048",
        "parameters": n_params,
        "tokenizer": f"byte-level BPE, {tokenizer.get_vocab_size()} tokens, trained on the corpus",
        "data": f"{len(files)} .py files of the Python {sys.version.split()[0]} standard library "
                f"(tests excluded), {len(data):,} tokens; last 200,000 tokens held out",
        "steps": args.steps, "batch": args.batch, "sequence": args.seq, "lr": args.lr,
        "seed": args.seed, "threads": args.threads,
        "held_out_loss_before": round(initial_eval, 4), "held_out_loss_after": round(final_eval, 4),
        "train_loss_history": history, "stored_dtype": "f16", "file_bytes": size,
        "minutes": round((time.time() - started) / 60, 1),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    lines = ["# Demo model provenance", "",
             "Made by `tools/train_demo.py`; rebuild with `.venv/bin/python tools/train_demo.py`.", ""]
    for key, value in provenance.items():
        if key != "train_loss_history":
            lines.append(f"- **{key}**: {value}")
    lines += ["", "Training loss (step, loss): " + ", ".join(f"({s}, {l:.2f})" for s, l in history), ""]
    (args.out / "PROVENANCE.md").write_text("\n".join(lines), encoding="utf-8")
    (args.out / "provenance.json").write_text(json.dumps(provenance, indent=2), encoding="utf-8")
    print(f"wrote {args.out / 'demo.colibri'} ({size:,} bytes)")
    # the shipped demo also has routing near-ties, for the jitter lab
    import demo_near_ties

    return demo_near_ties.main([str(args.out / "demo.colibri")])


if __name__ == "__main__":
    raise SystemExit(main())
