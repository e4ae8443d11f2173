"""The routing debugger and the jitter lab on the families of format version 2 whose rules and
blocks are their own (PhiMoE's sparsemixer and LayerNorms, ...): each family's conformance
variant (tests/hf_reference.py), converted, runs through the Debugger to a breakpoint and through
the jitter lab's variants and epsilon sweep, and what they show is the rule's own math,
recomputed here from the logits the engine traced.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf_reference = pytest.importorskip("hf_reference")

from colibri.convert import convert  # noqa: E402
from colibri.debugging import Debugger, MarginBelow, RuleBook, RunSettings  # noqa: E402
from colibri.engine import Model  # noqa: E402
from colibri.jitter.analysis import Runner  # noqa: E402
from colibri.jitter.passes import analyze_epsilon, analyze_jitter  # noqa: E402

VARIANTS = {v.name: v for v in hf_reference.VARIANTS}
# one variant per family, the one with the most of its options switched on
TOOL_VARIANTS = ("phimoe-bias-window-wide-jitter-tied", "granitemoe-bias-odd-tied",
                 "granitemoeshared-shared", "dbrx-p2-odd-wide-clip-theta")
PROMPT = (3, 17, 42, 7, 90, 5, 61, 64, 8, 10)   # below every variant's vocabulary
JITTER = "seq,blocked4+fma,seq+split2,act-bf16,w-bf16,noise2"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family-tools")
    out = {}
    for name in TOOL_VARIANTS:
        hf_dir = hf_reference.save(hf_reference.build(VARIANTS[name]), root / name)
        out[name] = root / f"{name}.colibri"
        convert(hf_dir, out[name], dtype="f32")
    return out


def sparsemixer(logits: np.ndarray, eps: float) -> tuple[list[int], list[float]]:
    """transformers' PhiMoE router in eval mode, in float64: the best logit, then the best of
    the rest, each weighted by a softmax over the logits within 2 eps (relative) of it."""
    l = logits.astype(np.float64)
    ids, weights = [], []
    for slot in range(2):
        rest = l.copy()
        rest[ids] = -np.inf
        e = int(np.argmax(rest))
        m = rest[e]
        keep = (m - l) / np.maximum(np.abs(l), m) <= 2 * eps
        keep[ids] = False
        weights.append(float(1.0 / np.exp(l[keep] - m).sum()))
        ids.append(e)
    return ids, weights


@pytest.mark.parametrize("name", TOOL_VARIANTS)
def test_the_debugger_steps_the_family_to_a_margin_breakpoint(converted: dict, name: str) -> None:
    """The debugger runs a generation, stops at the first decision whose selection margin is below
    a threshold, and each decision's anatomy shows the rule's weights for the chosen experts."""
    with Model.open(converted[name]) as model:
        dbg = Debugger(model, RunSettings(PROMPT, 6))
        result = dbg.run()
        assert result.reason == "finished"
        events = dbg.events
        rules = RuleBook(model)
        margins = [e.margin for e in events]
        threshold = float(np.median(margins))
        for e in events:
            a = rules.of(e)
            rule = model.routing(e.layer)
            if name.startswith("phimoe"):
                ids, weights = sparsemixer(a.logits, rule.sparsemixer_eps)
                assert list(e.expert_ids) == ids
                np.testing.assert_allclose(a.weight[ids], weights, rtol=2e-6)
                assert a.selection_is_logit and a.rule.startswith("sparsemixer over")
            if name.startswith("granite"):  # top-k of the logits, a softmax over the chosen
                ids = list(np.argsort(-a.logits.astype(np.float64), kind="stable")[:rule.top_k])
                assert list(e.expert_ids) == ids
                chosen = np.exp(a.logits[ids].astype(np.float64) - a.logits[ids].max())
                np.testing.assert_allclose(a.weight[ids], chosen / chosen.sum(), rtol=2e-6)
                assert a.selection_is_logit and a.rule.startswith(f"top-{rule.top_k} of")
            if name.startswith("dbrx"):  # top-k of the softmax, divided by their p-norm
                z = np.exp(a.logits.astype(np.float64) - a.logits.max())
                probs = z / z.sum()
                ids = list(np.argsort(-probs, kind="stable")[:rule.top_k])
                assert list(e.expert_ids) == ids
                np.testing.assert_allclose(a.scores, probs, rtol=2e-6)
                norm = (np.abs(probs[ids]) ** rule.norm_p).sum() ** (1 / rule.norm_p)
                np.testing.assert_allclose(a.weight[ids], probs[ids] / norm, rtol=2e-6)
                assert a.rule.endswith(f"divided by their {rule.norm_p:g}-norm")

        again = Debugger(model, RunSettings(PROMPT, 6))
        stop = again.run([MarginBelow(threshold)])
        assert stop.reason == "breakpoint"
        first = next(i for i, m in enumerate(margins) if m < threshold)
        assert stop.event.index == first


@pytest.mark.parametrize("name", TOOL_VARIANTS)
def test_the_jitter_lab_measures_the_family(converted: dict, name: str) -> None:
    """Every numerics variant runs on the family (the weight-precision one on a rewritten copy of
    the file), the margins are those of the selection scores, and the epsilon sweep runs."""
    with Runner.open(converted[name]) as runner:
        tokens = runner.greedy_sequence(list(PROMPT), 6)
        report = analyze_jitter(runner, tokens, JITTER, len(PROMPT))
        assert report.variants == JITTER.split(",")
        moe = len(report.moe_layers)
        assert report.margin_abs.shape == (len(tokens), moe)
        sel = report.selection_scores["baseline"].astype(np.float64)
        k = report.k
        ordered = -np.sort(-sel, axis=-1)
        np.testing.assert_allclose(report.margin_abs, ordered[..., k - 1] - ordered[..., k],
                                   rtol=1e-6)
        for variant in report.variants:
            assert report.router_logits[variant].shape == sel.shape
        sweep = analyze_epsilon(runner, tokens, [0.0, 1e-6, 1e-3], "seq,noise2", len(PROMPT))
        assert [row.eps for row in sweep.rows] == [0.0, 1e-6, 1e-3]


def test_info_names_phimoes_rule_norm_and_biases(converted: dict,
                                                 capsys: pytest.CaptureFixture) -> None:
    from colibri.cli import main

    assert main(["info", str(converted["phimoe-bias-window-wide-jitter-tied"])]) == 0
    out = capsys.readouterr().out
    assert ("layer 0    sparsemixer over 6 experts: the best logit, then the best of the rest, "
            "each weighted by a softmax over the logits within 0.8 of it; sliding-window "
            "attention") in out
    assert "norm_kind                    2\n" in out
    assert "QKV_BIAS|O_BIAS|OUTPUT_BIAS" in out


def test_info_names_granites_multipliers(converted: dict, capsys: pytest.CaptureFixture) -> None:
    from colibri.cli import main

    assert main(["info", str(converted["granitemoeshared-shared"])]) == 0
    out = capsys.readouterr().out
    assert ("layer 0    top-2 of 4 logits, weighted by a softmax over the chosen; plus a shared "
            "expert") in out
    for field, value in (("attn_scale", "0.015625"), ("embedding_scale", "12"),
                         ("residual_scale", "0.22"), ("logit_divisor", "6")):
        assert f"{field:<28} {value}\n" in out


def test_info_notes_dbrxs_rope_theta(converted: dict, capsys: pytest.CaptureFixture) -> None:
    """DBRX's attn_config.rope_theta is stored but not run by transformers 5.23: the file runs
    rope_parameters' theta and its metadata says so."""
    from colibri.cli import main

    path = converted["dbrx-p2-odd-wide-clip-theta"]
    with Model.open(path) as model:
        assert model.hparams.rope_theta == 10000.0
        assert model.hparams.norm_kind == 1 and model.hparams.clip_qkv == 6.0
        assert "attn_config.rope_theta 500000.0 is not what transformers 5.23 runs" in \
            model.metadata["user"]["notes"][0]
    assert main(["info", str(path)]) == 0
    assert ("layer 0    softmax over 5 experts, top-3, divided by their 2-norm"
            in capsys.readouterr().out)
