"""Evidence that the demo model's experts specialise: route a held-out stretch of Python source
through the engine and print, per MoE layer, each expert's share of top-1 choices and the tokens
it takes most often (top-1), plus the share of tokens whose top-1 expert matches the expert most
associated with that token id (1/n_experts would mean no specialisation by token).

    .venv/bin/python tools/demo_specialisation.py [resources/demo/demo.colibri]
"""

from __future__ import annotations

import sys
import sysconfig
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

import colibri

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    path = argv[0] if argv else str(REPO / "resources" / "demo" / "demo.colibri")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = (stdlib / "zipfile.py").read_text(encoding="utf-8")[:12000]   # late in the held-out range
    with colibri.Model.open(path) as model:
        tok = model.tokenizer
        ids = tok.encode(text).ids[:1500]
        session = colibri.Session(model, max_context=len(ids))
        session.prefill(ids, all_logits=False)
        trace = session.trace
        top1 = trace.expert_ids[:, :, 0]
        n_experts = model.hparams.n_experts
        print(f"{path}: {len(ids)} tokens of zipfile.py, top-1 expert per MoE layer")
        for mi, layer in enumerate(trace.moe_layers):
            load = np.bincount(top1[:, mi], minlength=n_experts) / len(ids)
            by_token: dict[int, Counter[int]] = defaultdict(Counter)
            for t, e in zip(ids, top1[:, mi]):
                by_token[t][int(e)] += 1
            consistent = sum(c.most_common(1)[0][1] for c in by_token.values()) / len(ids)
            print(f"layer {layer}: load " + " ".join(f"{x:.2f}" for x in load)
                  + f"; token->expert consistency {consistent:.2f} (chance {1 / n_experts:.2f})")
            for e in range(n_experts):
                taken = Counter(t for t, x in zip(ids, top1[:, mi]) if x == e)
                words = ", ".join(repr(tok.decode([t])) for t, _ in taken.most_common(6))
                print(f"  expert {e}: {words}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
