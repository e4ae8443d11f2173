"""Tensor rows from a real file: layer/kind parsing, filters, groupings, expert slices, CSV."""

from __future__ import annotations

import csv
import fnmatch

import numpy as np
import pytest

from colibri.engine import Model
from colibri.inspection.tensors import (RowLabels, TensorRow, export_csv, expert_slices,
                                        filter_rows, group_by_expert, group_by_layer,
                                        name_matcher, name_matches, rows_for, stable_order,
                                        tensor_kind)


def test_rows_follow_the_file_table(tiny_model_path):
    model = Model.open(tiny_model_path())
    rows = rows_for(model)
    assert [r.name for r in rows] == [t.name for t in model.tensors]
    assert [(r.offset, r.nbytes) for r in rows] == [(t.offset, t.nbytes) for t in model.tensors]


def test_layer_and_kind_parsed_from_the_name(tiny_model_path):
    rows = {r.name: r for r in rows_for(Model.open(tiny_model_path("qwen2_moe")))}
    assert (rows["token_embd"].layer, rows["token_embd"].kind) == (None, "embedding")
    assert (rows["layers.1.attn_q"].layer, rows["layers.1.attn_q"].kind) == (1, "attention")
    assert rows["layers.0.moe_gate"].kind == "router"
    assert rows["layers.0.shared_w2"].kind == "shared"
    assert rows["layers.0.ffn_norm"].kind == "norm"
    assert tensor_kind("layers.3.mlp_w1") == "mlp" and tensor_kind("output") == "output"


def test_stacked_expert_tensors_have_no_expert_and_a_count(tiny_model_path):
    rows = {r.name: r for r in rows_for(Model.open(tiny_model_path(n_experts=4)))}
    w1 = rows["layers.0.moe_w1"]
    assert (w1.expert, w1.n_experts, w1.kind) == (None, 4, "experts")
    assert rows["layers.0.attn_q"].n_experts == 0


def test_expert_slice_byte_range_holds_that_experts_values(tiny_model):
    tiny = tiny_model()
    rows = {r.name: r for r in rows_for(Model.open(tiny.path))}
    data = tiny.path.read_bytes()
    for sliced in expert_slices(rows["layers.1.moe_w2"]):
        raw = data[sliced.offset:sliced.offset + sliced.nbytes]
        values = np.frombuffer(raw, dtype="<f4").reshape(sliced.shape)
        np.testing.assert_array_equal(values, tiny.values["layers.1.moe_w2"][sliced.expert])


def test_filter_by_substring_glob_layer_and_dtype(tiny_model_path):
    rows = rows_for(Model.open(tiny_model_path(dtype="f16")))
    assert {r.name for r in filter_rows(rows, "moe_w1")} == {"layers.0.moe_w1", "layers.1.moe_w1"}
    assert {r.name for r in filter_rows(rows, "layers.*.attn_[qk]")} == {
        f"layers.{i}.attn_{x}" for i in (0, 1) for x in "qk"}
    assert all(r.layer == 1 for r in filter_rows(rows, layer=1))
    assert all(r.dtype == "f32" for r in filter_rows(rows, dtype="f32"))
    assert filter_rows(rows, dtype="f32") and filter_rows(rows, dtype="f16")


@pytest.mark.parametrize("pattern", ["*.t1*", "*WEIGHT", "model.*", "*t1?.weight", "*[12].w*",
                                     "*", "**t1*", "?odel*", "layers.1", "T1"])
def test_a_name_pattern_matches_as_fnmatch_does_ignoring_case(pattern):
    """Globs match as fnmatch does, substrings anywhere, both whatever the case (the matcher
    compiles them to searches, not fnmatch's calls)."""
    names = [f"model.layers.{i % 3}.t{i}.weight" for i in range(300)] + ["token_embd", "", "T1"]
    glob = any(ch in pattern for ch in "*?[")
    for name in names:
        expected = (fnmatch.fnmatchcase(name.lower(), pattern.lower()) if glob
                    else pattern.lower() in name.lower())
        assert name_matches(name, pattern) == expected, (name, pattern)


@pytest.mark.parametrize("pattern", ["*.t1*", "*WEIGHT", "model.*", "*t1?.weight", "T1", "*",
                                     "layers.1", "*ÄRGER*", "  t1 "])
@pytest.mark.parametrize("odd_name", ["MODEL.t1.bias", "model.Ärger.t1"])
def test_row_labels_match_as_the_name_matcher_does(pattern, odd_name):
    """A table's labels, read once (lower-cased where all are ASCII), keep the rows the name
    matcher keeps, in order, with and without a label outside ASCII."""
    names = [f"model.layers.{i % 3}.t{i}.weight" for i in range(300)] + ["token_embd", odd_name]
    rows = [TensorRow(name=n, index=i, layer=None, expert=None, kind="mlp", dtype="f32",
                      shape=(1,), offset=4 * i, nbytes=4, crc32=0) for i, n in enumerate(names)]
    matches = name_matcher(pattern)
    assert RowLabels(rows).matching(pattern) == [r for r in rows if matches(r.label)]


@pytest.mark.parametrize("reverse", [False, True])
def test_stable_order_orders_as_sorted_does(reverse):
    """Integer keys sorted by numpy and any keys sorted by Python give sorted()'s order, ties
    in their given order either way round."""
    ints = [(7 * i) % 13 for i in range(200)]
    assert stable_order(np.array(ints, dtype=np.int64), reverse) == sorted(
        range(len(ints)), key=ints.__getitem__, reverse=reverse)
    words = [f"w{k}" for k in ints]
    assert stable_order(words, reverse) == sorted(range(len(words)), key=words.__getitem__,
                                                  reverse=reverse)


def test_group_by_layer(tiny_model_path):
    groups = group_by_layer(rows_for(Model.open(tiny_model_path())))
    labels = [label for label, _ in groups]
    assert labels == ["global (before layers)", "layer 0", "layer 1", "global (after layers)"]
    assert all(r.layer == 1 for r in dict(groups)["layer 1"])


def test_group_by_expert_splits_stacked_tensors(tiny_model_path):
    model = Model.open(tiny_model_path(n_experts=4))
    groups = dict(group_by_expert(rows_for(model)))
    assert list(groups)[:4] == ["expert 0", "expert 1", "expert 2", "expert 3"]
    expert2 = groups["expert 2"]
    assert {r.label for r in expert2} == {f"layers.{i}.{m}[2]" for i in (0, 1)
                                          for m in ("moe_gate", "moe_w1", "moe_w2", "moe_w3")}
    w1 = model.tensor_info("layers.0.moe_w1")
    sliced = next(r for r in expert2 if r.name == "layers.0.moe_w1")
    assert sliced.offset == w1.offset + 2 * w1.nbytes // 4 and sliced.nbytes == w1.nbytes // 4
    assert "token_embd" in {r.name for r in groups["not per expert"]}


def test_export_csv_writes_every_row(tiny_model_path, tmp_path):
    rows = rows_for(Model.open(tiny_model_path()))
    path = tmp_path / "tensors.csv"
    export_csv(rows, path)
    with open(path, newline="") as handle:
        records = list(csv.DictReader(handle))
    assert [r["name"] for r in records] == [r.name for r in rows]
    assert records[0]["offset"] == str(rows[0].offset)
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed away
