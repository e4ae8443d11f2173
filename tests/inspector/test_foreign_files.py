"""GGUF files and safetensors checkpoints in the Inspector, on real files: llama.cpp's GGUF
fixtures, checkpoints saved by transformers (per-expert and fused), the damaged-file corpus.

The Qt-free document first (expert layouts found from the names, values and expert statistics
equal to the `gguf` package's dequantisation and to the torch model's parameters, the metadata
tree's offsets pointing at the bytes they describe, a 151 936-token vocabulary walked only as
far as it is shown), then the tab: each format, a sharded checkpoint through its directory and
its index, a broken file, the data checks, drag and drop, Open Recent and "Run in the
debugger"."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

import gguf
from gguf.quants import dequantize

from colibri.inspection import stats as S
from colibri.inspection.foreign import ForeignDocument, expert_layers, is_foreign
from colibri.inspection.foreign_tree import FETCH, metadata_tree
from colibri.inspector.foreign_view import QtForeignFileView
from colibri.inspector.main_window import MainWindow
from colibri.inspector.tensor_table import FETCH_ROWS

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus" / "formats"
FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
GGUF = FIXTURES / "qwen2_moe-q4_0.gguf"
TIMEOUT_MS = 30000


pytestmark = pytest.mark.usefixtures("inspector_settings")


@pytest.fixture
def window(window: MainWindow) -> Iterator[MainWindow]:
    """tests/conftest.py's window, its views' workers stopped first."""
    yield window
    for view in window.views():
        view.shutdown()


def _open(window: MainWindow, qtbot, path: Path) -> QtForeignFileView:
    """Open `path` and wait until the tab shows it (the headers are read on a worker)."""
    view = window.open_path(path)
    assert isinstance(view, QtForeignFileView)
    if not view.is_open():
        with qtbot.waitSignal(view.sig_opened, timeout=TIMEOUT_MS):
            pass
    return view


def _gguf_values(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file dequantised by the `gguf` package's own reader."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """Checkpoints saved by transformers 5.23: Qwen2-MoE (layer 1 dense) per expert, the same
    fused (`save_original_format=False`), and Mixtral per expert sharded with an index; each
    with the torch model's parameters."""
    sys.path.insert(0, str(ROOT / "tests"))
    import hf_reference as H

    variants = {v.name: v for v in H.VARIANTS}
    out = {}
    root = tmp_path_factory.mktemp("hf-checkpoints")
    for key, name, kwargs in (("per_expert", "qwen2_moe-shared-dense", {}),
                              ("fused", "qwen2_moe-shared-dense", {"save_original_format": False}),
                              ("sharded", "mixtral-base", {"max_shard_size": "100KB"})):
        model = H.build(variants[name])
        model.save_pretrained(root / key, **kwargs)
        params = {k: v.detach().numpy().astype(np.float64) for k, v in model.state_dict().items()}
        out[key] = (root / key, params)
    return out


# -- the document ---------------------------------------------------------------------------------


def test_document_of_a_llama_cpp_gguf() -> None:
    doc = ForeignDocument(GGUF)
    assert doc.format == "gguf" and doc.status == "valid" and doc.plain_explanation() == ""
    rows = {r.name: r for r in doc.tensor_rows()}
    gate = rows["blk.0.ffn_gate_exps.weight"]
    assert (gate.dtype, gate.layer, gate.kind, gate.n_experts) == ("Q4_0", 0, "experts", 4)
    assert (rows["blk.0.ffn_gate_inp.weight"].kind, rows["blk.0.ffn_gate_inp.weight"].n_experts) \
        == ("router", 4)
    assert rows["blk.0.ffn_gate_shexp.weight"].kind == "shared"
    assert {"header", "metadata", "tensor_table", "tensor"} <= {r.kind for r in doc.regions()}
    layers = doc.layers
    assert [(x.layer, x.router, x.n_experts) for x in layers] == [
        (0, "blk.0.ffn_gate_inp.weight", 4), (1, "blk.1.ffn_gate_inp.weight", 4)]
    assert layers[1].parts["moe_w2"][3] == S.ExpertPart("blk.1.ffn_down_exps.weight", 3)


