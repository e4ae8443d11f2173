"""Logits kept in a file (colibri.kept_logits.LogitFile): what a long Debugger run keeps of every
position lives in a file's pages, as read-only views with the engine's bits, through the file's
growth and a rewound run's rewrites."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from colibri.debugging.run import Debugger
from colibri.engine import Model, Session
from colibri.generation import Generation
from colibri.kept_logits import LogitFile
from colibri.values import RunSettings

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


def rows(first: int, n: int, vocab: int = 5) -> np.ndarray:
    return (np.arange(first * vocab, (first + n) * vocab, dtype=np.float32) / 7).reshape(n, vocab)


def test_kept_rows_read_back_and_cannot_be_written() -> None:
    store = LogitFile(5)
    view = store.keep(0, rows(0, 3))
    assert np.array_equal(view, rows(0, 3))
    with pytest.raises(ValueError):
        view[0, 0] = 1.0


def test_a_slot_is_written_in_place_and_sealed() -> None:
    store = LogitFile(5)
    slot = store.slot(2, 2)
    assert slot is not None
    slot[...] = rows(2, 2)
    sealed = store.sealed(slot)
    assert not sealed.flags.writeable and np.array_equal(sealed, rows(2, 2))
    assert np.array_equal(store.keep(0, rows(0, 2)), rows(0, 2))
    assert np.array_equal(sealed, rows(2, 2))


def test_views_stay_valid_as_the_file_grows() -> None:
    store = LogitFile(5, initial_rows=2)
    views = [store.keep(p, rows(p, 1)) for p in range(40)]
    assert store.capacity >= 40
    for p, view in enumerate(views):
        assert np.array_equal(view, rows(p, 1)), p


def test_a_rewound_run_writes_over_the_later_positions_only() -> None:
    store = LogitFile(5)
    early, late = store.keep(0, rows(0, 4)), store.keep(4, rows(4, 4))
    again = store.keep(4, -rows(4, 2))
    assert np.array_equal(early, rows(0, 4))
    assert np.array_equal(again, -rows(4, 2))
    assert np.array_equal(late[:2], -rows(4, 2))  # the old view sees the rewrite (documented)


def test_rows_of_another_width_are_refused() -> None:
    with pytest.raises(ValueError, match="expected rows of 5 logits"):
        LogitFile(5).keep(0, np.zeros((2, 4), np.float32))


def test_a_generation_keeps_the_engines_bits_in_the_file() -> None:
    """Through a prompt in pieces, steps and a rewind, the rows kept in the file are the rows a
    generation keeping them in memory has."""
    with Model.open(DEMO) as model, Session(model) as a, Session(model) as b:
        in_memory = Generation(a, PROMPT, 6, keep_logits=True)
        in_file = Generation(b, PROMPT, 6, keep_logits=LogitFile(model.hparams.vocab_size))
        for g in (in_memory, in_file):
            g.advance(3)
            g.run()
            g.rewind(5)
            g.run()
        assert in_memory.logits is not None and in_file.logits is not None
        want, got = np.concatenate(in_memory.logits), np.concatenate(in_file.logits)
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert all(not r.flags.writeable for r in in_file.logits)


def test_a_generation_writes_its_logits_into_the_file_once(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The engine writes each call's logits straight into the file's slot: the copy `keep`
    makes is never needed, in the prompt's pieces or in the steps after it."""
    def no_copy(self: LogitFile, first: int, rows: np.ndarray) -> np.ndarray:
        raise AssertionError("a copy into the file")

    monkeypatch.setattr(LogitFile, "keep", no_copy)
    with Model.open(DEMO) as model, Session(model) as a, Session(model) as b:
        in_file = Generation(a, PROMPT, 5, keep_logits=LogitFile(model.hparams.vocab_size))
        in_file.advance(3)
        in_file.run()
        assert in_file.logits is not None
        want = b.generate(PROMPT, 5, keep_logits=True).logits
        assert want is not None
        assert np.array_equal(np.concatenate(in_file.logits).view(np.uint32),
                              np.concatenate(want).view(np.uint32))


def test_the_debugger_keeps_its_logits_in_a_file() -> None:
    with Model.open(DEMO) as model:
        debugger = Debugger(model, RunSettings(prompt_tokens=tuple(PROMPT), max_new_tokens=4))
        try:
            debugger.run()
            kept = debugger.generation.logits
            assert kept and all(isinstance(r, np.memmap) and not r.flags.writeable for r in kept)
            assert sum(r.shape[0] for r in kept) == debugger.generation.positions
        finally:
            debugger.close()


def test_without_space_for_the_file_the_rows_stay_in_memory(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """A full disk refuses the file's growth (ENOSPC) before anything is mapped, so no write can
    meet a page the disk cannot hold (SIGBUS); the rows are kept in memory instead."""
    store = LogitFile(5, initial_rows=2)
    early = store.keep(0, rows(0, 2))

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("colibri.kept_logits.os.posix_fallocate", no_space)
    later = store.keep(2, rows(2, 3))
    assert store.in_memory and not isinstance(later, np.memmap) and not later.flags.writeable
    assert np.array_equal(later, rows(2, 3)) and np.array_equal(early, rows(0, 2))
