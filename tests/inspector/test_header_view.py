"""The header view shows exactly what the engine decodes: every fixed-header field with its
offset, size and raw bytes from the file, the decoded hyper-parameters, the user metadata, and a
broken file's header too. Selecting a field shows its bytes in the hexdump."""

from __future__ import annotations

from pathlib import Path

import pytest

import colibri
from colibri.engine import header_fields
from colibri.inspection.document import ModelDocument
from colibri.inspector.header_view import RAW_COLUMN, VALUE_COLUMN, QtHeaderView, format_value
from colibri.inspector.main_window import MainWindow
from corrupt_files import corrupt_cases


pytestmark = pytest.mark.usefixtures("inspector_settings")


@pytest.fixture
def header(qtbot) -> QtHeaderView:
    view = QtHeaderView()
    qtbot.addWidget(view)
    return view


def test_every_engine_field_is_shown(header, tiny_model_path):
    path = tiny_model_path()
    header.set_document(ModelDocument(path))
    engine = colibri.Model.open(path).header_fields()
    assert header.field_names() == [f.name for f in engine]


def test_field_values_equal_the_engine(header, tiny_model_path):
    path = tiny_model_path("qwen2_moe")
    header.set_document(ModelDocument(path))
    for f in colibri.Model.open(path).header_fields():
        assert header.field(f.name).value == f.value
        assert header.field_item(f.name).text(VALUE_COLUMN) == format_value(f)


def test_field_offset_size_and_raw_bytes_come_from_the_file(header, tiny_model_path):
    path = tiny_model_path()
    data = Path(path).read_bytes()
    header.set_document(ModelDocument(path))
    for f in header_fields(data[:4096]):
        item = header.field_item(f.name)
        assert item.text(1) == f"0x{f.offset:03X}"
        assert item.text(2) == str(f.size)
        shown = data[f.offset:f.offset + min(f.size, 16)].hex(" ").upper()
        assert item.text(RAW_COLUMN).startswith(shown)


def test_hyper_parameters_and_user_metadata_are_shown(header, tiny_model):
    tm = tiny_model()
    header.set_document(ModelDocument(tm.path))
    top = {header.tree.topLevelItem(i).text(0): header.tree.topLevelItem(i)
           for i in range(header.tree.topLevelItemCount())}
    hparams = top["Hyper-parameters (decoded)"]
    decoded = {hparams.child(i).text(0): hparams.child(i).text(VALUE_COLUMN)
               for i in range(hparams.childCount())}
    assert decoded["d_model"] == str(tm.hparams.d_model)
    assert decoded["arch_name"] == "mixtral"
    user = top["User metadata"]
    keys = {user.child(i).text(0) for i in range(user.childCount())}
    assert keys == set(tm.metadata)


def test_corrupt_file_header_is_still_shown(header, tiny_image, tmp_path):
    case = next(c for c in corrupt_cases(tiny_image()) if c.name == "bad_version")
    header.set_document(ModelDocument(case.write(tmp_path)))
    assert header.field("version").value == 3
    assert header.field("magic").value == b"COLI"


def test_truncated_file_marks_missing_fields(header, tmp_path, tiny_image):
    path = tmp_path / "short.colibri"
    path.write_bytes(bytes(tiny_image()[:0x30]))
    header.set_document(ModelDocument(path))
    assert header.field("tensor_count").present
    assert not header.field("file_size").present
    assert "beyond the end" in header.field_item("file_size").text(VALUE_COLUMN)


def test_selecting_a_field_emits_its_range(qtbot, header, tiny_model_path):
    header.set_document(ModelDocument(tiny_model_path()))
    with qtbot.waitSignal(header.sig_field_selected) as blocker:
        header.select_field("data_offset")
    assert blocker.args == [0x20, 8]


def test_selecting_a_field_highlights_it_in_the_hexdump(qtbot, tiny_model_path):
    window = MainWindow()
    qtbot.addWidget(window)
    view = window.open_path(tiny_model_path())
    view.header.select_field("tensor_count")
    assert view.hex.cursor_offset() == 0x14
    assert view.hex.selection() == (0x14, 0x18)


def test_routing_branch_names_the_family_and_each_layers_rule(qtbot, header, tiny_model_path):
    """The Routing branch: the family, then every layer's routing entry in the engine's words,
    and selecting an entry shows its bytes (offset and size in the routing section)."""
    from tiny_models import V3_RULE
    path = tiny_model_path("mixtral", n_layers=3, n_experts=8, top_k=2, dense_layers=(1,),
                           rule=V3_RULE)
    header.set_document(ModelDocument(path))
    model = colibri.Model.open(path)
    rows = header.routing_rows()
    assert rows[0] == ("family", "mixtral")
    assert rows[1:] == [(f"layer {i}", model.routing(i).describe()) for i in range(3)]
    assert rows[1][1].startswith("sigmoid over 8 experts, + correction bias for the choice only")
    assert rows[2][1] == "dense MLP"
    routing = model.sections["routing"]
    with qtbot.waitSignal(header.sig_field_selected) as blocker:
        header.select_routing_entry(2)
    assert blocker.args == [routing.offset + 2 * 128, 128]
    assert Path(path).read_bytes()[blocker.args[0]:blocker.args[0] + 4] == (2).to_bytes(4, "little")


def test_routing_branch_of_a_version_1_file(qtbot, header):
    """A version-1 file's 32-byte entries read as the rule version 1 means."""
    v1 = Path(__file__).resolve().parents[1] / "v1" / "qwen2_moe-v1.colibri"
    header.set_document(ModelDocument(v1))
    rows = header.routing_rows()
    assert rows[0] == ("family", "qwen2_moe")
    assert any(value.startswith("softmax over") for _name, value in rows[1:])
    with qtbot.waitSignal(header.sig_field_selected) as blocker:
        header.select_routing_entry(1)
    assert blocker.args == [256 + 32, 32]