@pytest.mark.parametrize("kind", ["q4_0", "q8_0", "bf16"])
def test_gguf_values_equal_the_gguf_package(kind) -> None:
    """Statistics, histogram and heatmap of GGUF tensors (an expert's slice of a stacked Q4_0 or
    Q8_0 matrix, a BF16 one) are those of the values the `gguf` package dequantises."""
    path = FIXTURES / f"olmoe-{kind}.gguf"
    store = ForeignDocument(path).store()
    ref = _gguf_values(path)["blk.1.ffn_up_exps.weight"][2]          # [I, H]
    a = S.analyse_tensor(store, "blk.1.ffn_up_exps.weight", expert=2, max_cells=8)
    assert a.dtype == kind.upper() and a.shape == ref.shape
    assert a.stats.count == ref.size and (a.stats.min, a.stats.max) == (ref.min(), ref.max())
    assert a.stats.mean == pytest.approx(ref.mean(), rel=1e-9, abs=1e-12)
    assert a.stats.std == pytest.approx(ref.std(), rel=1e-9)
    counts, _edges = np.histogram(ref, bins=100, range=(ref.min(), ref.max()))
    np.testing.assert_array_equal(a.histogram.counts, counts)
    br, bc = a.heatmap.block_rows, a.heatmap.block_cols
    np.testing.assert_allclose(a.heatmap.cells[1, 2], np.abs(ref[br:2 * br, 2 * bc:3 * bc]).mean(),
                               rtol=1e-6)


