"""The reference diff (`colibri diff`, colibri.reference): Colibri against transformers layer by
layer, on the conformance models (tests/hf_reference.py).

  * every supported family agrees within the exact tolerance at every layer and position, with
    the same expert sets everywhere (one model per family: the first variant of each family in
    hf_reference.VARIANTS, so a family joins by adding its variants there);
  * a deliberately broken conversion is found at its layer: experts swapped in one layer, a norm
    scaled in another, the file edited after a clean conversion;
  * the CLI's text and JSON, and its errors for a checkpoint that is not the file's model.
The engine's hidden-state capture itself is tested in tests/test_api.py and test_capture.c.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf_reference = pytest.importorskip("hf_reference")

import colibri  # noqa: E402
from colibri.cli import main  # noqa: E402
from colibri.reference.diff import (EXACT, LOGITS_DIFFER, RULE_DIFFERS,  # noqa: E402
                                    SCORES_DIFFER, ReferenceDiff, ReferenceMismatch,
                                    default_tolerance, reference_diff)
from colibri.reference.transformers_run import ReferenceModelError  # noqa: E402
from colibri.values import Cancelled  # noqa: E402

from reference_models import Checkpoints, Converted, edit_tensor, swap_first_two  # noqa: E402

# One conformance model per family: the first of its variants.
FAMILY_MODELS = [v for i, v in enumerate(hf_reference.VARIANTS)
                 if v.family not in {w.family for w in hf_reference.VARIANTS[:i]}]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("reference-diff"))


def diff_of(c: Converted, path: Path | None = None, **kwargs) -> ReferenceDiff:
    with colibri.Model.open(path or c.path) as model:
        return reference_diff(model, c.hf_dir, c.tokens, **kwargs)


@pytest.mark.parametrize("variant", FAMILY_MODELS, ids=lambda v: v.family)
def test_every_family_agrees_with_transformers_layer_by_layer(variant, converted):
    diff = diff_of(converted(variant.name))
    assert diff.tolerance == EXACT
    assert diff.first_layer_over() is None, diff.layers()
    assert float(diff.hidden_rel.max()) < EXACT / 10
    assert diff.first_divergence() is None
    assert float(diff.router_abs.max(initial=0.0)) < 1e-4
    assert (diff.next_colibri == diff.next_reference).all()
    assert [r.kind for r in diff.layers()] == diff.layer_kinds
    assert diff.moe_layers.size and all(diff.layer_kinds[int(m)] == "moe" for m in diff.moe_layers)


def test_the_families_are_those_the_converter_reads():
    """Every family colibri.convert supports has a model in the parametrisation above (a family
    module may read several model types: Llama 4's text model stands for llama4_text and llama4)."""
    from colibri.families import FAMILIES

    assert ({FAMILIES[v.family].architecture for v in FAMILY_MODELS}
            == {f.architecture for f in FAMILIES.values()})


def test_swapped_experts_are_found_in_their_layer(converted, tmp_path):
    """Layer 2 of a DeepSeek-V3 model (its second MoE layer) with experts 0 and 1's down
    projections swapped: layers 0 and 1 agree, layer 2's hidden state is the first over
    tolerance, and its routing still agrees (the router reads the layer's input)."""
    c = converted("deepseek_v3-groups-qlora")
    broken = edit_tensor(c.path, tmp_path / "swapped.colibri", "layers.2.moe_w2",
                         swap_first_two)
    diff = diff_of(c, broken)
    rows = diff.layers()
    assert diff.first_layer_over() == 2
    assert max(r.hidden_rel for r in rows[:2]) < EXACT / 10
    assert rows[2].hidden_rel > 0.1
    assert rows[2].diverged == 0


def test_a_scaled_norm_is_found_in_its_layer(converted, tmp_path):
    """Layer 1's pre-attention norm of a Qwen2-MoE model scaled by 1.5: layer 0 agrees, layer 1
    is the first over tolerance, and the router logits of layer 1 differ already."""
    c = converted("qwen2_moe-shared-dense")
    broken = tmp_path / "norm.colibri"

    def scale(w):
        w *= 1.5
    edit_tensor(c.path, broken, "layers.1.attn_norm", scale)
    diff = diff_of(c, broken)
    assert diff.first_layer_over() == 1
    assert diff.layers()[0].hidden_rel < EXACT / 10
    # layer 1 is dense here (mlp_only_layers=[1]); the next MoE layer's router sees the error
    assert diff.layer_kinds[1] == "dense"
    assert diff.router_abs[list(diff.moe_layers).index(2)].max() > 1e-2


def test_a_wrong_router_shows_as_the_first_routing_divergence(converted, tmp_path):
    """Layer 1's router rows of experts 0 and 2 swapped: the hidden states before layer 1 agree,
    and the first divergence is at layer 1, where the router logits differ."""
    c = converted("mixtral-odd-tied-window")
    broken = tmp_path / "router.colibri"

    def swap(w):
        w[[0, 2]] = w[[2, 0]]
    edit_tensor(c.path, broken, "layers.1.moe_gate", swap)
    diff = diff_of(c, broken)
    first = diff.first_divergence()
    assert first is not None and first.layer == 1 and first.cause == LOGITS_DIFFER
    assert first.position == int(np.nonzero(diff.diverged[1])[0][0])
    assert set(first.colibri) != set(first.reference)
    assert diff.first_layer_over() == 1


def test_a_dropped_correction_bias_shows_as_selection_scores_that_differ(converted, tmp_path):
    """Layer 1's correction bias zeroed (a converter that lost it): the router logits agree,
    the selection scores do not, and the choices part there."""
    c = converted("deepseek_v3-groups-qlora")

    def zero(w):
        w[:] = 0
    broken = edit_tensor(c.path, tmp_path / "bias.colibri", "layers.1.moe_correction_bias", zero)
    diff = diff_of(c, broken)
    first = diff.first_divergence()
    assert first is not None and (first.layer, first.cause) == (1, SCORES_DIFFER)
    assert first.logit_difference < 1e-4 < first.score_difference
    assert float(diff.router_abs[0].max()) < 1e-4


def test_a_wrong_group_limit_shows_as_a_rule_that_differs(converted, tmp_path):
    """Layer 1's routing entry keeps 2 groups instead of 1: every score agrees, yet where the
    two best experts sit in different groups the choice differs."""
    from colibri import fileformat as ff

    c = converted("deepseek_v3-groups-qlora")
    image = bytearray(c.path.read_bytes())
    routing = int.from_bytes(image[0x18:0x20], "little")
    kept = routing + 1 * ff.ROUTING_ENTRY_SIZE + 0x28
    assert int.from_bytes(image[kept:kept + 4], "little") == 1
    image[kept:kept + 4] = (2).to_bytes(4, "little")
    ff.refresh_checksums(image)
    broken = tmp_path / "groups.colibri"
    broken.write_bytes(bytes(image))
    diff = diff_of(c, broken)
    first = diff.first_divergence()
    assert first is not None and (first.layer, first.cause) == (1, RULE_DIFFERS)
    assert first.score_difference < 1e-4 < first.reference_margin
    assert diff.layers()[0].hidden_rel < EXACT / 10


def test_a_router_that_returns_no_choice_is_read_by_its_rule(converted):
    """Llama 4's router returns (scores, logits), not the experts it chose (its MoE block scales
    each expert's input by the dense scores): the reader takes the top-k of the logits as the
    choice and the scores there, each chosen logit's sigmoid, as the weights, which are the
    engine's own. The second variant: top-2 over 5 experts, so the order within k counts too."""
    from colibri.reference import transformers_run

    c = converted("llama4-top2-llama3-rope-bias-tied")
    ref = transformers_run.run(transformers_run.load(c.hf_dir), c.tokens)
    logits = ref.router_logits.astype(np.float64)
    assert ref.expert_ids.shape == (len(c.tokens), 2, 2)
    np.testing.assert_array_equal(ref.expert_ids, np.argsort(-logits, -1, kind="stable")[..., :2])
    chosen = np.take_along_axis(logits, ref.expert_ids.astype(np.int64), -1)
    np.testing.assert_allclose(ref.expert_weights, 1 / (1 + np.exp(-chosen)), rtol=1e-6)
    with colibri.Model.open(c.path) as model:
        session = colibri.Session(model)
        session.prefill(c.tokens)
        ids, weights = session.trace.expert_ids, session.trace.expert_weights
    order = np.argsort(ids, -1)
    np.testing.assert_array_equal(np.take_along_axis(ids, order, -1), np.sort(ref.expert_ids, -1))
    np.testing.assert_allclose(np.take_along_axis(weights, order, -1),
                               np.take_along_axis(ref.expert_weights,
                                                  np.argsort(ref.expert_ids, -1), -1), atol=1e-5)


def test_a_bf16_checkpoint_converted_to_bf16_is_held_to_the_exact_tolerance(converted):
    """The file holds the checkpoint's own bf16 values: only summation order differs."""
    c = converted("olmoe-base", dtype="bf16", checkpoint="bf16")
    diff = diff_of(c)
    assert (diff.file_dtype, diff.checkpoint_dtype) == ("bf16", "bf16")
    assert diff.tolerance == EXACT
    assert diff.first_layer_over() is None and diff.first_divergence() is None


def test_rounded_weights_and_a_bf16_reference_get_their_tolerance(converted):
    c = converted("olmoe-base", dtype="bf16")
    diff = diff_of(c)
    assert (diff.file_dtype, diff.checkpoint_dtype) == ("bf16", "f32")
    assert diff.tolerance == default_tolerance("bf16", "f32", "f32") > EXACT
    assert diff.first_layer_over() is None
    ref_bf16 = diff_of(converted("olmoe-base"), dtype="bf16")
    assert ref_bf16.reference_dtype == "bf16" and ref_bf16.tolerance > EXACT
    assert float(ref_bf16.hidden_rel.max()) > EXACT     # bf16 arithmetic shows


def test_progress_names_each_step_and_cancel_stops_between_them(converted):
    c = converted("qwen3_moe-base")
    seen: list[tuple[int, int, str]] = []
    diff_of(c, progress=lambda done, total, text="": seen.append((done, total, text)))
    texts = [text for _, _, text in seen]
    total = seen[0][1]
    assert texts[:3] == ["running colibri", "loading the checkpoint in transformers",
                         "running transformers"]
    assert "transformers: layer 0" in texts and texts[-1] == "done"
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen) and seen[-1][0] == total
    calls = []

    def cancel_in_transformers() -> bool:
        calls.append(1)
        return len(calls) > 3      # after colibri, the load, and the start of the forward pass
    with pytest.raises(Cancelled):
        diff_of(c, cancelled=cancel_in_transformers)


