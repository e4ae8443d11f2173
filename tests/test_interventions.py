"""Interventions in the engine, against expectations computed here by hand: on the demo model
(Mixtral's rule: softmax over 8 experts, top-2, renormalised) from the router logits the trace
records, and on a DeepSeek-V3 conformance model against transformers with the same edit made to
its routers' outputs. Rewinding (the KV cache before a position reused) and stepping one layer at
a time give the bits of a fresh run."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.errors import ColibriValueError
from colibri.interventions import KINDS, Intervention, InterventionError, changed_from

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
PROMPT_TEXT = "def read_header(self, data):"
P = 4                      # the position the single-decision tests edit
LAYER = 1                  # ... and the MoE layer (the demo's layers are all MoE: index = layer)


def bit(kind: str) -> int:
    return 1 << KINDS.index(kind)


@pytest.fixture(scope="module")
def demo() -> Model:
    with Model.open(DEMO) as m:
        yield m


@pytest.fixture(scope="module")
def prompt(demo: Model) -> list[int]:
    return list(demo.tokenizer.encode(PROMPT_TEXT).ids)


def run(model: Model, tokens: list[int], *specs: str, threads: int = 1) -> tuple[np.ndarray, object]:
    """(logits [positions, vocab], trace copy) of a prefill under the interventions."""
    with Session(model, threads=threads) as s:
        s.set_interventions([Intervention.parse(x) for x in specs])
        logits = s.prefill(tokens)
        return logits, s.trace.copy()


@pytest.fixture(scope="module")
def base(demo: Model, prompt: list[int]) -> tuple[np.ndarray, object]:
    return run(demo, prompt)


def softmax64(x: np.ndarray) -> np.ndarray:
    z = np.exp(x.astype(np.float64) - x.max())
    return z / z.sum()


def rule_weights(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """Mixtral's weights of a chosen set: the softmax over every expert, renormalised over it."""
    p = softmax64(logits)[ids]
    return p / p.sum()


def top2(values: np.ndarray, forbidden: tuple[int, ...] = ()) -> list[int]:
    """The two largest, excluding the forbidden; the lower index on ties."""
    order = [int(i) for i in np.argsort(-values.astype(np.float64), kind="stable")]
    return [i for i in order if i not in forbidden][:2]


def same_before(a: object, b: object, position: int) -> bool:
    return all(np.array_equal(getattr(a, f)[:position], getattr(b, f)[:position])
               for f in ("expert_ids", "expert_weights", "router_logits"))


# ---------------------------------------------------------------------------------------------
# each kind on the demo model


def test_force_is_the_choice_weighted_by_the_rule(demo, prompt, base) -> None:
    logits, trace = run(demo, prompt, f"force:pos={P},layer={LAYER},experts=5+7")
    assert list(trace.expert_ids[P, LAYER]) == [5, 7]
    decision_logits = trace.router_logits[P, LAYER]
    assert np.array_equal(decision_logits, base[1].router_logits[P, LAYER])  # upstream unchanged
    np.testing.assert_allclose(trace.expert_weights[P, LAYER], rule_weights(decision_logits, [5, 7]),
                               rtol=1e-6)
    assert trace.intervened[P, LAYER] == bit("force")
    assert int(np.count_nonzero(trace.intervened)) == 1
    assert same_before(trace, base[1], P)
    assert np.array_equal(trace.expert_ids[P, :LAYER], base[1].expert_ids[P, :LAYER])
    assert np.array_equal(logits[:P], base[0][:P]) and not np.array_equal(logits[P], base[0][P])


def test_forbid_makes_the_rule_choose_among_the_rest(demo, prompt, base) -> None:
    first = int(base[1].expert_ids[P, LAYER, 0])
    _, trace = run(demo, prompt, f"forbid:pos={P},layer={LAYER},experts={first}")
    decision_logits = trace.router_logits[P, LAYER]
    expected = top2(decision_logits, (first,))
    assert list(trace.expert_ids[P, LAYER]) == expected and first not in expected
    np.testing.assert_allclose(trace.expert_weights[P, LAYER], rule_weights(decision_logits, expected),
                               rtol=1e-6)
    assert trace.intervened[P, LAYER] == bit("forbid")