def test_a_k_quant_tensor_is_dequantised_chunk_by_chunk(tmp_path, monkeypatch) -> None:
    """A Q4_K expert stack (written with the `gguf` package, random blocks with small scales),
    read in chunks of a few rows, gives the statistics of the package's whole dequantisation."""
    rng = np.random.default_rng(0)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K]
    raw = rng.integers(0, 256, size=(3, 8, 512 // block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)   # d
    blocks[:, 2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)  # dmin
    path = tmp_path / "q4k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.ffn_gate_exps.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ref = dequantize(raw, gguf.GGMLQuantizationType.Q4_K).astype(np.float64)[1]   # [8, 512]
    monkeypatch.setattr(S, "CHUNK_ELEMENTS", 1024)   # two rows a chunk
    a = S.analyse_tensor(ForeignDocument(path).store(), "blk.0.ffn_gate_exps.weight", expert=1)
    assert a.dtype == "Q4_K" and a.heatmap.shape == (8, 512)
    assert (a.stats.min, a.stats.max) == (ref.min(), ref.max())
    assert a.stats.std == pytest.approx(ref.std(), rel=1e-9)
    np.testing.assert_allclose(a.heatmap.cells[3, 0], np.abs(ref[3, 0]), rtol=1e-6)


def test_the_expert_comparison_of_a_gguf_layer_equals_numpy() -> None:
    path = FIXTURES / "mixtral-q8_0.gguf"
    ref = _gguf_values(path)
    c = S.compare_experts(ForeignDocument(path).store(), 1)
    assert c.n_experts == 4
    for matrix, tensor in (("moe_w1", "ffn_gate_exps"), ("moe_w2", "ffn_down_exps"),
                           ("moe_w3", "ffn_up_exps")):
        want = np.linalg.norm(ref[f"blk.1.{tensor}.weight"].reshape(4, -1), axis=1)
        np.testing.assert_allclose(c.column(matrix, "norm"), want, rtol=1e-9)
    np.testing.assert_array_equal(c.router_rows, ref["blk.1.ffn_gate_inp.weight"])


@pytest.mark.parametrize("layout", ["per_expert", "fused"])
def test_hugging_face_expert_layouts_compare_as_the_model_holds_them(checkpoints, layout):
    """Per-expert (`experts.{e}.gate_proj`) and fused (`experts.gate_up_proj` [E, 2I, H])
    checkpoints: the router and each expert's gate, down and up matrices are found, and their
    statistics are those of the torch model's parameters (fused in memory: gate rows first)."""
    path, params = checkpoints[layout]
    doc = ForeignDocument(path)
    assert [x.layer for x in doc.layers] == [0, 2]          # layer 1 is dense
    gate_up = params["model.layers.2.mlp.experts.gate_up_proj"]   # [4, 64, 64]
    down = params["model.layers.2.mlp.experts.down_proj"]         # [4, 64, 32]
    c = S.compare_experts(doc.store(), 2)
    for matrix, values in (("moe_w1", gate_up[:, :32]), ("moe_w2", down),
                           ("moe_w3", gate_up[:, 32:])):
        np.testing.assert_allclose(c.column(matrix, "norm"),
                                   np.linalg.norm(values.reshape(4, -1), axis=1), rtol=1e-6)
        np.testing.assert_allclose(c.column(matrix, "max"), values.reshape(4, -1).max(axis=1),
                                   rtol=1e-6)
    np.testing.assert_allclose(c.router_rows, params["model.layers.2.mlp.gate.weight"], rtol=1e-7)
    rows = {r.name: r for r in doc.tensor_rows()}
    assert rows["model.layers.2.mlp.gate.weight"].kind == "router"
    if layout == "fused":
        assert rows["model.layers.2.mlp.experts.gate_up_proj"].n_experts == 4
    else:
        up = rows["model.layers.2.mlp.experts.3.up_proj.weight"]
        assert (up.kind, up.expert_of, up.layer) == ("experts", 3, 2)
    assert rows["model.layers.1.mlp.gate_proj.weight"].kind == "mlp"


def test_other_expert_orientations_stay_plain_tensors() -> None:
    """A fused gate_up of [E, H, 2I] (gpt-oss, Llama 4) is not split as [E, 2I, H]."""
    from colibri.formats.common import TensorEntry
    tensors = [TensorEntry("model.layers.0.mlp.router.weight", "F32", (4, 8), 0, 128),
               TensorEntry("model.layers.0.mlp.experts.gate_up_proj", "F32", (4, 8, 12), 0, 1),
               TensorEntry("model.layers.0.mlp.experts.down_proj", "F32", (4, 6, 8), 0, 1)]
    assert expert_layers(tensors) == []


def test_the_metadata_tree_points_at_the_bytes_it_shows() -> None:
    raw = GGUF.read_bytes()
    root = metadata_tree(ForeignDocument(GGUF))
    assert [n.key for n in root.fetch_all()] == ["header", "key/values", "tensor infos", "data"]
    version = root.child("header").child("version")
    assert struct.unpack_from("<I", raw, version.offset)[0] == 3 == int(version.value)
    tokens = root.child("key/values").child("tokenizer.ggml.tokens")
    assert tokens.type == "string[512]" and raw[tokens.offset + 8:].startswith(
        b"tokenizer.ggml.tokens")
    reference = gguf.GGUFReader(str(GGUF)).fields["tokenizer.ggml.tokens"]
    token = tokens.child("[300]")
    expected = bytes(reference.parts[reference.data[300]])
    assert raw[token.offset:token.offset + token.size] == struct.pack("<Q", len(expected)) + expected
    assert json.loads(token.value) == expected.decode()
    info = root.child("tensor infos").child("blk.1.ffn_down_exps.weight")
    ne = [int(info.child(f"ne[{d}]").value) for d in range(3)]
    assert ne == [32, 64, 4]
    offset = info.child("offset")
    assert struct.unpack_from("<Q", raw, offset.offset)[0] == int(offset.value.split()[0])


def test_a_vocabulary_is_walked_only_as_far_as_it_is_shown(tmp_path) -> None:
    """The 151 936-token vocabulary of a Qwen-sized GGUF gives its first FETCH children; the
    last token is found by walking on, and is the one written."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_formats import big_gguf
    path = tmp_path / "vocab.gguf"
    big_gguf(path, n_tensors=12, total=12 * 512 * 256)
    tokens = metadata_tree(ForeignDocument(path)).child("key/values").child(
        "tokenizer.ggml.tokens")
    assert tokens.type == "string[151936]" and tokens.count == 151936
    first = tokens.fetch()
    assert len(first) == FETCH == len(tokens.children) and not tokens.exhausted
    last = tokens.child("[151935]")
    assert json.loads(last.value) == "tok151935" and tokens.exhausted


def test_a_checkpoint_tree_has_each_shard_header_and_the_index(checkpoints) -> None:
    path, _params = checkpoints["sharded"]
    doc = ForeignDocument(path)
    files = doc.file_paths()
    assert len(files) > 2 and files[-1].endswith("model.safetensors.index.json")
    root = metadata_tree(doc)
    top = root.fetch_all()
    assert [n.key for n in top] == [Path(f).name for f in files]
    name = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    shard = files.index(doc.file.tensor_info(name).path)
    entry = top[shard].child("header").child(name)
    data = Path(files[shard]).read_bytes()
    assert data[entry.offset:].startswith(json.dumps(name).encode())
    begin, end = json.loads(entry.child("data_offsets").value)
    assert end - begin == doc.file.tensor_info(name).nbytes
    mapped = top[-1].child("weight_map").child(name)
    index = Path(files[-1]).read_bytes()
    assert index[mapped.offset:mapped.offset + mapped.size].decode() == \
        f'{json.dumps(name)}: {json.dumps(Path(files[shard]).name)}'
    assert mapped.file == len(files) - 1


def test_detection_for_the_inspector() -> None:
    assert is_foreign(GGUF) and is_foreign(CORPUS / "sharded")
    assert not is_foreign(ROOT / "resources" / "demo" / "demo.colibri")
    assert not is_foreign(CORPUS / "absent.gguf")


# -- the tab --------------------------------------------------------------------------------------


def test_a_gguf_file_opens_in_its_own_tab(window, qtbot) -> None:
    view = window.open_path(GGUF)
    assert isinstance(view, QtForeignFileView) and window.files.count() == 1
    with qtbot.waitSignal(view.sig_opened, timeout=TIMEOUT_MS):
        pass
    assert window.state_label.text().startswith(("structure valid", "checking", "valid"))
    assert view.tabs.currentWidget() is view.tensors
    assert view.tensors.table_model.rowCount() == len(view.doc.tensor_rows()) == 37
    assert view.metadata.tree_model.rowCount() == 4
    assert view.hex.source().size() == GGUF.stat().st_size
    view.show_tensor("blk.1.ffn_down_exps.weight")
    t = view.doc.file.tensor_info("blk.1.ffn_down_exps.weight")
    assert view.hex.cursor_offset() == t.offset
    assert window.open_path(GGUF) is view  # switching, not reopening


def test_the_values_of_a_gguf_tensor_and_its_layer_s_experts(window, qtbot) -> None:
    view = _open(window, qtbot, FIXTURES / "qwen3_moe-q8_0.gguf")
    ref = _gguf_values(FIXTURES / "qwen3_moe-q8_0.gguf")
    view.set_view("values")
    values = view.values
    with qtbot.waitSignal(values.sig_tensor_shown, timeout=TIMEOUT_MS):
        view.show_tensor("blk.1.ffn_gate_exps.weight", expert=None)
    gate = ref["blk.1.ffn_gate_exps.weight"]                       # [4, 32, 64]
    assert values.stat_value("max") == gate.max() and values.stat_value("count") == gate.size
    assert values.heatmap_image.image.shape == (128, 64)
    assert values.layer_combo.currentData() == 1
    with qtbot.waitSignal(values.sig_experts_shown, timeout=TIMEOUT_MS):
        values.tabs.setCurrentWidget(values.experts_page)   # opening the page compares layer 1
    header = [values.experts_table.horizontalHeaderItem(c).text()
              for c in range(values.experts_table.columnCount())]
    shown = [values.experts_table.item(e, header.index("w1 norm")).data(0x0100) for e in range(4)]
    np.testing.assert_allclose(shown, np.linalg.norm(gate.reshape(4, -1), axis=1), rtol=1e-9)
    assert values.router_image.image.shape == (4, 64)


def test_the_experts_of_a_per_expert_checkpoint_in_the_tab(window, qtbot, checkpoints) -> None:
    path, params = checkpoints["per_expert"]
    view = _open(window, qtbot, path)
    view.tensors.set_grouping("expert")
    assert view.show_tensor("model.layers.2.mlp.experts.1.down_proj.weight")
    row = view.tensors.selected_row()
    assert row.expert_of == 1
    view.set_view("values")
    values = view.values
    with qtbot.waitSignal(values.sig_experts_shown, timeout=TIMEOUT_MS):
        values.show_layer_experts(2)
    header = [values.experts_table.horizontalHeaderItem(c).text()
              for c in range(values.experts_table.columnCount())]
    down = params["model.layers.2.mlp.experts.down_proj"]
    shown = [values.experts_table.item(e, header.index("w2 norm")).data(0x0100) for e in range(4)]
    np.testing.assert_allclose(shown, np.linalg.norm(down.reshape(4, -1), axis=1), rtol=1e-6)


def test_a_sharded_checkpoint_opens_through_its_directory_and_index(window, qtbot) -> None:
    directory = _open(window, qtbot, CORPUS / "sharded")
    assert directory.doc.status == "valid"
    assert [r.name for r in directory.doc.tensor_rows()] == ["a", "b"]
    assert directory.file_combo.count() == 3 and directory.file_combo.isVisibleTo(directory)
    directory.show_tensor("b")  # the hexdump follows the tensor to its shard
    assert directory.file_combo.currentIndex() == 1
    assert directory.hex.cursor_offset() == directory.doc.file.tensor_info("b").offset
    node = directory.metadata.select(["model.safetensors.index.json", "weight_map", "b"])
    assert directory.file_combo.currentIndex() == 2 and directory.hex.cursor_offset() == node.offset
    index = _open(window, qtbot, CORPUS / "sharded" / "model.safetensors.index.json")
    assert index is not directory and window.files.count() == 2
    assert index.metadata.tree_model.rowCount() == 3


def test_a_broken_file_opens_into_its_validation_report(window, qtbot) -> None:
    view = _open(window, qtbot, CORPUS / "gap.gguf")
    assert view.doc.file is None and view.tabs.currentWidget() is view.validation
    assert window.state_label.text() == "invalid: 1 error(s)"
    assert view.validation.model.rowCount() == 1
    assert "llama.cpp expects 256" in view.validation.explanation.text()
    assert view.hex.source().size() == (CORPUS / "gap.gguf").stat().st_size
    view.validation.select_problem(0)
    assert view.hex.cursor_offset() == view.validation.problems[0].offset


BROKEN = {e["file"]: e for e in json.loads((CORPUS / "manifest.json").read_text())}


@pytest.mark.parametrize("path, entry", [
    ("truncated_header.gguf", "truncated_header.gguf"),
    ("not_json.safetensors", "not_json.safetensors"),
    ("index_not_json/model.safetensors.index.json", "index_not_json"),
    ("index_wrong_shard/model.safetensors.index.json", "index_wrong_shard"),
    ("missing_shard", "missing_shard")], ids=["gguf", "safetensors", "index", "index-shard", "dir"])
def test_every_kind_of_broken_file_opens_into_its_report(window, qtbot, path, entry) -> None:
    """Dropped on the window, a damaged file, index or directory opens in a foreign tab on its
    validation report with the corpus's expected error, its bytes in the hexdump, and no offer
    to run it."""
    target, expected = CORPUS / path, BROKEN[entry]
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(target))])
    window.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                                Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier))
    view = window.files.currentWidget()
    assert isinstance(view, QtForeignFileView)
    if not view.is_open():
        with qtbot.waitSignal(view.sig_opened, timeout=TIMEOUT_MS):
            pass
    assert view.doc.file is None and view.tabs.currentWidget() is view.validation
    assert window.state_label.text().startswith("invalid: ")
    first = view.validation.problems[0]
    assert (first.code_name, first.tensor) == (expected["code"], expected["tensor"])
    assert expected["message"] in first.message
    assert expected["message"] in view.validation.explanation.text()
    checkpoint = target if target.is_dir() else target.parent if path.startswith("index") else None
    files = [target] if checkpoint is None else list(checkpoint.iterdir())
    assert view.hex.source().size() in {f.stat().st_size for f in files}
    assert not view.run_button.isVisibleTo(view)


def test_a_broken_shard_s_problem_shows_its_bytes_in_that_shard(window, qtbot) -> None:
    view = _open(window, qtbot, CORPUS / "shard_duplicate")
    problem = view.validation.problems[0]
    assert problem.message.startswith("model-00002-of-00002.safetensors: ")
    view.validation.select_problem(0)
    assert view.file_combo.currentIndex() == 1 and view.hex.cursor_offset() == problem.offset


@pytest.mark.parametrize("name, problem", [("valid.safetensors", None),
                                           ("nonfinite.gguf", "NaN/Inf value(s)")])
def test_data_checks_run_on_a_small_file_and_report(window, qtbot, name, problem) -> None:
    view = _open(window, qtbot, CORPUS / name)
    qtbot.waitUntil(lambda: view.data_result is not None, timeout=TIMEOUT_MS)
    if problem is None:
        assert window.state_label.text() == "valid (structure and data)"
        assert "read every tensor" in view.validation.explanation.text()
    else:
        assert window.state_label.text() == "invalid: 1 error(s)"
        assert any(problem in p.message for p in view.validation.problems)
        assert view.tensors.table_model.check_of(
            next(r for r in view.tensors.visible_rows() if r.name == "blk.0.attn_q.weight")) == "bad"


@pytest.mark.parametrize("path", [GGUF, CORPUS / "valid.safetensors",
                                  CORPUS / "sharded" / "model.safetensors.index.json",
                                  CORPUS / "sharded"], ids=["gguf", "safetensors", "index", "dir"])
def test_drop_and_open_recent(window, qtbot, path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)
    view = window.files.currentWidget()
    assert window.files.count() == 1 and isinstance(view, QtForeignFileView)
    with qtbot.waitSignal(view.sig_opened, timeout=TIMEOUT_MS):
        pass
    assert str(path) in window.recent.paths and view.doc.status == "valid"
    window.close_file(0)
    assert window.files.count() == 0
    window._fill_recent_menu()
    action = next(a for a in window.recent_menu.actions() if a.text() == str(path))
    action.trigger()
    reopened = window.files.currentWidget()
    assert isinstance(reopened, QtForeignFileView) and reopened.path == str(path)


def test_a_checkpoint_directory_opens_from_the_file_menu(window, qtbot, monkeypatch) -> None:
    from colibri.inspector import main_window
    asked = []

    def pick(parent, caption, start):
        asked.append(caption)
        return str(CORPUS / "sharded")
    monkeypatch.setattr(main_window.QFileDialog, "getExistingDirectory", pick)
    assert window.open_directory_action in window.menuBar().actions()[0].menu().actions()
    window.open_directory_action.trigger()
    view = window.files.currentWidget()
    assert asked and isinstance(view, QtForeignFileView) and view.path == str(CORPUS / "sharded")
    if not view.is_open():
        with qtbot.waitSignal(view.sig_opened, timeout=TIMEOUT_MS):
            pass
    assert [r.name for r in view.doc.tensor_rows()] == ["a", "b"]


def test_the_table_of_a_big_checkpoint_holds_one_chunk_until_scrolled(window, qtbot, tmp_path):
    """A 4-shard checkpoint of 12 000 tensors: the table's model holds a chunk or two of
    FETCH_ROWS rows after opening (the view asks for more while its page is not full),
    scrolling to the end fetches more, and finding the last tensor fetches to it."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_formats import big_checkpoint
    big_checkpoint(tmp_path, shards=4, per_shard=3000, total=12000 * 64)
    view = _open(window, qtbot, tmp_path)
    model = view.tensors.table_model
    held = model.rowCount()
    assert model.total_count() == 12000 and FETCH_ROWS <= held <= 2 * FETCH_ROWS
    view.tensors.view.scrollToBottom()
    qtbot.waitUntil(lambda: model.rowCount() > held)
    assert view.show_tensor("model.layers.3.t2999.weight")
    assert model.rowCount() == 12000 and view.file_combo.currentIndex() == 3


def test_run_in_the_debugger_imports_once_into_the_cache(window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_CACHE", str(tmp_path / "cache"))
    view = _open(window, qtbot, GGUF)
    assert view.run_button.isVisibleTo(view)
    with qtbot.waitSignal(view.sig_imported, timeout=60000) as blocker:
        view.run_button.click()
    target = blocker.args[0]
    assert target.startswith(str(tmp_path / "cache" / "imports"))
    current = window.current_view()
    assert current is not None and current.path == target
    assert current.current_view() == "debugger"
    assert current.doc.model is not None and current.doc.model.arch == "qwen2_moe"
    before = Path(target).stat().st_mtime_ns
    from colibri.inspection.foreign import import_for_debugger, import_path
    assert import_for_debugger(GGUF) == target == import_path(GGUF)
    assert Path(target).stat().st_mtime_ns == before  # the cached import is reused
    assert not _open(window, qtbot, CORPUS / "valid.gguf").run_button.isVisibleTo(window)


def test_a_failed_check_of_a_gguf_file_is_said_in_its_report(qtbot, window: MainWindow) -> None:
    view = _open(window, qtbot, GGUF)
    qtbot.waitUntil(lambda: not view.is_checking(), timeout=TIMEOUT_MS)
    view.checks.sig_failed.emit("OSError: the disk went away\nTraceback ...")  # the worker's
    assert not view.is_checking()
    assert view.validation.summary.text() == "The check failed: OSError: the disk went away"