def test_json_round_trip(converted):
    diff = diff_of(converted("glm4_moe-qknorm-bias-groups"))
    again = ReferenceDiff.from_dict(json.loads(diff.to_json()))
    assert again.to_dict() == diff.to_dict()
    assert again.summary() == diff.summary()
    with pytest.raises(ValueError, match="not a reference diff"):
        ReferenceDiff.from_dict({"schema": "colibri.jitter/1"})


def test_cli_prints_the_first_wrong_layer(converted, tmp_path, capsys):
    c = converted("deepseek_v3-groups-qlora")
    broken = edit_tensor(c.path, tmp_path / "swapped.colibri", "layers.2.moe_w2",
                         swap_first_two)
    tokens = ",".join(map(str, c.tokens))
    assert main(["diff", str(broken), str(c.hf_dir), "--tokens", tokens]) == 0
    out = capsys.readouterr().out
    assert "in transformers (DeepseekV3ForCausalLM, f32 weights, computed in f32)" in out
    assert "first layer over tolerance: layer 2 (moe)" in out
    lines = [line for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "2 "))]
    assert len(lines) == 3 and lines[2].endswith("<- first over tolerance")

    saved = tmp_path / "diff.json"
    assert main(["diff", str(broken), str(c.hf_dir), "--tokens", tokens, "--json",
                 str(saved)]) == 0
    assert "first layer over tolerance: layer 2" in capsys.readouterr().out
    assert ReferenceDiff.load(saved).first_layer_over() == 2
    assert main(["diff", str(c.path), str(c.hf_dir), "--tokens", tokens, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "colibri.reference-diff/1"
    assert data["summary"]["first_layer_over_tolerance"] is None
    assert data["summary"]["first_divergence"] is None


def test_cli_refuses_a_checkpoint_of_another_model(converted, capsys):
    c = converted("mixtral-base")
    other = converted("mixtral-odd-tied-window")
    tokens = ",".join(map(str, c.tokens[:4]))
    assert main(["diff", str(c.path), str(other.hf_dir), "--tokens", tokens]) == 1
    err = capsys.readouterr().err
    assert "colibri:" in err and str(other.hf_dir) in err and "layers" in err
    assert main(["diff", str(c.path), str(c.path), "--tokens", tokens]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert main(["diff", str(c.path), str(c.hf_dir), "--tokens", tokens,
                 "--tolerance", "0"]) == 1
    assert "--tolerance must be > 0" in capsys.readouterr().err


def test_errors_name_what_does_not_match(converted, tmp_path):
    c = converted("mixtral-base")
    with colibri.Model.open(c.path) as model:
        with pytest.raises(ReferenceMismatch, match="layers"):
            reference_diff(model, converted("qwen2_moe-shared-dense").hf_dir, c.tokens[:3])
        (tmp_path / "empty").mkdir()
        with pytest.raises(ReferenceModelError, match="no config.json"):
            reference_diff(model, tmp_path / "empty", c.tokens[:3])
        with pytest.raises(ValueError, match="empty"):
            reference_diff(model, c.hf_dir, [])


def test_readme_example(tmp_path, monkeypatch, capsys):
    """README's diff of the tiny DeepSeek-V3 (made by the README's own script) is what the tool
    prints, up to the noise-level numbers (below 1e-4), which differ between kernel paths."""
    import re
    import runpy

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", readme, re.S)
    make = next(b for lang, b in blocks if lang == "python" and "DeepseekV3ForCausalLM(cfg)" in b)
    start = readme.index("Against the reference: `colibri diff FILE HF_DIR`")
    (_, breaker), (_, session) = re.findall(r"```(\w+)\n(.*?)```", readme[start:], re.S)[:2]
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(_write(tmp_path / "make_tiny_v3.py", make)))
    assert main(["convert", "tiny-v3", "tiny-v3.colibri"]) == 0
    runpy.run_path(str(_write(tmp_path / "break_bias.py", breaker)))
    capsys.readouterr()

    def masked(text: str) -> str:
        text = re.sub(r"\d(\.\d{1,2})?e-(0[5-9]|[1-9]\d)", "~", text)  # %.3g drops trailing zeros (1.1e-06)
        return re.sub(r"\b(avx512|avx2|amx|portable) kernels", "K kernels", text)

    commands = re.split(r"^\$ ", session, flags=re.M)[1:]
    for command in commands:
        line, _, shown = command.partition("\n")
        if not line.startswith("colibri diff "):
            continue
        assert main(line[len("colibri "):].split()) == 0
        printed = masked(capsys.readouterr().out).splitlines()
        expected = [masked(s) for s in shown.splitlines() if s and s != "..."]
        assert expected and all(s in printed for s in expected), (expected, printed)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