def test_ablate_removes_an_expert_from_a_layer_at_every_position(demo, prompt, base) -> None:
    layer, expert = 2, 0
    assert (base[1].expert_ids[:, layer] == expert).any()   # the demo's layer 2 uses it
    _, trace = run(demo, prompt, f"ablate:layer={layer},expert={expert}")
    assert not (trace.expert_ids[:, layer] == expert).any()
    for p in range(trace.n_positions):
        assert list(trace.expert_ids[p, layer]) == top2(trace.router_logits[p, layer], (expert,))
    assert (trace.intervened[:, layer] == bit("ablate")).all()
    assert not trace.intervened[:, :layer].any() and not trace.intervened[:, layer + 1:].any()
    # layers before it are untouched at the first position (nothing upstream changed yet)
    assert np.array_equal(trace.expert_ids[0, :layer], base[1].expert_ids[0, :layer])


def test_weights_replace_the_combine_weights(demo, prompt, base) -> None:
    logits, trace = run(demo, prompt, f"weights:pos={P},layer={LAYER},values=0.9+0.1")
    assert np.array_equal(trace.expert_ids[P, LAYER], base[1].expert_ids[P, LAYER])
    assert np.array_equal(trace.expert_weights[P, LAYER], np.float32([0.9, 0.1]))
    assert not np.array_equal(logits[P], base[0][P])
    # the rule's own weights, given back as an edit, change no bit anywhere
    own = "+".join(repr(float(w)) for w in base[1].expert_weights[P, LAYER])
    same, trace = run(demo, prompt, f"weights:pos={P},layer={LAYER},values={own}")
    assert same.tobytes() == base[0].tobytes()
    assert trace.intervened[P, LAYER] == bit("weights")


@pytest.mark.parametrize("op", ["add", "set"])
def test_logits_edit_what_the_rule_reads(demo, prompt, base, op) -> None:
    before = base[1].router_logits[P, LAYER]
    loser = int(next(e for e in np.argsort(before) if e not in base[1].expert_ids[P, LAYER]))
    value = 4.0
    _, trace = run(demo, prompt, f"logits:pos={P},layer={LAYER},expert={loser},{op}={value}")
    edited = before.copy()
    edited[loser] = np.float32(before[loser] + np.float32(value)) if op == "add" else np.float32(value)
    assert np.array_equal(trace.router_logits[P, LAYER], edited)   # the trace keeps the edit
    assert list(trace.expert_ids[P, LAYER]) == top2(edited)
    assert int(loser) in trace.expert_ids[P, LAYER]
    np.testing.assert_allclose(trace.expert_weights[P, LAYER], rule_weights(edited, top2(edited)),
                               rtol=1e-6)
    assert trace.intervened[P, LAYER] == bit("logits")


def test_bias_on_a_rule_without_one_ranks_softmax_plus_bias(demo, prompt, base) -> None:
    logits = base[1].router_logits[P, LAYER]
    probs = softmax64(logits)
    second = int(base[1].expert_ids[P, LAYER, 1])
    third = next(int(e) for e in np.argsort(-logits) if e not in base[1].expert_ids[P, LAYER])
    lift = float(probs[second] - probs[third]) + 0.05   # enough to put the third above the second
    _, trace = run(demo, prompt, f"bias:pos={P},layer={LAYER},expert={third},add={lift}")
    bias = np.zeros(8, np.float32)
    bias[third] = lift
    np.testing.assert_allclose(trace.selection_scores[P, LAYER], probs + bias, rtol=1e-6, atol=1e-7)
    expected = top2(probs + bias)
    assert third in expected and list(trace.expert_ids[P, LAYER]) == expected
    # the bias decides the choice only: the weights are the rule's from the probabilities
    np.testing.assert_allclose(trace.expert_weights[P, LAYER], rule_weights(logits, expected),
                               rtol=1e-6)
    assert trace.bias_changed[P, LAYER]          # ranked without it, the set differs
    assert trace.intervened[P, LAYER] == bit("bias")


def swapped_copy(source: Path, target: Path, layer: int, a: int, b: int) -> Path:
    """A copy of a .colibri file whose experts a and b of `layer` exchanged their weights (the
    data CRCs go stale; opening checks structure only)."""
    shutil.copyfile(source, target)
    with Model.open(source) as m:
        infos = [t for t in m.tensors if t.name in {f"layers.{layer}.moe_w{i}" for i in (1, 2, 3)}]
    data = bytearray(target.read_bytes())
    for t in infos:
        stride = t.nbytes // t.shape[0]
        ra = slice(t.offset + a * stride, t.offset + (a + 1) * stride)
        rb = slice(t.offset + b * stride, t.offset + (b + 1) * stride)
        data[ra], data[rb] = data[rb], data[ra]
    target.write_bytes(bytes(data))
    return target


