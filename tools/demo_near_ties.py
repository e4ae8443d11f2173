"""Give the trained demo model routing near-ties, so the jitter lab has something real to show.

A trained router rarely puts two experts within a few float ULPs of each other: on the demo as
trained, 848 routing decisions of a 212-token prompt had no margin below 512 ULPs, no reduction
order flipped any of them, and every epsilon of the sweep was the same (docs/jitter.md). Models
whose experts were copied from one another (near-duplicate router rows) do have such ties. This
script makes the demo one of them, in the open:

  * in MoE layers 1 and 2, route 1500 tokens of zipfile.py (the text tools/demo_specialisation.py
    uses) with the engine; expert a = the expert most often ranked second, expert b = the expert
    least often ranked first or second (the least useful one);
  * router row b becomes row a times (1 + s_i * 2^-18), s_i = +-1 from a seeded generator:
    logits of a and b now differ by 0 to ~100 ULPs, so whenever a ranks second, the k-th and
    (k+1)-th logits are a near-tie that reduction order, FMA, a kernel path or bf16 activations
    can flip; expert b keeps its own weights, so a flip changes what the layer computes.

Every other byte of the model is unchanged. The result records what was done in the file's user
metadata (`demo.near_ties`), with the prompts that show the ties (`demo.prompts`, the Inspector's
default prompt) and the next-token loss on the zipfile.py stretch before and after.

    .venv/bin/python tools/demo_near_ties.py [IN [OUT]]   (default: resources/demo/demo.colibri,
                                                            rewritten in place)
"""

from __future__ import annotations

import json
import sys
import sysconfig
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

from colibri import fileformat as ff  # noqa: E402
from colibri.engine import Model, Session  # noqa: E402

LAYERS = (1, 2)
RELATIVE = 2.0 ** -18
SEED = 0
# Prompts on which the jitter lab shows flips and the epsilon sweep a recommendation (checked by
# tests/jitter/test_demo_near_ties.py); the first is the Inspector's default prompt.
PROMPTS = ("def read_header(self, data):", "import os")


def calibration_ids(model: Model) -> list[int]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = (stdlib / "zipfile.py").read_text(encoding="utf-8")[:12000]
    return list(model.tokenizer.encode(text).ids[:1500])


def next_token_loss(model: Model, ids: list[int]) -> tuple[float, np.ndarray, list[int]]:
    """Mean next-token cross-entropy over `ids`, the router logits [positions, moe, experts] and
    the layer index of each MoE layer."""
    session = Session(model, max_context=len(ids))
    logits = session.prefill(ids, all_logits=True).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = float(-logp[np.arange(len(ids) - 1), ids[1:]].mean())
    trace = session.trace
    return loss, np.array(trace.router_logits), [int(x) for x in trace.moe_layers]


def choose_pair(router_logits: np.ndarray, moe_index: int) -> tuple[int, int]:
    """(a, b): the expert most often ranked second, and the one least often ranked first or
    second (ties to the lower id)."""
    ranks = np.argsort(-router_logits[:, moe_index, :], axis=1, kind="stable")
    n = router_logits.shape[2]
    second = np.bincount(ranks[:, 1], minlength=n)
    used = np.bincount(ranks[:, 0], minlength=n) + second
    a = int(np.argmax(second))
    b = int(min((e for e in range(n) if e != a), key=lambda e: (used[e], e)))
    return a, b


