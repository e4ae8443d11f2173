"""The Inspector's Corpus view draws a profile's numbers, lists what chose a clicked expert,
compares two profiles as differences, and reads profiles off the UI thread."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from PySide6.QtCore import QPointF, Qt  # noqa: E402
from PySide6.QtGui import QImage  # noqa: E402

from colibri.inspector import app as inspector_app  # noqa: E402
from colibri.inspector.corpus import QtCorpusView  # noqa: E402
from colibri.inspector.main_window import ENV_SETTINGS  # noqa: E402
from colibri.profile import run_profile  # noqa: E402
from colibri.profile.results import CorpusProfile, compare  # noqa: E402
from colibri.profile.job import ProfileRequest  # noqa: E402

from profile_helpers import CORPUS, DEMO, request  # noqa: E402


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A: plain top-k; B: stable top-k with a large epsilon (it moves real decisions)."""
    base = tmp_path_factory.mktemp("corpus-view")
    run_profile(request(base / "a", max_tokens=2500))
    run_profile(request(base / "b", max_tokens=2500, routing="stable", epsilon=1e-2))
    return base / "a", base / "b"


@pytest.fixture
def view(qtbot, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> QtCorpusView:
    monkeypatch.setenv(ENV_SETTINGS, str(tmp_path / "settings"))
    w = QtCorpusView()
    qtbot.addWidget(w)
    w.resize(1400, 800)
    w.show()
    yield w
    w.shutdown()


def _open(qtbot, view: QtCorpusView, directory: Path, which: str = "A") -> None:
    with qtbot.waitSignal(view.sig_profile_loaded, timeout=30000) as blocker:
        view.open_profile(str(directory), which)
    assert blocker.args == [which, str(directory)]


def test_the_view_draws_the_profiles_numbers(qtbot, view: QtCorpusView,
                                             profiles: tuple[Path, Path]) -> None:
    _open(qtbot, view, profiles[0])
    p = CorpusProfile.open(profiles[0])
    drawn = view.values()
    np.testing.assert_array_equal(drawn["load"], p.load_share)
    np.testing.assert_array_equal(drawn["coselection"], p.coselection[0])
    with np.errstate(divide="ignore"):
        lift = np.clip(np.log2(p.class_lift[0]), -4, 4)
    np.testing.assert_array_equal(drawn["classes"], lift)
    np.testing.assert_array_equal(drawn["margins"]["A"], p.ulp_hist[0] / p.ulp_hist[0].sum())
    assert sorted(drawn["flips"]) == sorted(p.variants) == ["act-bf16", "noise1"]
    np.testing.assert_array_equal(drawn["flips"]["act-bf16"], p.flip_rate("act-bf16")[0])
    view.layer.setCurrentIndex(2)
    view.unit.setCurrentIndex(1)
    drawn = view.values()
    np.testing.assert_array_equal(drawn["coselection"], p.coselection[2])
    np.testing.assert_array_equal(drawn["margins"]["A"], p.abs_hist[2] / p.abs_hist[2].sum())


def test_clicking_an_expert_lists_its_tokens_and_contexts(qtbot, view: QtCorpusView,
                                                          profiles: tuple[Path, Path]) -> None:
    _open(qtbot, view, profiles[0])
    p = CorpusProfile.open(profiles[0])
    layer_index, expert = 3, int(p.load_share[3].argmax())
    heatmap = view.load
    scene = heatmap.plot.vb.mapViewToScene(QPointF(expert + 0.5, layer_index + 0.5))
    at = heatmap.graphics.mapFromScene(scene)
    with qtbot.waitSignal(view.sig_expert_selected, timeout=5000) as blocker:
        qtbot.mouseClick(heatmap.graphics.viewport(), Qt.MouseButton.LeftButton, pos=at)
    assert blocker.args == [p.layers[layer_index], expert]
    assert view.layer.currentIndex() == layer_index
    rows = p.top_tokens(layer_index, expert)
    table = view.detail.tokens
    assert table.rowCount() == len(rows) > 0
    assert [int(table.item(r, 2).data(Qt.ItemDataRole.UserRole)) for r in range(len(rows))] == [
        r.count for r in rows]
    examples = p.examples(layer_index, expert)
    assert view.detail.examples.rowCount() == len(examples) > 0
    first = view.detail.examples.item(0, 2).text()
    assert f"\u27e8{examples[0].token.replace(chr(10), chr(0x21b5))}\u27e9" in first


def test_two_profiles_show_as_differences(qtbot, view: QtCorpusView,
                                          profiles: tuple[Path, Path]) -> None:
    _open(qtbot, view, profiles[0])
    _open(qtbot, view, profiles[1], "B")
    a, b = CorpusProfile.open(profiles[0]), CorpusProfile.open(profiles[1])
    diff = compare(a, b)
    assert view.current_mode() == "B - A"
    drawn = view.values()
    np.testing.assert_array_equal(drawn["load"], b.load_share - a.load_share)
    assert np.abs(drawn["load"]).max() > 0          # the epsilon moved real decisions
    np.testing.assert_array_equal(drawn["coselection"], diff.coselection[0])
    np.testing.assert_array_equal(drawn["margins"]["B - A"], diff.ulp_fraction[0])
    view.mode.setCurrentIndex(1)                     # B on its own
    np.testing.assert_array_equal(view.values()["load"], b.load_share)
    view.clear_comparison()
    assert view.current_mode() == "A" and view.profiles["B"] is None


def test_profiles_of_different_models_are_not_compared(qtbot, view: QtCorpusView,
                                                       profiles: tuple[Path, Path],
                                                       tiny_model_path, tmp_path: Path) -> None:
    small = tmp_path / "small"
    run_profile(ProfileRequest(str(tiny_model_path()), str(CORPUS), str(small), window=64,
                               max_tokens=300, workers=1, jitter_variants=()))
    _open(qtbot, view, profiles[0])
    with qtbot.waitSignal(view.sig_failed, timeout=30000):
        view.open_profile(str(small), "B")
    assert "cannot compare" in view.status.text()
    assert view.profiles["B"] is None


def test_a_directory_that_is_no_profile_says_why(qtbot, view: QtCorpusView,
                                                 tmp_path: Path) -> None:
    with qtbot.waitSignal(view.sig_failed, timeout=30000):
        view.open_profile(str(tmp_path), "A")
    assert "not a finished profile (summary.json missing" in view.status.text()


def test_screenshot_of_the_corpus_view(qtbot, profiles: tuple[Path, Path], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SETTINGS, str(tmp_path / "settings"))
    out = tmp_path / "corpus.png"
    assert inspector_app.main([str(DEMO), "--profile", str(profiles[0]), "--compare",
                               str(profiles[1]), "--view", "corpus", "--screenshot",
                               str(out)]) == 0
    image = QImage(str(out))
    assert image.size().toTuple() == inspector_app.SCREENSHOT_SIZE