def test_swap_equals_a_file_with_the_two_experts_exchanged(demo, prompt, tmp_path) -> None:
    layer, a, b = 1, 1, 6
    logits, trace = run(demo, prompt, f"swap:layer={layer},experts={a}+{b}", threads=2)
    with Model.open(swapped_copy(DEMO, tmp_path / "swapped.colibri", layer, a, b)) as m:
        file_logits, file_trace = run(m, prompt)
    assert logits.tobytes() == file_logits.tobytes()
    assert trace.expert_ids.tobytes() == file_trace.expert_ids.tobytes()
    chose = np.isin(trace.expert_ids[:, layer], [a, b]).any(axis=1)
    assert chose.any()
    assert np.array_equal(trace.intervened[:, layer] == bit("swap"), chose)


# ---------------------------------------------------------------------------------------------
# rewinding and stepping by layers


@pytest.mark.parametrize("threads", [1, 3])
def test_a_rerun_from_the_first_intervened_position_equals_a_fresh_run(demo, prompt, threads) -> None:
    edits = [Intervention.parse("forbid:pos=5-,layer=2,experts=0"),
             Intervention.parse(f"force:pos={P + 2},layer=0,experts=3+4")]
    with Session(demo, threads=threads) as s:
        s.prefill(prompt)
        s.truncate(5)
        s.set_interventions(edits)
        tail = s.prefill(prompt[5:])
        rewound = s.trace.copy()
    fresh_logits, fresh = run(demo, prompt, *(e.spec for e in edits))
    assert tail.tobytes() == fresh_logits[5:].tobytes()
    for name in ("expert_ids", "expert_weights", "router_logits", "selection_scores", "intervened"):
        assert getattr(rewound, name).tobytes() == getattr(fresh, name).tobytes(), name


@pytest.mark.parametrize("threads", [1, 2])
def test_stepping_layers_gives_the_bits_of_a_step(demo, prompt, base, threads) -> None:
    with Session(demo, threads=threads) as s:
        s.prefill(prompt[:-1])
        assert s.layers_done is None
        s.begin_token(prompt[-1])
        assert s.layers_done == 0
        seen = []
        for layer in range(demo.hparams.n_layers):
            out = s.step_layer()
            if layer < demo.hparams.n_layers - 1:
                assert out is None and s.layers_done == layer + 1
                pending = s.pending_trace()
                assert pending.n_positions == len(prompt)
                seen.append(np.array(pending.expert_ids[-1, layer]))
                # while a position is in progress, whole-position calls refuse
                with pytest.raises(ColibriValueError, match="in progress"):
                    s.step(1)
        assert s.layers_done is None and s.position == len(prompt)
        assert out.tobytes() == base[0][-1].tobytes()
        assert s.trace.expert_ids.tobytes() == base[1].expert_ids.tobytes()
        assert [list(x) for x in seen] == [list(x) for x in base[1].expert_ids[-1, :3]]


def test_running_a_layer_again_under_a_new_intervention(demo, prompt) -> None:
    spec = f"force:pos={P},layer={LAYER},experts=2+6"
    with Session(demo) as s:
        s.prefill(prompt[:P])
        s.begin_token(prompt[P])
        s.step_layer()
        s.step_layer()                       # layers 0 and 1 of position P have run
        before = list(s.pending_trace().expert_ids[P, LAYER])
        s.set_interventions([Intervention.parse(spec)])
        s.rewind_layer()
        assert s.layers_done == LAYER
        with pytest.raises(ColibriValueError, match="run again"):
            s.rewind_layer()                 # one level of undo
        s.step_layer()
        assert list(s.pending_trace().expert_ids[P, LAYER]) == [2, 6] != before
        while s.layers_done is not None:
            s.step_layer()
        tail = s.prefill(prompt[P + 1:])
        trace = s.trace.copy()
    fresh_logits, fresh = run(demo, prompt, spec)
    assert tail.tobytes() == fresh_logits[P + 1:].tobytes()
    assert trace.expert_ids.tobytes() == fresh.expert_ids.tobytes()


