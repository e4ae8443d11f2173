"""The engine's guarantees on the families of format version 2 (DeepSeek-V2/V3's latent attention
and grouped routing, GLM-4.5's partial RoPE and biased sigmoid routing, ERNIE's interleaved RoPE
and clamped softmax + bias, GPT-OSS's sinks, expert biases and clamped SwiGLU, Llama 4's chunked
attention, NoPE layers with a query temperature, q/k L2 norm and weighted expert inputs):
bit-identical results for 1..4 threads, prefill equal to stepping, the trace's selection scores
and kept groups as docs/format.md defines them, the routing modes acting on the selection score,
the CLI's --dump-trace keys, and the jitter lab and the debugger on every family added since.
The models are the conformance variants (tests/hf_reference.py), converted once per test
session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf_reference = pytest.importorskip("hf_reference")

from colibri.cli import main  # noqa: E402
from colibri.convert import convert  # noqa: E402
from colibri.engine import Model, Session  # noqa: E402

VARIANTS = {v.name: v for v in hf_reference.VARIANTS}
# one variant of each family the jitter lab and the debugger are run on below
NEW_FAMILIES = ("gpt_oss-yarn-alternating-clamped", "llama4-interleaved-nope-chunked-top1")
FAMILY_VARIANTS = ("deepseek_v3-groups-qlora", "deepseek_v2-grouped-qlora-scaled",
                   "glm4_moe-qknorm-bias-groups", "ernie4_5_moe-shared-tied",
                   "deepseek_v3-flat-yarn-halves", "phimoe-bias-window-wide-jitter-tied",
                   "granitemoe-bias-odd-tied", "granitemoeshared-shared", "dbrx-l1-clip",
                   "phimoe-longrope") + NEW_FAMILIES
TOKENS = [3, 17, 42, 7, 90, 5, 61, 64, 8, 10, 31, 2]  # below every variant's vocabulary


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name in FAMILY_VARIANTS:
        hf_dir = hf_reference.save(hf_reference.build(VARIANTS[name]), root / name)
        for dtype in ("f32", "bf16"):
            out[(name, dtype)] = root / f"{name}-{dtype}.colibri"
            convert(hf_dir, out[(name, dtype)], dtype=dtype)
    return out


def _run(path: Path, threads: int, routing: str = "topk", **kw: object) -> tuple[bytes, ...]:
    with Model.open(path) as model:
        s = Session(model, threads=threads, routing=routing, max_context=32, **kw)
        logits = s.prefill(TOKENS[:6])
        steps = [s.step(t) for t in TOKENS[6:]]
        tr = s.trace
        return (logits.tobytes() + b"".join(x.tobytes() for x in steps),
                tr.expert_ids.tobytes(), tr.expert_weights.tobytes(),
                tr.selection_scores.tobytes(), tr.chosen_groups.tobytes())


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", FAMILY_VARIANTS)
def test_bit_identical_for_threads_1_to_4(converted: dict, name: str, dtype: str) -> None:
    first = _run(converted[(name, dtype)], 1)
    for threads in (2, 3, 4):
        assert _run(converted[(name, dtype)], threads) == first, f"threads={threads}"


@pytest.mark.parametrize("name", FAMILY_VARIANTS)
def test_a_kv_cache_of_halves_is_its_own_deterministic_computation(converted: dict, name: str) -> None:
    """`kv-f16` caches keys and values (or MLA's latent rows) as halves: every family's attention
    (sliding, chunked, sinks, latent) reads them, 1 and 3 threads and a prefill and its steps
    agree bit for bit, and the logits move by the rounding, not more."""
    path = converted[(name, "bf16")]
    exact = np.frombuffer(_run(path, 1)[0], dtype=np.float32)
    halves = _run(path, 1, numerics="kv-f16")
    assert _run(path, 3, numerics="kv-f16") == halves
    logits = np.frombuffer(halves[0], dtype=np.float32)
    assert logits.tobytes() != exact.tobytes()
    assert np.abs(logits - exact).max() < 0.02 * np.abs(exact).max()
    with Model.open(path) as model:
        block = Session(model, threads=2, max_context=32, numerics="kv-f16").prefill(TOKENS)
        stepper = Session(model, threads=2, max_context=32, numerics="kv-f16")
        assert block.tobytes() == np.stack([stepper.step(t) for t in TOKENS]).tobytes()


@pytest.mark.parametrize("name", FAMILY_VARIANTS)
def test_prefill_equals_stepping(converted: dict, name: str) -> None:
    with Model.open(converted[(name, "bf16")]) as model:
        a = Session(model, threads=2, max_context=32)
        block = a.prefill(TOKENS)
        b = Session(model, threads=3, max_context=32)
        steps = np.stack([b.step(t) for t in TOKENS])
        assert block.tobytes() == steps.tobytes()
        for key in ("expert_ids", "expert_weights", "router_logits", "selection_scores",
                    "chosen_groups"):
            assert getattr(a.trace, key).tobytes() == getattr(b.trace, key).tobytes(), key


def test_selection_scores_are_sigmoid_plus_the_correction_bias(converted: dict) -> None:
    """DeepSeek-V3: what the choice ranks is sigmoid(logit) + e_score_correction_bias; the
    weights are the chosen sigmoids, renormalised and scaled; the kept group holds them all."""
    with Model.open(converted[("deepseek_v3-groups-qlora", "f32")]) as model:
        s = Session(model)
        s.prefill(TOKENS)
        tr = s.trace
        bias = np.stack([model.tensor(f"layers.{layer}.moe_correction_bias")
                         for layer in tr.moe_layers])
        sig = (1.0 / (1.0 + np.exp(-tr.router_logits.astype(np.float64)))).astype(np.float32)
        np.testing.assert_allclose(tr.selection_scores, sig + bias, rtol=0, atol=2e-7)
        rule = model.routing(1)
        assert (rule.n_groups, rule.n_groups_kept, tr.chosen_groups.shape[2]) == (2, 1, 1)
        assert (tr.expert_ids // 4 == tr.chosen_groups[:, :, :1]).all()
        chosen = np.take_along_axis(sig, tr.expert_ids.astype(np.int64), axis=-1)
        np.testing.assert_allclose(tr.expert_weights,
                                   chosen / chosen.sum(-1, keepdims=True) * rule.scale, rtol=2e-6)


def test_selection_scores_are_softmax_plus_moe_statics(converted: dict) -> None:
    with Model.open(converted[("ernie4_5_moe-shared-tied", "f32")]) as model:
        s = Session(model)
        s.prefill(TOKENS)
        tr = s.trace
        bias = model.tensor("layers.1.moe_correction_bias")
        z = tr.router_logits.astype(np.float64)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(tr.selection_scores, p + bias, rtol=0, atol=2e-7)
        assert tr.chosen_groups.shape[2] == 0


def test_stable_epsilon_acts_on_the_selection_score(converted: dict) -> None:
    """With epsilon 0 stable routing is the family's own choice; a large epsilon moves choices
    towards higher indices though the logits are unchanged, and the weights stay the rule's."""
    path = converted[("glm4_moe-qknorm-bias-groups", "f32")]
    plain = _run(path, 1)
    assert _run(path, 1, "stable", epsilon=0.0) == plain
    with Model.open(path) as model:
        s = Session(model, routing="stable", epsilon=0.05, max_context=32)
        s.prefill(TOKENS)
        ids = s.trace.expert_ids
    assert ids.tobytes() != plain[1]


def test_soft_routing_weighs_every_expert_by_the_rule(converted: dict) -> None:
    """Soft routing ignores the group limit and renormalises the sigmoids over every expert."""
    with Model.open(converted[("deepseek_v3-groups-qlora", "f32")]) as model:
        s = Session(model, routing="soft", max_context=32)
        s.prefill(TOKENS)
        tr = s.trace
        assert sorted(tr.expert_ids[0, 0].tolist()) == list(range(8))
        assert (tr.chosen_groups == -1).all()
        np.testing.assert_allclose(tr.expert_weights.sum(-1), model.routing(1).scale, rtol=1e-5)


def test_dump_trace_has_selection_scores_and_chosen_groups(converted: dict, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "trace.npz"
    assert main(["run", str(converted[("deepseek_v3-groups-qlora", "f32")]), "--tokens",
                 "1,3,4", "-n", "3", "--dump-trace", str(out)]) == 0
    with np.load(out) as trace:
        assert trace["selection_scores"].shape == (5, 2, 8)
        assert trace["chosen_groups"].shape == (5, 2, 1)
        assert trace["chosen_groups"].dtype == np.int32
        assert not np.array_equal(trace["selection_scores"], trace["router_logits"])


def test_info_states_each_layers_rule_in_words(converted: dict,
                                               capsys: pytest.CaptureFixture) -> None:
    assert main(["info", str(converted[("deepseek_v3-groups-qlora", "f32")])]) == 0
    out = capsys.readouterr().out
    assert "layer 0    dense MLP" in out
    assert ("layer 1    sigmoid over 8 experts, + correction bias for the choice only, top-2 within "
            "the 1 best of 2 groups (by the sum of their best two), divided by their sum + 1e-20, "
            "times 2.5; plus a shared expert") in out


def test_the_trace_flags_decisions_the_correction_bias_changed(converted: dict) -> None:
    """bias_changed is set exactly where the same rule on the sigmoids alone (groups by their
    top-2 sums, the best group kept, top-2 in it) chooses another set, and a BiasChanged
    breakpoint stops the debugger at the first such decision."""
    from colibri.debugging import BiasChanged, Debugger, RunSettings

    path = converted[("deepseek_v3-groups-qlora", "f32")]
    with Model.open(path) as model:
        s = Session(model, max_context=32)
        s.prefill(TOKENS)
        tr = s.trace
        sig = 1.0 / (1.0 + np.exp(-tr.router_logits.astype(np.float64)))
        groups = sig.reshape(*sig.shape[:2], 2, 4)
        best = np.argmax(np.sort(groups, -1)[..., -2:].sum(-1), -1)          # [P, M]
        in_best = np.take_along_axis(groups, best[..., None, None], axis=2)[:, :, 0]
        unbiased = np.sort(np.argsort(-in_best, -1)[..., :2] + 4 * best[..., None], -1)
        expected = (unbiased != np.sort(tr.expert_ids, -1)).any(-1)
        assert expected.any() and not expected.all()
        np.testing.assert_array_equal(tr.bias_changed, expected)
        first = int(np.flatnonzero(expected.reshape(-1))[0])

        dbg = Debugger(model, RunSettings(tuple(TOKENS), 0))
        result = dbg.run([BiasChanged()])
        assert result.reason == "breakpoint" and result.event.index == first
        assert result.event.bias_changed


def test_info_states_gpt_oss_experts_and_attention(converted: dict,
                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["info", str(converted[("gpt_oss-yarn-alternating-clamped", "f32")])]) == 0
    out = capsys.readouterr().out
    assert ("layer 0    top-2 of 4 logits (+ router bias), weighted by a softmax over the chosen; "
            "experts: clamped SwiGLU (alpha 1.702, limit 0.6) with biases; sliding-window "
            "attention; attention sinks") in out
    assert "layer 1    top-2 of 4 logits (+ router bias)" in out
    assert "layer 1    top-2 of 4 logits (+ router bias), weighted by a softmax over the chosen; " \
           "experts: clamped SwiGLU (alpha 1.702, limit 0.6) with biases; attention sinks" in out


def test_info_states_llama4_layers(converted: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["info", str(converted[("llama4-interleaved-nope-chunked-top1", "f32")])]) == 0
    out = capsys.readouterr().out
    assert "layer 0    dense MLP; chunked attention; q and k L2-normalised" in out
    assert ("layer 1    top-1 of 4 logits, weighted by their sigmoids; plus a shared expert; each "
            "chosen expert's input scaled by its weight; chunked attention; q and k "
            "L2-normalised") in out
    assert ("layer 3    top-1 of 4 logits, weighted by their sigmoids; plus a shared expert; each "
            "chosen expert's input scaled by its weight; no RoPE; queries at position p times "
            "log1p(floor((p + 1) / 4)) * 0.1 + 1") in out


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_jitter_lab_runs_on_the_family(converted: dict, name: str) -> None:
    """The lab's variants and epsilon sweep on a converted model: rewriting the weights at their
    own precision (w-f32 of an f32 file) keeps every layer's rule, attention and expert tensors,
    so it routes and computes exactly as the baseline; noise moves the router logits."""
    from colibri.jitter import Runner, analyze_epsilon, analyze_jitter

    with Runner.open(converted[(name, "f32")]) as runner:
        report = analyze_jitter(runner, TOKENS, "w-f32,noise4")
        n_moe = len(report.moe_layers)
        assert report.sets["w-f32"].shape == (len(TOKENS), n_moe, report.k)
        assert (report.sets["w-f32"] == report.sets["baseline"]).all()
        assert report.downstream["w-f32"].max_abs.max() == 0.0
        router = report.router_logits
        assert not np.array_equal(router["noise4"], router["baseline"])
        sweep = analyze_epsilon(runner, TOKENS, [0.0, 1e-6], "noise4")
        assert [row.eps for row in sweep.rows] == [0.0, 1e-6]
        assert (sweep.rows[0].sets == sweep.plain_sets).all()


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_debugger_runs_on_the_family(converted: dict, name: str) -> None:
    """A breakpoint on an expert stops where the trace of a plain run first chose it, and the
    anatomy of that decision is the rule's: the chosen experts rank first by selection score
    and their weights are the trace's."""
    from colibri.debugging import Debugger, ExpertChosen, RuleBook, RunSettings

    with Model.open(converted[(name, "f32")]) as model:
        plain = Session(model, max_context=32)
        plain.prefill(TOKENS)
        ids = plain.trace.expert_ids
        layer = int(plain.trace.moe_layers[-1])
        expert = int(ids[-1, -1, 0])
        first = int(np.flatnonzero((ids[:, -1, :] == expert).any(-1))[0])
        dbg = Debugger(model, RunSettings(tuple(TOKENS), 0))
        result = dbg.run([ExpertChosen(expert=expert, layer=layer)])
        assert result.reason == "breakpoint" and result.event.position == first
        a = RuleBook(model).of(result.event)
        chosen = np.flatnonzero(a.rank > 0)
        assert sorted(chosen.tolist()) == sorted(ids[first, -1].tolist())
        assert a.selection[chosen].min() >= np.delete(a.selection, chosen).max()
        np.testing.assert_array_equal(a.weight[ids[first, -1]],
                                      plain.trace.expert_weights[first, -1])


@pytest.mark.parametrize("name", ["granitemoe-bias-odd-tied", "granitemoeshared-shared"])
def test_granite_embedding_rows_are_scaled_as_transformers_scales_inputs_embeds(
        converted: dict, name: str) -> None:
    """Rows given to col_session_prefill_embeddings are multiplied by the file's
    embedding_scale, as GraniteMoeModel multiplies inputs_embeds by embedding_multiplier: the
    logits and router logits are transformers' with inputs_embeds= (rows of no token)."""
    model = hf_reference.build(VARIANTS[name])
    rows = np.random.default_rng(5).normal(0.0, 0.08, (len(TOKENS), model.config.hidden_size))
    rows = rows.astype(np.float32)
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(rows)[None], output_router_logits=True)
    want = out.logits[0].numpy()
    router = np.stack([r.reshape(len(TOKENS), -1).numpy() for r in out.router_logits], axis=1)
    with Model.open(converted[(name, "f32")]) as m:
        assert m.hparams.embedding_scale == model.config.embedding_multiplier != 1.0
        s = Session(m, max_context=32)
        got = s.prefill_embeddings(rows)
        scale = max(1.0, float(np.abs(want).max()))
        assert float(np.abs(got - want).max()) <= 1e-4 * scale
        np.testing.assert_allclose(s.trace.router_logits, router, atol=1e-3, rtol=0)


def test_latent_attention_with_heads_in_parts_matches_transformers_and_itself(
        tmp_path: Path) -> None:
    """Ten latent query heads: a decode step splits them into parts of 4, 4 and 2 (the heads the
    AVX-512 path attends together) and runs each part's key and value up-projections and heads as
    one pool item. The steps equal the prefill and each other for 1..3 threads, and match
    transformers."""
    base = VARIANTS["deepseek_v3-groups-qlora"]
    variant = hf_reference.Variant("deepseek_v3-ten-heads", base.family,
                                   dict(base.config, num_attention_heads=10, num_key_value_heads=10))
    hf = hf_reference.build(variant)
    reference = hf_reference.run(hf, TOKENS, 1)
    path = tmp_path / "ten-heads.colibri"
    convert(hf_reference.save(hf, tmp_path / "hf"), path, dtype="f32")
    with Model.open(path) as model:
        block = Session(model, threads=2, max_context=32).prefill(TOKENS)
        for threads in (1, 2, 3):
            s = Session(model, threads=threads, max_context=32)
            assert np.stack([s.step(t) for t in TOKENS]).tobytes() == block.tobytes(), threads
    scale = max(1.0, float(np.abs(reference.logits).max()))
    assert np.abs(block - reference.logits).max() <= 1e-4 * scale
