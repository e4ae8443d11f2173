"""GGUF files and safetensors checkpoints in the Inspector: each format, a sharded checkpoint
(index file and directory), a broken file, drag and drop and Open Recent, and the Qt-free
document behind the tab."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from colibri.formats.gguf_file import GGUFFile
from colibri.inspection.foreign import ForeignDocument, is_foreign
from colibri.inspector.foreign_view import QtForeignFileView
from colibri.inspector.main_window import ENV_SETTINGS, MainWindow

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus" / "formats"
GGUF = ROOT / "tests" / "fixtures" / "gguf" / "qwen2_moe-q4_0.gguf"


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SETTINGS, str(tmp_path / "settings"))


@pytest.fixture
def window(qtbot) -> MainWindow:
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    return w


def test_document_of_a_llama_cpp_gguf() -> None:
    doc = ForeignDocument(GGUF)
    assert doc.format == "gguf" and doc.status == "valid" and doc.explanation() == ""
    keys = [m.key for m in doc.metadata_rows()]
    assert keys[0] == "general.architecture" and "tokenizer.ggml.tokens" in keys
    rows = {r.name: r for r in doc.tensor_rows()}
    gate = rows["blk.0.ffn_gate_exps.weight"]
    assert (gate.dtype, gate.layer, gate.kind, gate.n_experts) == ("Q4_0", 0, "experts", 4)
    assert rows["blk.0.ffn_gate_inp.weight"].kind == "router"
    kinds = {r.kind for r in doc.regions()}
    assert {"header", "metadata", "tensor_table", "tensor"} <= kinds
    f = GGUFFile.open(str(GGUF))
    s = doc.summary("blk.0.ffn_gate_exps.weight")
    values = f.tensor_f32("blk.0.ffn_gate_exps.weight")
    assert s.count == values.size and s.max == pytest.approx(float(values.max()))
    experts = doc.expert_comparison("blk.0.ffn_gate_exps.weight")
    assert [e for e, *_ in experts] == [0, 1, 2, 3]
    assert experts[2][1] == pytest.approx(float(np.linalg.norm(values[2])), rel=1e-5)


def test_a_gguf_file_opens_in_its_own_tab(window, qtbot) -> None:
    view = window.open_path(GGUF)
    assert isinstance(view, QtForeignFileView) and window.files.count() == 1
    assert window.state_label.text() == "valid"
    assert view.tabs.currentIndex() == 2  # the tensor table
    assert view.tensor_table.table_model.rowCount() == 0  # the rows come after the first paint
    qtbot.waitUntil(lambda: view.tensor_table.table_model.rowCount() == len(view.doc.tensor_rows()))
    assert view.metadata.rowCount() == len(view.doc.metadata_rows())
    assert view.hex.source().size() == GGUF.stat().st_size
    with qtbot.waitSignal(view.sig_values_ready, timeout=20000):
        view.show_tensor("blk.1.ffn_down_exps.weight")
    assert view.experts.rowCount() == 4
    t = view.doc.file.tensor_info("blk.1.ffn_down_exps.weight")
    assert view.hex.cursor_offset() == t.offset
    assert window.open_path(GGUF) is view  # switching, not reopening


def test_a_sharded_checkpoint_opens_through_its_directory_and_index(window) -> None:
    directory = window.open_path(CORPUS / "sharded")
    assert isinstance(directory, QtForeignFileView) and directory.doc.status == "valid"
    assert [r.name for r in directory.doc.tensor_rows()] == ["a", "b"]
    assert directory.shard.count() == 2
    directory.show_tensor("b")  # the hexdump follows the tensor to its shard
    assert directory.shard.currentIndex() == 1
    index = window.open_path(CORPUS / "sharded" / "model.safetensors.index.json")
    assert index is not directory and window.files.count() == 2
    assert [m.key for m in index.doc.metadata_rows()][0] == "index.total_size"


def test_a_broken_file_opens_into_its_validation_report(window) -> None:
    view = window.open_path(CORPUS / "gap.gguf")
    assert isinstance(view, QtForeignFileView) and view.doc.file is None
    assert view.tabs.currentIndex() == 0 and window.state_label.text() == "invalid"
    assert view.problems.rowCount() == 1
    assert "llama.cpp expects 256" in view.explanation.text()
    assert view.hex.source().size() == (CORPUS / "gap.gguf").stat().st_size


def test_drop_and_open_recent(window, qtbot) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(CORPUS / "valid.safetensors"))])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)
    assert window.files.count() == 1 and isinstance(window.files.currentWidget(),
                                                    QtForeignFileView)
    assert str(CORPUS / "valid.safetensors") in window.recent.paths
    window.close_file(0)
    assert window.files.count() == 0


def test_detection_for_the_inspector() -> None:
    assert is_foreign(GGUF) and is_foreign(CORPUS / "sharded")
    assert not is_foreign(ROOT / "resources" / "demo" / "demo.colibri")
    assert not is_foreign(CORPUS / "absent.gguf")


def test_run_in_the_debugger_imports_once_into_the_cache(window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_CACHE", str(tmp_path / "cache"))
    view = window.open_path(GGUF)
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
    assert not window.open_path(CORPUS / "valid.gguf").run_button.isVisibleTo(window)