def test_truncate_abandons_a_position_in_progress(demo, prompt) -> None:
    with Session(demo) as s:
        s.prefill(prompt[:3])
        s.begin_token(prompt[3])
        s.step_layer()
        with pytest.raises(ColibriValueError, match="beyond"):
            s.truncate(4)
        s.truncate(3)
        assert s.layers_done is None and s.position == 3
        with pytest.raises(ColibriValueError, match="no position in progress"):
            s.step_layer()
        s.prefill(prompt[3:])                 # whole positions again


# ---------------------------------------------------------------------------------------------
# what is refused, and how it is named


@pytest.mark.parametrize("spec,message", [
    ("force:pos=3,layer=1,experts=1+9", "experts: expert 9 outside 0..7"),
    ("force:pos=3,layer=1,experts=1+2+3", "experts: 3 given, force takes 1..2"),
    ("force:pos=3,layer=9,experts=1", "layer: 9 outside 0..3"),
    ("forbid:pos=3,layer=1,experts=2+2", "experts: expert 2 given twice"),
    ("swap:layer=1,experts=2", "experts: 1 given, swap takes 2..2"),
    ("weights:pos=1,values=0.5+0.25+0.25", "values: 3 given, weights takes 1..2"),
    ("logits:pos=1,expert=2,set=inf", "values: value 0 is not finite"),
    ("forbid:pos=7-3,experts=1", "pos: first position 7 after last 3"),
])
def test_the_engine_names_the_bad_field(demo, spec, message) -> None:
    with Session(demo) as s:
        s.set_interventions([Intervention.parse("ablate:expert=1")])
        with pytest.raises(ColibriValueError) as info:
            s.set_interventions([Intervention.parse("ablate:expert=0"), Intervention.parse(spec)])
        assert f"intervention {spec!r}: {message}" in str(info.value)
        assert s.interventions == (Intervention.parse("ablate:expert=1"),)   # nothing changed


def test_a_dense_layer_and_a_bias_on_a_logit_rule_are_refused(tiny_model_path) -> None:
    path = tiny_model_path("qwen2_moe", n_layers=3, n_experts=8, top_k=2, dense_layers=(1,))
    with Model.open(path) as m, Session(m) as s:
        with pytest.raises(ColibriValueError, match="layer: layer 1 is dense"):
            s.set_interventions([Intervention.parse("forbid:layer=1,experts=0")])


@pytest.mark.parametrize("spec,message", [
    ("push:pos=1", "kind: 'push' is not one of force"),
    ("force", "kind: force needs its fields"),
    ("force:pos=1,layer=2", "experts: missing"),
    ("force:pos=x,experts=1", "pos: 'x' is not N, A-B or A-"),
    ("forbid:layer=-1,experts=1", "layer: '-1' is not a layer index"),
    ("logits:pos=1,expert=2", "add/set: logits takes exactly one of add=X or set=X"),
    ("logits:pos=1,expert=2,add=1,set=2", "add/set"),
    ("weights:pos=1,values=0.5+x", "values: 'x' is not a number"),
    ("ablate:pos=3,expert=1", "pos: ablate removes an expert at every position"),
    ("swap:layer=1,experts=1+2,pos=3,pos=4", "pos: given twice"),
    ("force:pos=1,experts=1,color=red", "color: force takes experts, layer, pos"),
])
def test_the_grammar_names_the_bad_field(spec, message) -> None:
    with pytest.raises(InterventionError) as info:
        Intervention.parse(spec)
    assert f"intervention {spec!r}: {message}" in str(info.value)


@pytest.mark.parametrize("spec", ["force:pos=5,layer=2,experts=1+4", "ablate:experts=3",
                                  "ablate:layer=1,experts=3", "bias:layer=0,experts=2,add=0.5",
                                  "forbid:pos=5-,experts=2", "forbid:pos=5-9,layer=0,experts=2+3",
                                  "logits:pos=0,experts=1,set=-2.5",
                                  "weights:pos=3,layer=1,values=0.75+0.25",
                                  "swap:layer=1,experts=2+5"])
def test_specs_round_trip(spec) -> None:
    parsed = Intervention.parse(spec)
    assert parsed.spec == spec and Intervention.parse(parsed.spec) == parsed
    assert Intervention.parse(spec.replace("experts=", "expert=")) == parsed


