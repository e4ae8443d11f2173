"""Hot reload (colibri.reload, `colibri run` / `colibri serve` with SIGUSR1): a model file replaced
atomically is reopened, validated and swapped in between tokens; a broken replacement is refused
and the loaded model kept; sessions on the old model finish on the old mapping. The stress test
races thousands of reloads against running sessions (CI also runs it under ASan)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri import errors
from colibri.cli import main
from colibri.engine import Model, Session
from colibri.reload import HotModel, on_sigusr1

from tiny_models import TinyModel, live_copy, replace_with

CORPUS = Path(__file__).resolve().parent / "corpus"


def tokens_of(capsys: pytest.CaptureFixture[str], path: Path, prompt: str, n: int = 5) -> str:
    assert main(["run", str(path), "--tokens", prompt, "-n", str(n)]) == 0
    out = capsys.readouterr().out
    return next(l for l in out.splitlines() if l.startswith("tokens: "))


@pytest.fixture
def two_models(tiny_model: Callable[..., TinyModel], tmp_path: Path) -> tuple[Path, Path, Path]:
    """(live path, model A, model B): same shape, different weights."""
    a = tiny_model("mixtral", "f32", with_tokenizer=False, seed=1).path
    b = tiny_model("mixtral", "f32", with_tokenizer=False, seed=2).path
    return live_copy(a, tmp_path), a, b


def test_serve_reloads_on_sigusr1(two_models: tuple[Path, Path, Path],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    live, a, b = two_models
    want_a, want_b = tokens_of(capsys, a, "1,2,3"), tokens_of(capsys, b, "1,2,3")
    assert want_a != want_b
    proc = subprocess.Popen([sys.executable, "-m", "colibri.cli", "serve", str(live), "-n", "5"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None and proc.stdin is not None and proc.stdout is not None
        assert "serving" in proc.stderr.readline()

        def ask() -> str:
            proc.stdin.write("1,2,3\n")
            proc.stdin.flush()
            return proc.stdout.readline().strip()

        assert ask() == want_a
        replace_with(b, live)
        proc.send_signal(signal.SIGUSR1)
        assert ask() == want_b
        assert "reloaded" in proc.stderr.readline()
        replace_with(CORPUS / "bad_magic.colibri", live)     # a broken replacement: refused
        proc.send_signal(signal.SIGUSR1)
        assert ask() == want_b
        assert "refused" in proc.stderr.readline()
        proc.stdin.close()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()


def test_run_survives_truncation_by_reloading(two_models: tuple[Path, Path, Path]) -> None:
    live, a, b = two_models
    with Model.open(live) as model:
        hot = HotModel(live, model)
        session = Session(model, max_context=8)
        session.step(1)
        os.truncate(live, 1000)                    # changed in place, nothing valid there
        with pytest.raises(errors.ColibriFileChangedError):
            hot.poll()
        replace_with(b, live)                      # now a valid file: the reload is taken
        new = hot.poll()
        assert new is not None and hot.generation == 1


def test_reloads_racing_running_sessions(two_models: tuple[Path, Path, Path]) -> None:
    live, a, b = two_models
    reference = {}
    for path in (a, b):
        with Model.open(path) as m:
            reference[path] = Session(m, max_context=8).step(1)
    refs = list(reference.values())

    def matches(logits: np.ndarray) -> bool:
        return any(np.array_equal(logits, r) for r in refs)

    hot = HotModel(live)
    restore = on_sigusr1(hot)
    stop = threading.Event()
    failures: list[str] = []
    old_steps = [0]

    def replacer() -> None:
        i = 0
        while not stop.is_set():
            replace_with(b if i % 2 else a, live)
            if i % 3:
                os.kill(os.getpid(), signal.SIGUSR1)
            else:
                hot.request()
            i += 1
            time.sleep(0)  # let the main thread have the GIL on a busy machine

    def old_model_runner() -> None:
        # Keeps stepping on whatever model it grabbed while the main loop swaps them away.
        while not stop.is_set():
            session = Session(hot.model, max_context=8)
            for _ in range(4):
                session.reset()
                if not matches(session.step(1)):
                    failures.append("a session on an old model produced wrong logits")
                old_steps[0] += 1

    threads = [threading.Thread(target=replacer), threading.Thread(target=old_model_runner)]
    for t in threads:
        t.start()
    reloads = 0
    try:
        session = Session(hot.model, max_context=8)
        deadline = time.monotonic() + 240  # a stuck loop fails the test instead of hanging CI
        while reloads < 2000 and time.monotonic() < deadline:
            new = hot.poll()
            if new is not None:
                session = Session(new, max_context=8)  # the old session and model just go
                reloads += 1
            session.reset()
            if not matches(session.step(1)):
                failures.append("wrong logits after a reload")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        restore()
    assert not failures, failures[:3]
    assert reloads == 2000 and hot.generation >= 2000 and old_steps[0] > 0


def test_a_refused_replacement_is_retried_only_when_asked_or_replaced(
        two_models: tuple[Path, Path, Path]) -> None:
    live, a, b = two_models
    hot = HotModel(live)
    replace_with(CORPUS / "bad_magic.colibri", live)
    assert hot.poll() is None and "COL_ERR_BAD_MAGIC" in (hot.last_error or "")  # unasked
    hot.last_error = None
    assert hot.poll() is None and hot.last_error is None    # the same file: not reopened
    hot.request()
    assert hot.poll() is None and hot.last_error is not None  # asked: tried again
    replace_with(b, live)
    assert hot.poll() is not None and hot.generation == 1    # another file: taken unasked
