"""A decision's anatomy: every expert's logit, score, bias, selection score, group, rank and
weight, as the engine computed them, on a DeepSeek-V3-style rule and on a plain softmax."""

from __future__ import annotations

import numpy as np
import pytest

from colibri.debugging import Debugger, RuleBook, RunSettings, anatomy
from colibri.engine import Model
from colibri.errors import ColibriValueError

from dbg_helpers import PROMPT


def _events(model: Model, n: int = 6):
    dbg = Debugger(model, RunSettings(PROMPT, n))
    dbg.run()
    return dbg.events


def test_sigmoid_rule_scores_bias_and_selection(v3_model: Model) -> None:
    """The scores are the sigmoids the weights are made of, the selection score is the score
    plus the file's correction bias (one float32 addition, as the router adds it), the kept
    group holds the chosen experts and the flag is the trace's."""
    rules = RuleBook(v3_model)
    events = _events(v3_model)
    seen_flag = False
    for e in events:
        a = rules.of(e)
        bias = v3_model.tensor(f"layers.{e.layer}.moe_correction_bias")
        np.testing.assert_array_equal(a.bias, bias)
        np.testing.assert_array_equal(a.selection, (a.scores + bias).astype(np.float32))
        np.testing.assert_allclose(a.scores, 1 / (1 + np.exp(-a.logits.astype(np.float64))),
                                   rtol=1e-6)
        ids = np.array(e.expert_ids)
        chosen = a.scores[ids]
        np.testing.assert_allclose(a.weight[ids], chosen / (chosen.sum() + 1e-20) * 2.5,
                                   rtol=1e-6)
        assert np.isnan(np.delete(a.weight, ids)).all()
        assert a.rank[ids].tolist() == [1, 2] and (np.delete(a.rank, ids) == 0).all()
        kept = e.chosen_groups[0]
        assert a.group.tolist() == [0] * 4 + [1] * 4
        assert a.group_kept.tolist() == [g == kept for g in a.group.tolist()]
        assert a.group_kept[ids].all()
        assert not a.selection_is_logit
        assert a.rule.startswith("sigmoid over 8 experts, + correction bias")
        assert a.bias_changed == e.bias_changed
        seen_flag |= a.bias_changed
    assert seen_flag, "no decision of the prompt was changed by the bias"


def test_softmax_rule_ranks_the_logits(moe3_path) -> None:
    with Model.open(moe3_path) as model:
        rules = RuleBook(model)
        for e in _events(model, 3):
            a = rules.of(e)
            assert a.bias is None and not a.has_groups and a.selection_is_logit
            z = np.exp(a.logits.astype(np.float64) - a.logits.max())
            np.testing.assert_allclose(a.scores, z / z.sum(), rtol=1e-6)
            assert not a.bias_changed


def test_without_the_model_only_the_trace_is_shown(v3_model: Model) -> None:
    e = _events(v3_model, 2)[0]
    a = anatomy(e)
    assert a.scores is None and a.bias is None and a.rule == ""
    np.testing.assert_array_equal(a.selection, e.selection_scores)
    assert (a.group == -1).all()


def test_scores_refuse_a_dense_layer_and_a_wrong_width(v3_model: Model) -> None:
    with pytest.raises(ColibriValueError, match="dense"):
        v3_model.routing(1).scores(np.zeros(8, np.float32))
    with pytest.raises(ColibriValueError, match=r"expected \[\.\.\., 8\]"):
        v3_model.routing(0).scores(np.zeros(7, np.float32))
