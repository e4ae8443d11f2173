"""The prompt field of the debugger and the jitter lab: whitespace is shown and kept, token ids
are accepted (and on a model without a tokenizer, asked for by name instead of an empty run),
and a model's own example prompt is the default."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtGui import QTextOption

from colibri.engine import Model
from colibri.inspector.debugger import QtDebuggerPanel
from colibri.inspector.jitter import QtJitterLab
from colibri.inspector.prompt import NO_TOKENIZER, token_ids

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"


@pytest.mark.parametrize("text, ids", [("3,4,5", [3, 4, 5]), (" 3, 4 ,5 ", [3, 4, 5]),
                                       ("7", [7]), ("1, 2,", [1, 2]), ("hello", None),
                                       ("3 4", None), ("", None), ("def f(1, 2):", None)])
def test_token_ids_are_read_only_from_an_id_list(text, ids):
    assert token_ids(text) == ids


@pytest.fixture
def panel(debugger_panel) -> QtDebuggerPanel:
    return debugger_panel()


def test_a_model_without_tokenizer_asks_for_token_ids(qtbot, panel, tiny_model_path):
    with Model.open(tiny_model_path("mixtral", with_tokenizer=False)) as model:
        panel.set_model(model)
        form = panel.run_panel
        assert "no tokenizer" in form.prompt.placeholderText()
        assert "token ids" in form.prompt.placeholderText()
        form.prompt.setText("hello")
        assert NO_TOKENIZER in form.pieces.text()
        form.buttons["run"].click()
        assert form.status.text() == f"cannot run: {NO_TOKENIZER}"
        form.prompt.setText("3, 4, 5")
        assert [t for t, _ in form.prompt_tokens()] == [3, 4, 5]


def test_the_jitter_lab_says_a_model_has_no_tokenizer(qtbot, tiny_model_path):
    lab = QtJitterLab()
    qtbot.addWidget(lab)
    with Model.open(tiny_model_path("mixtral", with_tokenizer=False)) as model:
        lab.set_model(model)
        assert "no tokenizer" in lab.prompt.placeholderText()
        lab.prompt.setText("hello")
        with qtbot.waitSignal(lab.sig_failed, timeout=30000):
            lab.start("jitter")
        assert lab.status.text() == f"failed: {NO_TOKENIZER}"
    lab.shutdown()


def test_the_demo_suggests_its_prompt_without_hidden_whitespace(qtbot, panel):
    lab = QtJitterLab()
    qtbot.addWidget(lab)
    with Model.open(DEMO) as model:
        suggested = model.metadata["user"]["demo"]["prompts"][0]
        panel.set_model(model)
        lab.set_model(model)
        assert panel.run_panel.prompt.text() == suggested == lab.prompt.text()
        assert suggested == suggested.strip()
        # what the CLI's --prompt runs, token for token
        assert [i for i, _ in panel.run_panel.prompt_tokens()] == list(
            model.tokenizer.encode(suggested).ids)
    lab.shutdown()


def test_whitespace_is_shown_and_kept(qtbot, panel):
    edit = panel.run_panel.prompt
    flags = edit.document().defaultTextOption().flags()
    assert flags & QTextOption.Flag.ShowTabsAndSpaces
    assert flags & QTextOption.Flag.ShowLineAndParagraphSeparators
    edit.setText("def f():\n    ")
    assert edit.text() == "def f():\n    "
