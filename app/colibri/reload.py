"""Hot reload: swap a model file for a new version between tokens, without restarting.

The inference-server recipe: a new model is written next to the old one and renamed over it
(atomic replace), then the server is told with SIGUSR1. `HotModel` holds the current `Model` for a
long-running loop (the CLI's `run` and `serve`, the Inspector's worker). Asking for a reload is
cheap and safe from anywhere, including a signal handler (`request()` only sets a flag); the
loop calls `poll()` between tokens, which reopens the path, validates it (`Model.open` runs every
structural check) and returns the new model, or keeps the old one and records why when the new
file is broken. `poll()` also notices, with two system calls, a replace nobody signalled, and a
file truncated or rewritten in place (then the old mapping must not be read again: the reload is
mandatory and a broken replacement is an error). A replacement it refused is not reopened at
every poll: only once the path names another file, or on the next request.

`session_swapper(hot, new_session, report)` is the hand-over hook of `Session.generate` (its
`swap`): between tokens it polls `hot` and, when a new model came, returns a new session on it
that has processed the tokens so far again, so the generation goes on on the new file.

Lifetimes: the loop builds a new `Session` on the new model and drops the old one. A session
still running on the old model (another thread) finishes its current step on the old mapping;
the mapping is unmapped only when the last session and view of it are gone (each `Session` and
every numpy view holds its model's handle, see engine.py). Nothing here frees anything early.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from colibri import errors
from colibri.engine import Model, Session
from colibri.generation import History, SwapFn, replay


class HotModel:
    """The current model of `path`, replaced by `poll()` when a reload is due."""

    def __init__(self, path: str | os.PathLike[str], model: Model | None = None) -> None:
        self.path = os.fspath(path)
        self.model = model if model is not None else Model.open(self.path)
        self.generation = 0                  # how many times a new model was swapped in
        self.last_error: str | None = None   # why the last reload was refused
        # The file last refused (stat identity): an unsignalled replace is not reopened again
        # until the path names another file, or a request asks for it.
        self._refused: tuple[int, ...] | None = None
        # A plain attribute, not a threading.Event: Python runs signal handlers in the main
        # thread between bytecodes, and an Event's set() takes a lock that the interrupted
        # frame may hold (clear() in poll), which deadlocks. Assignment needs no lock.
        self._requested = False

    def request(self) -> None:
        """Ask for a reload at the next `poll()` (safe from a signal handler or any thread)."""
        self._requested = True

    @property
    def pending(self) -> bool:
        return self._requested

    def poll(self) -> Model | None:
        """Between tokens: the new model when one was swapped in, else None. Raises
        ColibriFileChangedError when the current file changed in place and the path holds no
        valid replacement (the old mapping can no longer be trusted)."""
        must = False
        try:
            if self.model.check_file() and self._identity() != self._refused:
                self._requested = True       # replaced without a signal: take it too
        except errors.ColibriFileChangedError:
            must = True
        if not (must or self._requested):
            return None
        self._requested = False  # a request arriving after this is served by the open below
        identity = self._identity()
        try:
            new = Model.open(self.path)
        except errors.ColibriError as exc:
            self.last_error = str(exc)
            self._refused = identity
            if must:
                raise errors.ColibriFileChangedError(
                    f"{self.path} changed while mapped and cannot be reopened: {exc}",
                    errors.COL_ERR_FILE_CHANGED) from exc
            return None
        self.model = new
        self.generation += 1
        self.last_error = None
        self._refused = None
        return new

    def _identity(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def on_sigusr1(hot: HotModel) -> Callable[[], None]:
    """Make SIGUSR1 request a reload of `hot` (main thread only, as Python requires). Returns a
    function restoring the previous handler. A no-op returning a no-op where SIGUSR1 does not
    exist."""
    if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(_signum: int, _frame: FrameType | None) -> None:
        hot.request()

    previous = signal.signal(signal.SIGUSR1, handler)
    return lambda: signal.signal(signal.SIGUSR1, previous)


def session_swapper(hot: HotModel, new_session: Callable[[Model], Session],
                    report: Callable[[str], None]) -> SwapFn:
    """A `swap` hook for Session.generate: between tokens, when `hot` has a new model (SIGUSR1,
    or the file replaced or rewritten), a session made by `new_session` on it that has processed
    `history` again (the old one is closed), else None. `changed` says the old mapping failed a
    step (FILE_CHANGED): a reload is then required, and poll() raises when none is possible.
    What happened goes to `report` (one line each)."""

    def swap(session: Session, history: History, changed: bool) -> Session | None:
        model = hot.poll()
        if model is None:
            if hot.last_error is not None:
                report(f"reload of {hot.path} refused, keeping the loaded model: "
                       f"{hot.last_error}")
                hot.last_error = None
            return None
        fresh = new_session(model)
        replay(fresh, history)
        session.close()
        report(f"reloaded {hot.path} (generation {hot.generation}) at position {len(history)}")
        return fresh

    return swap
