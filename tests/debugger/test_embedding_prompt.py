"""A debugger run from embedding rows (RunSettings.prompt_embeddings, as `colibri run
--embedding`): the model's own table rows give the token ids' routing bit for bit, stepping one
layer at a time included; its positions read token -1, "<embedding>"; interventions recompute
from the rows; session files keep the rows."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from colibri.debugging import Debugger, RunSettings
from colibri.debugging.session_file import SessionFormatError, load_session, save_session
from colibri.engine import Model
from colibri.errors import ColibriValueError
from colibri.interventions import Intervention

from dbg_helpers import PROMPT, finished, rewrite_session

FORCE = Intervention.parse("force:pos=3,layer=2,experts=5+6")
SAME = ("expert_ids", "expert_weights", "router_logits", "selection_scores", "intervened")


def rows(model: Model) -> np.ndarray:
    return np.ascontiguousarray(model.tensor_f32("token_embd")[list(PROMPT)])


def test_rows_route_as_the_token_ids_stepped_layer_by_layer(model: Model) -> None:
    by_ids = finished(model, RunSettings(PROMPT, 4))
    dbg = Debugger(model, RunSettings((), 4, prompt_embeddings=rows(model)))
    assert dbg.settings.prompt_tokens == (-1,) * len(PROMPT)
    first = dbg.step_layer()            # a true step: position 0 paused after its first MoE layer
    assert first is not None and dbg.session.layers_done is not None
    assert dbg.pending_events()[0].token_text == "<embedding>"
    while not dbg.finished:
        dbg.step_layer()
    assert dbg.generated == by_ids.generated
    for name in SAME:
        assert dbg.record.array(name).tobytes() == by_ids.record.array(name).tobytes(), name
    assert list(dbg.record.tokens[:len(PROMPT)]) == [-1] * len(PROMPT)
    assert dbg.record.token_texts[:len(PROMPT)] == ["<embedding>"] * len(PROMPT)
    assert dbg.prompt_pieces()[0] == (-1, "<embedding>")
    by_ids.close()
    dbg.close()


def test_an_intervention_recomputes_from_the_rows(model: Model) -> None:
    dbg = finished(model, RunSettings((), 6, prompt_embeddings=rows(model)))
    cf = dbg.set_interventions([FORCE])
    assert cf is not None and cf.from_position == 3
    ref = finished(model, RunSettings(PROMPT, 6, interventions=[FORCE]))
    for name in SAME:
        assert dbg.record.array(name).tobytes() == ref.record.array(name).tobytes(), name
    assert dbg.generated == ref.generated
    dbg.close()
    ref.close()


def test_sessions_keep_the_rows(model: Model, tmp_path: Path) -> None:
    x = rows(model)
    dbg = finished(model, RunSettings((), 3, prompt_embeddings=x))
    path = tmp_path / "rows.colibri-session"
    save_session(path, dbg)
    loaded = load_session(path)
    assert loaded.settings == dbg.settings
    assert loaded.settings.prompt_embeddings.tobytes() == x.tobytes()
    assert loaded.record.equals(dbg.record)
    # the rows are what makes the run: a new run from the loaded settings is the same run
    again = finished(model, loaded.settings)
    assert again.record.equals(dbg.record, timings=False)
    # a file whose rows went missing is named, not half-read
    broken = rewrite_session(path, tmp_path / "broken.colibri-session",
                             lambda _manifest, members: members.pop("prompt_embeddings.npy"))
    with pytest.raises(SessionFormatError, match="no member prompt_embeddings.npy"):
        load_session(broken)
    manifest = json.loads(zipfile.ZipFile(path).read("manifest.json"))
    assert manifest["prompt_embeddings"]["shape"] == list(x.shape)
    assert "prompt_embeddings" not in manifest["settings"]
    for d in (dbg, again):
        d.close()


def test_rows_of_another_width_are_refused_before_a_run(model: Model) -> None:
    with pytest.raises(ColibriValueError, match=r"expected \[positions, 32\]"):
        Debugger(model, RunSettings((), 3, prompt_embeddings=np.zeros((2, 5), np.float32)))
    with pytest.raises(ValueError, match="token -1 at each position"):
        RunSettings((1, 2), 3, prompt_embeddings=np.zeros((2, 32), np.float32))


# ---------------------------------------------------------------------------------------------
# the Inspector's run form


@pytest.fixture
def panel(model: Model, debugger_panel):
    pytest.importorskip("pyqtgraph")
    return debugger_panel(model)


def test_the_run_form_runs_rows_from_a_npy_file(qtbot, panel, model: Model,
                                                tmp_path: Path) -> None:
    """Rows... takes a .npy: the form's settings carry the rows, the run is the headless one,
    the event list reads <embedding>; a file of another width is named in the status line and
    Text gives the typed prompt back."""
    from colibri.inspector.debugger.views import EventTableModel

    form = panel.run_panel
    form.prompt.setText("3,4")
    form.max_new.setValue(4)
    np.save(tmp_path / "wide.npy", np.zeros((2, 33), np.float32))
    assert not form.load_rows(str(tmp_path / "wide.npy"))
    assert "wide.npy: embeddings of shape [2, 33], expected [positions, 32]" in form.status.text()
    np.save(tmp_path / "prompt.npy", rows(model))
    assert form.load_rows(str(tmp_path / "prompt.npy"))
    assert form.prompt.isReadOnly() and "5 embedding rows from prompt.npy" in form.prompt.text()
    assert form.pieces.text() == "<embedding> x 5" and form.rows_button.text() == "Text"
    settings = form.settings()
    assert settings.prompt_embeddings.tobytes() == rows(model).tobytes()
    with qtbot.waitSignal(panel.controller.sig_run_finished, timeout=20000) as blocker:
        form.buttons["run"].click()
    snap = blocker.args[0]
    headless = finished(model, RunSettings((), 4, prompt_embeddings=rows(model)))
    assert snap.record.equals(headless.record, timings=False)
    panel._repaint()
    token = EventTableModel.COLUMNS.index("token")
    assert panel.event_list.model.data(panel.event_list.model.index(0, token)) == "<embedding>"
    form.rows_button.click()             # back to the text prompt
    assert form.embeddings is None and form.prompt.text() == "3,4" and not form.prompt.isReadOnly()
    assert form.settings().prompt_embeddings is None
    headless.close()
