"""Saved debugging sessions reopen identical; autosave; broken files are refused clearly."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.debugging import Debugger, ExpertChosen, MarginBelow, RunSettings, session_file
from colibri.debugging.session_file import (Autosaver, SavedSession, SessionFormatError,
                                            load_session, model_checksum, save_session)
from colibri.engine import ABI_VERSION, BLOCK_ORDER_ABI, Model, best_kernels

from dbg_helpers import PROMPT, drop_arrays, rewrite_session


def test_saved_session_reopens_identical(model: Model, tmp_path: Path) -> None:
    settings = RunSettings(PROMPT, 6, decoding="sample", seed=5, temperature=0.8,
                           routing="stable", epsilon=1e-3, threads=2)
    dbg = Debugger(model, settings)
    dbg.breakpoints.add(ExpertChosen(3, layer=2))
    dbg.breakpoints.add(MarginBelow(0.25, enabled=False))
    dbg.run(max_positions=4)
    dbg.events.toggle_bookmark(3)
    dbg.go_to(5)
    path = tmp_path / "run.colibri-session"
    saved = save_session(path, dbg)
    loaded = load_session(path)
    assert loaded == saved
    assert loaded.settings == settings
    for name, array in dbg.record.arrays().items():
        other = loaded.record.arrays()[name]
        assert other.dtype == array.dtype and other.tobytes() == array.tobytes(), name
    assert loaded.record.token_texts == dbg.record.token_texts
    assert loaded.cursor == 5 and loaded.bookmarks == [3]
    assert list(loaded.breakpoints) == list(dbg.breakpoints)
    assert loaded.model["sha256"] == model_checksum(model.path)
    assert loaded.model_matches(model.path)
    ev = loaded.events()
    assert len(ev) == len(dbg.events) and ev[5] == dbg.events[5] and ev.bookmarks == {3}
    # the sampler state was saved: a fresh debugger restored to it would continue identically
    assert loaded.rng_state == SavedSession.from_debugger(dbg).rng_state
    with zipfile.ZipFile(path) as z:
        assert "manifest.json" in z.namelist() and "arrays/router_logits.npy" in z.namelist()


def test_session_records_the_kernel_path_it_ran_on(model: Model, tmp_path: Path) -> None:
    """The last bits of every product depend on the kernel path, so a saved session says which
    ran, and says so when a new run here would use another one."""
    dbg = Debugger(model, RunSettings(PROMPT, 2, kernels="portable"))
    dbg.run()
    assert dbg.kernels == "portable"
    path = tmp_path / "portable.colibri-session"
    save_session(path, dbg)
    loaded = load_session(path)
    assert loaded.kernels == "portable" and loaded.settings.kernels == "portable"
    assert loaded.kernels_note() == ""  # the settings ask for the same path again
    best = Debugger(model, RunSettings(PROMPT, 2))
    assert best.kernels == best_kernels()
    other = dataclasses.replace(loaded, settings=dataclasses.replace(loaded.settings, kernels=None))
    assert (other.kernels_note() == "") == (best_kernels() == "portable")


def _rewritten(path: Path, into: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the session file at `path` whose manifest `edit` (dict -> None) changed."""
    import json

    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    edit(manifest)
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(into, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    return into


def test_session_records_the_engine_abi(model: Model, tmp_path: Path) -> None:
    """Quantised products changed bits at ABI 13 (block order), so a session says which engine
    recorded it; one from an older engine still opens, and says what cannot be reproduced when
    its model had q8_0/q4_0 weights or the file does not say."""
    dbg = Debugger(model, RunSettings(PROMPT, 2))
    dbg.run()
    path = tmp_path / "now.colibri-session"
    save_session(path, dbg)
    loaded = load_session(path)
    assert loaded.engine_abi == ABI_VERSION >= BLOCK_ORDER_ABI and loaded.engine_note() == ""
    assert loaded.model["quantised"] is False  # the test model's weights are float

    def older(manifest: dict) -> None:
        del manifest["engine_abi"], manifest["model"]["quantised"]

    old = load_session(_rewritten(path, tmp_path / "old.colibri-session", older))
    assert old.engine_abi == 0 and old.record.equals(loaded.record)
    assert "older than ABI 13" in old.engine_note() and "block order" in old.engine_note()
    quantised = dataclasses.replace(old, model={**old.model, "quantised": True})
    assert "its q8_0/q4_0 products" in quantised.engine_note()
    floats = dataclasses.replace(old, model={**old.model, "quantised": False})
    assert floats.engine_note() == ""  # float products did not change


def test_a_kernel_path_the_machine_lacks_is_refused(model: Model,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLIBRI_KERNELS", "portable")  # as on a machine with no SIMD path
    with pytest.raises(ValueError, match="no avx2 kernels"):
        Debugger(model, RunSettings(PROMPT, 1, kernels="avx2"))


def test_autosave_during_a_run(model: Model, tmp_path: Path) -> None:
    """With positions that take a second each and saves that take no time on the clock."""
    path = tmp_path / "auto.colibri-session"
    dbg = Debugger(model, RunSettings(PROMPT, 8))
    now = [0.0]
    saver = Autosaver(path, every_positions=3, every_seconds=1e9, clock=lambda: now[0])
    sizes = []

    def on_position(position: int) -> None:
        now[0] += 1.0
        if saver.notify(dbg):
            sizes.append(load_session(path).record.n_positions)

    dbg.run(on_position=on_position)
    saver.flush(dbg)
    # the 5-token prompt lands as one piece (one prefill), then every third generated position
    assert sizes == [5, 8, 11]
    final = load_session(path)
    assert final.record.equals(dbg.record) and final.finished
    assert not list(tmp_path.glob(".colibri-*.tmp"))  # no temp files left behind


def test_autosave_never_waits_for_the_models_checksum(model: Model, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A large model takes seconds to hash: an autosave writes without the checksum until a
    background thread has it, and with it after."""
    monkeypatch.setattr(session_file, "_checksums", {})
    monkeypatch.setattr(session_file, "_hashing", set())
    path = tmp_path / "auto.colibri-session"
    dbg = Debugger(model, RunSettings(PROMPT, 4))
    saver = Autosaver(path)
    hashed = threading.Event()
    real_checksum = session_file.model_checksum

    def slow_checksum(p):  # type: ignore[no-untyped-def]
        assert threading.current_thread().name == "colibri-model-checksum"
        hashed.wait(30)  # held until the first save is written
        return real_checksum(p)

    monkeypatch.setattr(session_file, "model_checksum", slow_checksum)
    dbg.run(max_positions=5)
    saver.flush(dbg)
    first = load_session(path)
    assert first.model["sha256"] is None and first.model_matches(model.path)
    hashed.set()
    deadline = time.monotonic() + 30
    while session_file.checksum_when_ready(model.path) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    dbg.run()
    saver.flush(dbg)
    expected = hashlib.sha256(Path(model.path).read_bytes()).hexdigest()
    assert load_session(path).model["sha256"] == expected


def test_a_model_file_the_checksum_thread_cannot_read_matches_no_session(
        model: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.colibri-session"
    dbg = Debugger(model, RunSettings(PROMPT, 2))
    dbg.run()
    saved = save_session(path, dbg)    # with the checksum
    monkeypatch.setattr(session_file, "_checksums", {})
    monkeypatch.setattr(session_file, "_hashing", set())

    def unreadable(_path):  # type: ignore[no-untyped-def]
        raise PermissionError("not allowed")

    monkeypatch.setattr(session_file, "model_checksum", unreadable)
    verdicts = [saved.model_matches(model.path, wait=False)]
    deadline = time.monotonic() + 30
    while verdicts[-1] is None and time.monotonic() < deadline:
        time.sleep(0.01)
        verdicts.append(saved.model_matches(model.path, wait=False))
    assert verdicts[0] is None and verdicts[-1] is False
    assert session_file.checksum_when_ready(model.path) == session_file.UNREADABLE


def test_autosave_keeps_its_share_of_the_run_small(model: Model, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves that take as long as two positions: the next waits until the run has gone on
    twenty times as long (max_share 0.05), whatever every_positions asks."""
    path = tmp_path / "auto.colibri-session"
    dbg = Debugger(model, RunSettings(PROMPT, 60))
    now = [0.0]
    real_save = session_file.save_session

    def slow_save(*args, **kw):  # type: ignore[no-untyped-def]
        now[0] += 1.0
        return real_save(*args, **kw)

    monkeypatch.setattr(session_file, "save_session", slow_save)
    saver = Autosaver(path, every_positions=1, every_seconds=1e9, clock=lambda: now[0])
    saved_at: list[tuple[int, float]] = []

    def on_position(position: int) -> None:
        now[0] += 0.5
        if saver.notify(dbg):
            saved_at.append((load_session(path).record.n_positions, now[0]))

    dbg.run(on_position=on_position)
    # the prompt's piece, then once 20 s have gone by since that save ended (40 positions on)
    assert [p for p, _ in saved_at] == [5, 41]
    assert saved_at[1][1] - saved_at[0][1] >= 20 * 1.0
    saver.flush(dbg)
    assert load_session(path).record.equals(dbg.record) and saver.saves == 3


def test_broken_session_files(tmp_path: Path, model: Model) -> None:
    junk = tmp_path / "junk.colibri-session"
    junk.write_bytes(b"not a zip")
    with pytest.raises(SessionFormatError, match="not a session file"):
        load_session(junk)
    dbg = Debugger(model, RunSettings(PROMPT, 1))
    dbg.run()
    good = tmp_path / "good.colibri-session"
    save_session(good, dbg)
    bad = rewrite_session(good, tmp_path / "future.colibri-session",
                          lambda manifest, _members: manifest.update(version=99))
    with pytest.raises(SessionFormatError, match="version 99"):
        load_session(bad)
    assert np.isnan(load_session(good).record.shared_gate).sum() == 0


def test_a_session_saved_before_format_version_2_still_opens(model: Model, tmp_path: Path) -> None:
    """Files written before selection scores, kept groups, bias flags and group limits existed:
    their models ranked the logits with no groups, so the record reads them that way and every
    derived margin is what it was."""
    dbg = Debugger(model, RunSettings(PROMPT, 3))
    dbg.run()
    new = tmp_path / "new.colibri-session"
    save_session(new, dbg)

    def version_1(manifest: dict[str, Any], members: dict[str, bytes]) -> None:
        drop_arrays(manifest, members, "selection_scores", "chosen_groups", "bias_changed")
        del manifest["model"]["group_limits"]

    loaded = load_session(rewrite_session(new, tmp_path / "old.colibri-session", version_1))
    assert loaded.record.selection_scores.tobytes() == dbg.record.router_logits.tobytes()
    assert loaded.record.chosen_groups.shape[2] == 0 and not loaded.record.bias_changed.any()
    ev = loaded.events()
    assert ev.margins.tobytes() == dbg.events.margins.tobytes()
