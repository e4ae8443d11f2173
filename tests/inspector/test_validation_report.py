"""The validation report on the corrupt-file corpus: every broken file opens into the report with
the right problem and a plain explanation, data problems appear after the data checks, and
clicking a problem shows its bytes in the hexdump and its tensor in the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from colibri.inspection.document import ModelDocument, data_check
from colibri.inspector import main_window
from colibri.inspector.main_window import FileView, MainWindow
from colibri.values import Cancelled
from corrupt_files import CASE_NAMES, CorruptCase, corrupt_cases


pytestmark = pytest.mark.usefixtures("inspector_settings")


@pytest.fixture
def cases(tiny_image) -> dict[str, CorruptCase]:
    return {c.name: c for c in corrupt_cases(tiny_image())}


def _open(window: MainWindow, case: CorruptCase, tmp_path: Path) -> FileView:
    return window.open_path(case.write(tmp_path))


def _run_checks(qtbot, view: FileView) -> None:
    with qtbot.waitSignal(view.checks.sig_finished, timeout=20000):
        view.run_checks(True, True)
    qtbot.waitUntil(lambda: not view.is_checking(), timeout=5000)


def test_corpus_covers_every_class(cases: dict[str, CorruptCase]) -> None:
    assert tuple(cases) == CASE_NAMES


@pytest.mark.parametrize("name", CASE_NAMES)
def test_corrupt_file_opens_into_report_with_its_code(qtbot, window, cases, tmp_path, name):
    case = cases[name]
    view = _open(window, case, tmp_path)
    if case.data_check:
        _run_checks(qtbot, view)
    shown = [(p.code_name, p.tensor) for p in view.validation.problems]
    assert (case.code, case.tensor) in shown
    assert view.validation.explanation.text()


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if n not in ("checksum_mismatch", "nan")])
def test_structurally_broken_file_starts_on_the_report(window, cases, tmp_path, name):
    view = _open(window, cases[name], tmp_path)
    assert view.doc.model is None
    assert view.tabs.currentWidget() is view.validation
    assert window.state_label.text().startswith("invalid")


def test_zip_file_is_explained_in_plain_language(window, cases, tmp_path):
    view = _open(window, cases["not_colibri_zip"], tmp_path)
    text = view.validation.explanation.text()
    assert "not a Colibri model file" in text and "50 4B 03 04" in text and "ZIP" in text


def test_truncated_file_is_explained_in_plain_language(window, cases, tmp_path):
    view = _open(window, cases["truncated"], tmp_path)
    assert "truncated" in view.validation.explanation.text()


def test_problem_table_shows_offset_in_hex(window, cases, tmp_path):
    view = _open(window, cases["overlap"], tmp_path)
    problem = view.validation.problems[0]
    cell = view.validation.model.index(0, 3).data()
    assert cell == f"0x{problem.offset:X}"


def test_clicking_a_problem_shows_its_bytes_in_the_hexdump(qtbot, window, cases, tmp_path):
    view = _open(window, cases["transposed_gate"], tmp_path)
    row = next(i for i, p in enumerate(view.validation.problems) if p.code_name == "COL_ERR_SHAPE")
    problem = view.validation.problems[row]
    with qtbot.waitSignal(view.validation.sig_problem_selected) as blocker:
        view.validation.select_problem(row)
    assert blocker.args == [problem.offset, problem.tensor]
    assert view.hex.cursor_offset() == problem.offset
    data = (tmp_path / "transposed_gate.colibri").read_bytes()
    assert view.hex.source().read(problem.offset, 8) == data[problem.offset:problem.offset + 8]


def test_clicking_a_data_problem_selects_its_tensor(qtbot, window, cases, tmp_path):
    view = _open(window, cases["checksum_mismatch"], tmp_path)
    _run_checks(qtbot, view)
    row = next(i for i, p in enumerate(view.validation.problems)
               if p.code_name == "COL_ERR_CHECKSUM")
    view.validation.select_problem(row)
    selected = view.tensors.selected_row()
    assert selected is not None and selected.name == "layers.0.moe_w2"
    assert view.hex.cursor_offset() == view.validation.problems[row].offset


def test_data_checks_mark_the_bad_tensor_in_the_table(qtbot, window, cases, tmp_path):
    view = _open(window, cases["nan"], tmp_path)
    _run_checks(qtbot, view)
    assert view.data_result is not None
    assert view.data_result.status["layers.0.attn_q"] == "bad"
    assert sum(1 for s in view.data_result.status.values() if s == "bad") == 1


def test_valid_file_report_says_valid(qtbot, window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    _run_checks(qtbot, view)
    assert view.validation.problems == []
    assert "valid" in view.validation.explanation.text()
    assert window.state_label.text().startswith("valid (structure and data)")


def test_data_check_stops_between_tensors_when_cancelled(tiny_model_path):
    fn = data_check(ModelDocument(tiny_model_path()))
    with pytest.raises(Cancelled):
        fn(lambda *args: None, lambda: True)


def test_data_check_progress_is_byte_weighted_and_ends_full(tiny_model_path):
    doc = ModelDocument(tiny_model_path())
    seen: list[tuple[int, int]] = []
    result = data_check(doc)(lambda done, total, text="": seen.append((done, total)),
                             lambda: False)
    assert seen[-1][0] == seen[-1][1]
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(result.status) == len(doc.model.tensors)


def test_a_flipped_data_byte_is_found_without_asking(qtbot, window, cases, tmp_path):
    """A file under the automatic-check size with one data byte changed: the data checks run
    when it opens, and the report turns from 'structure valid' to the checksum error."""
    view = _open(window, cases["checksum_mismatch"], tmp_path)
    qtbot.waitUntil(lambda: view.data_result is not None, timeout=20000)
    assert any(p.code_name == "COL_ERR_CHECKSUM" for p in view.validation.problems)
    assert view.validation.explanation.property("state") == "invalid"


def test_unchecked_data_is_not_called_valid(qtbot, window, tiny_model_path, monkeypatch):
    """Above the automatic-check size, the banner says the structure is valid and the data is
    not checked (not green) until the checks ran."""
    monkeypatch.setattr(main_window, "AUTO_CHECK_BYTES", 0)
    view = window.open_path(tiny_model_path())
    qtbot.wait(50)
    assert view.data_result is None and not view.is_checking()
    banner = view.validation.explanation
    assert banner.property("state") == "unchecked"
    assert "structure is valid" in banner.text() and "not checked" in banner.text()
    assert window.state_label.text() == "structure valid, data not checked"
    _run_checks(qtbot, view)
    assert banner.property("state") == "valid"


def test_a_failed_check_is_said_in_the_report_and_ends_the_run(qtbot, window, tiny_model_path):
    view = window.open_path(tiny_model_path())
    _run_checks(qtbot, view)
    with qtbot.waitSignal(view.sig_running, timeout=5000) as running:
        view.checks.sig_failed.emit("OSError: the disk went away\nTraceback ...")  # the worker's
    assert running.args == [False] and not view.is_checking()
    assert view.last_error == "OSError: the disk went away"
    assert view.validation.summary.text() == "The check failed: OSError: the disk went away"