def write_copy(model: Model, out: Path, overrides: dict[str, np.ndarray],
               user: dict[str, Any]) -> None:
    """`model` with the tensors in `overrides` replaced (float32 values, stored in each tensor's
    own dtype) and `user` as its user metadata."""
    names = {f.name for f in fields(ff.HParams)}
    hp = ff.HParams(**{k: v for k, v in model.hparams.to_dict().items() if k in names})
    kinds = [ff.LAYER_MOE if model.routing(layer).kind == "moe" else ff.LAYER_DENSE
             for layer in range(model.hparams.n_layers)]
    specs = []
    for info in model.tensors:
        dtype = ff.DTYPE_BY_NAME[info.dtype]

        def load(name: str = info.name, dtype: int = dtype) -> object:
            return ff.to_storage(overrides.get(name, model.tensor_f32(name)), dtype)

        specs.append(ff.TensorSpec(info.name, dtype, tuple(int(s) for s in info.shape), load))
    plan = ff.plan_file(hp, kinds, specs, tokenizer=model.tokenizer_json, metadata=user)
    ff.write_colibri(out, plan)


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else REPO / "resources" / "demo" / "demo.colibri"
    out = Path(argv[1]) if len(argv) > 1 else source
    with Model.open(source) as model:
        user = dict(model.metadata.get("user") or {})
        if "demo" in user:
            print(f"{source} already has its near-ties ({json.dumps(user['demo']['near_ties'])})",
                  file=sys.stderr)
            return 1
        ids = calibration_ids(model)
        loss_before, router_logits, moe_layers = next_token_loss(model, ids)
        rng = np.random.default_rng(SEED)
        overrides: dict[str, np.ndarray] = {}
        ties = []
        for layer in LAYERS:
            a, b = choose_pair(router_logits, moe_layers.index(layer))
            name = f"layers.{layer}.moe_gate"
            gate = model.tensor_f32(name).copy()
            signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=gate.shape[1])
            gate[b] = gate[a] * (np.float32(1.0) + np.float32(RELATIVE) * signs)
            overrides[name] = gate
            ties.append({"layer": layer, "expert": b, "near_copy_of": a,
                         "relative_perturbation": RELATIVE, "seed": SEED})
        user["demo"] = {"near_ties": ties, "prompts": list(PROMPTS),
                        "zipfile_loss_before": round(loss_before, 4)}
        tmp = out.with_name(out.name + ".near-ties")
        write_copy(model, tmp, overrides, user)
    with Model.open(tmp) as edited:
        loss_after = next_token_loss(edited, ids)[0]
    user["demo"]["zipfile_loss_after"] = round(loss_after, 4)
    with Model.open(tmp) as edited:
        write_copy(edited, out, {}, user)
    tmp.unlink()
    lines = [f"layer {t['layer']}: router row of expert {t['expert']} = row of expert "
             f"{t['near_copy_of']} x (1 +- 2^-18)" for t in ties]
    lines.append(f"next-token loss on {len(ids)} tokens of zipfile.py: {loss_before:.4f} "
                 f"before, {loss_after:.4f} after")
    print("\n".join(lines))
    record_provenance(out.parent, user["demo"], lines)
    print(f"wrote {out}")
    return 0


def record_provenance(directory: Path, demo: dict[str, Any], lines: list[str]) -> None:
    """Add the edit to PROVENANCE.md and provenance.json beside the file, when they are there
    (tools/train_demo.py writes them just before calling this)."""
    md, js = directory / "PROVENANCE.md", directory / "provenance.json"
    if js.is_file():
        data = json.loads(js.read_text(encoding="utf-8"))
        data["near_ties"] = demo
        js.write_text(json.dumps(data, indent=2), encoding="utf-8")
    if md.is_file():
        text = md.read_text(encoding="utf-8").split("\n## Routing near-ties")[0].rstrip("\n")
        section = ["", "## Routing near-ties", "",
                   "After training, `tools/demo_near_ties.py` gave two experts near-duplicate "
                   "router rows, so that some routing decisions are within a few float ULPs and "
                   "the jitter lab has flips to show (the script's docstring says how and why):",
                   "", "```", *lines, "```", "",
                   "Prompts that show flips and an epsilon recommendation: "
                   + ", ".join(f"`{p}`" for p in demo["prompts"]) + ".", ""]
        md.write_text(text + "\n" + "\n".join(section), encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