def test_the_first_position_a_change_can_affect() -> None:
    a, b, c = (Intervention.parse(x) for x in ("forbid:pos=9,experts=1", "ablate:layer=1,experts=2",
                                               "force:pos=4-6,experts=3"))
    assert changed_from([a], [a]) is None
    assert changed_from([a], [a, c]) == 4
    assert changed_from([a, c], [c]) == 9
    assert changed_from([], [b]) == 0
    assert changed_from([a, c], [c, a]) == 4      # the order matters where two meet


# ---------------------------------------------------------------------------------------------
# a conformance model: the same edit made in transformers


def test_deepseek_v3_interventions_match_the_same_edit_in_transformers(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    hf_reference = pytest.importorskip("hf_reference")
    from colibri.convert import convert

    variant = next(v for v in hf_reference.VARIANTS if v.name == "deepseek_v3-groups-qlora")
    model = hf_reference.build(variant)
    out = tmp_path / "v3.colibri"
    convert(hf_reference.save(model, tmp_path / "hf"), out, dtype="f32")
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, variant.config["vocab_size"], 12)]
    routers = [m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]
    cfg = variant.config
    k, n_group, keep = cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]
    scale, n_experts = cfg["routed_scaling_factor"], cfg["n_routed_experts"]

    def route(router, logits, forbidden=(), forced=None):
        """DeepSeek-V3's rule by hand for one row, with forbidden experts left out of the choice
        (and out of their group's score) or a forced choice."""
        scores = torch.sigmoid(logits)
        choice = scores + router.e_score_correction_bias
        choice[list(forbidden)] = float("-inf")
        if forced is None:
            groups = choice.view(n_group, -1).topk(2, dim=-1)[0].sum(-1)
            kept = torch.zeros(n_group, dtype=torch.bool)
            kept[groups.topk(keep)[1]] = True
            masked = choice.masked_fill(~kept.repeat_interleave(n_experts // n_group), float("-inf"))
            forced = masked.topk(k)[1].tolist()
        ids = torch.tensor(forced)
        w = scores[ids]
        return ids, w / (w.sum() + 1e-20) * scale

    def edit(layer_index, position, **how):
        def hook(module, inputs, output):
            logits, weights, ids = output
            weights, ids = weights.clone(), ids.clone()
            ids[position], weights[position] = route(module, logits[position], **how)
            return logits, weights, ids
        return routers[layer_index].register_forward_hook(hook)

    with torch.no_grad():
        plain = model(torch.tensor([tokens])).logits[0].numpy()
    with Model.open(out) as m:
        assert [r.layer for r in map(m.routing, range(3)) if r.kind == "moe"] == [1, 2]
        with Session(m) as s:
            s.prefill(tokens)
            first = int(s.trace.expert_ids[3, 1, 0])   # layer 2's first choice at position 3
        cases = [
            ("force:pos=5,layer=1,experts=6+1", [(0, 5, {"forced": [6, 1]})]),
            (f"forbid:pos=3,layer=2,experts={first}", [(1, 3, {"forbidden": (first,)})]),
        ]
        for spec, edits in cases:
            logits, trace = run(m, tokens, spec)
            hooks = [edit(li, pos, **how) for li, pos, how in edits]
            try:
                with torch.no_grad():
                    expected = model(torch.tensor([tokens])).logits[0].numpy()
            finally:
                for h in hooks:
                    h.remove()
            scale_ = max(1.0, float(np.abs(expected).max()))
            assert np.abs(logits - expected).max() <= 1e-4 * scale_, spec
            assert np.abs(logits - plain).max() > 100 * 1e-4 * scale_, spec  # the edit matters
        # the two experts' weights exchanged in transformers, a swap in the engine
        other = (first + n_experts // 2) % n_experts           # an expert of the other group
        logits, _ = run(m, tokens, f"swap:layer=2,experts={first}+{other}")
        experts = model.model.layers[2].mlp.experts
        with torch.no_grad():
            for p in (experts.gate_up_proj, experts.down_proj):
                p[[first, other]] = p[[other, first]].clone()
            expected = model(torch.tensor([tokens])).logits[0].numpy()
        assert np.abs(logits - expected).max() <= 1e-4 * max(1.0, float(np.abs(expected).max()))
        assert np.abs(logits - plain).max() > 1e-2
