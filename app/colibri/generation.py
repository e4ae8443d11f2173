"""Generating tokens on a session: the one decoding loop of Colibri.

`Session.generate(prompt, max_new_tokens, ...)` runs a `Generation` to its end; a `Generation`
made directly can also be advanced one position at a time, paused and resumed. The CLI (`run`,
`serve`), the debugger, the jitter lab, `colibri bench` and tools/bench_tracing.py all run models
through it.

Positions. The prompt's tokens are processed first, in one prefill (or one step each with
`step_prompt=True`, or in pieces with `advance(limit)`, so a debugger can stop inside the
prompt; the bits are the same), then every generated token except the last one, whose logits
are never needed: a generation producing M tokens processes len(prompt) + M - 1 positions
(len(prompt) when M is 0). It continues from the session's current position (reset the session
first for a fresh run). A prompt may also be embedding rows, float32 [positions, d_model] fed
instead of looked-up tokens (`Session.prefill_embeddings`); its positions count as token -1 in
`tokens`.

Choosing: 'greedy' is the arg-max (lowest id on ties); 'sample' draws from
softmax(logits / temperature) with numpy's default_rng(seed) (temperature 0 is greedy). NaN
logits are never chosen.

Stopping: after `max_new_tokens` (reason 'finished'), after the `eos` token ('eos'; None never
stops there), when `stop(generated)` returns True ('stop'), or when `on_position` returns
`Control.STOP` or the owner calls `stop()` between positions ('stopped').
`on_position(generation, position)` runs after every processed position; returning
`Control.PAUSE` makes `run()` return with the generation resumable: `run()` again continues
bit-identically (the sampler's state lives here).

Session hand-over (hot reload): between positions `swap(session, history, changed)` may return
a new session that has processed `history` (the tokens so far, a `History`: `replay` processes
it, embedding rows included) on a new model; the generation continues on it. `changed` is True when the old mapping failed a step (the file changed in
place): the swap is then required, and without one the error propagates.

Layers and rewinding (what a debugger needs): `advance_layer()` runs one layer of the next
position at a time (the same bits as `advance()`; the session pauses between layers), and
`rewind(position)` takes the generation back to `position` processed positions: the session
forgets the rest (colibri.Session.truncate; its KV cache before stays), the tokens chosen after
it are dropped and the sampler's state is put back, so running again from there under other
interventions is the counterfactual of the same run.

Kept logits: `keep_logits=True` keeps each engine call's logit rows in `logits`, in memory;
`keep_logits=LogitFile(vocab)` keeps them in that file's pages instead (colibri.kept_logits: a
long run on a large vocabulary), as read-only views.

The loop is thin on purpose: per position it calls the engine once, takes an arg-max (or a
sample) and reads the clock twice (the call's wall time); nothing else runs unless a callback
asks for it. A greedy `run()` with nothing to call between positions (no `on_position`, `stop`
or `swap`, logits not kept) goes further: the engine takes the arg-max itself and runs up to
`ENGINE_RUN` steps a call (col_session_generate), the same positions, bits and tokens, without
the interpreter's per-token cost (about 0.1 ms a token, most of it the interpreter's code and
data read back from memory after a step's weights streamed through the caches).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.errors import ColibriFileChangedError
from colibri.kept_logits import LogitFile
from colibri.values import DECODINGS, DecodingName

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Session


# Steps of one engine call in a greedy run: the interpreter's cost once per this many tokens,
# and a KeyboardInterrupt or a `stop()` from a signal handler waits for at most this many steps.
ENGINE_RUN = 16


class Control(enum.Enum):
    """What `on_position` may return (None means CONTINUE)."""

    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


class History(tuple[int, ...]):
    """The positions a session has processed, as a swap hook gets them: token ids, -1 at the
    positions of an embedding prompt, whose rows are `embeddings` ([n, d_model] float32, the
    first n positions; None without one)."""

    embeddings: np.ndarray | None

    def __new__(cls, tokens: Sequence[int] = (), embeddings: np.ndarray | None = None
                ) -> History:
        self = super().__new__(cls, tokens)
        self.embeddings = embeddings
        return self


def replay(session: Session, history: Sequence[int]) -> None:
    """Process `history` on `session` (a fresh one taking over): a History's embedding rows
    first, then its token ids; a plain sequence is token ids."""
    rows = history.embeddings if isinstance(history, History) else None
    n = 0 if rows is None else min(len(rows), len(history))
    if n:
        assert rows is not None
        session.prefill_embeddings(rows[:n], all_logits=False)
    if len(history) > n:
        session.prefill(list(history[n:]), all_logits=False)


OnPosition = Callable[["Generation", int], "Control | None"]
StopFn = Callable[[Sequence[int]], bool]
SwapFn = Callable[["Session", History, bool], "Session | None"]


class Generation:
    """One decoding run on a session (see the module docstring). Not thread-safe: one thread
    runs it (a debugger's worker turns its own cross-thread requests into calls between
    positions)."""

    def __init__(self, session: Session, prompt: Sequence[int] | np.ndarray,
                 max_new_tokens: int = 16, *,
                 decoding: DecodingName = "greedy", temperature: float = 1.0, seed: int = 0,
                 eos: int | None = None, stop: StopFn | None = None, step_prompt: bool = False,
                 keep_logits: bool | LogitFile = False, swap: SwapFn | None = None) -> None:
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be 'greedy' or 'sample', got {decoding!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.session = session
        # an embedding prompt: its rows, and token -1 at each of its positions
        self.embeddings: np.ndarray | None = None
        if isinstance(prompt, np.ndarray) and prompt.ndim == 2:
            self.embeddings = prompt
            prompt = [-1] * prompt.shape[0]
        self.prompt = tuple(int(t) for t in prompt)
        if not self.prompt:
            raise ValueError("the prompt is empty")
        self.max_new_tokens = max_new_tokens
        self.greedy = decoding == "greedy" or temperature == 0
        self.temperature = temperature
        self.eos = eos
        self.stop_when = stop
        self.step_prompt = step_prompt
        self.swap = swap
        self.generated: list[int] = []
        # each engine call's rows; with a LogitFile, views of them in its file
        self.logits: list[np.ndarray] | None = [] if keep_logits else None
        self._logit_file = keep_logits if isinstance(keep_logits, LogitFile) else None
        self.last_logits: np.ndarray | None = None   # [vocab] of the last processed position
        self.positions = 0                            # processed by this generation
        self.finished = False
        self.reason = ""
        self.call_ns = 0       # wall time of the last engine call (engine and binding)
        self.prefill_ns = 0    # of the prompt's engine calls
        self._decode_from = 0  # clock when the first generated token was chosen
        self._decode_to = 0    # clock at the end
        self._rng = np.random.default_rng(seed)
        self._rng_states: list[dict[str, Any]] = []  # sampling: the state before each pick
        self._pending: int | None = None  # the generated token to process next
        self._layer_ns = 0  # wall time of the layers run of the position in progress

    # -- state ----------------------------------------------------------------------------------

    @property
    def tokens(self) -> list[int]:
        """The prompt followed by the generated tokens (-1 for embedding rows)."""
        return [*self.prompt, *self.generated]

    @property
    def rng_state(self) -> dict[str, Any]:
        """The sampler's random state (what a saved debugging session records)."""
        return dict(self._rng.bit_generator.state)

    @property
    def decode_ns(self) -> int:
        """Wall time from the end of the prompt to the end (or now): every position after the
        prompt, choosing and the loop included (pauses too)."""
        if not self._decode_from:
            return 0
        return (self._decode_to or time.perf_counter_ns()) - self._decode_from

    def stop(self) -> None:
        """End the generation now, with reason 'stopped' (between positions)."""
        if not self.finished:
            self._finish("stopped")

    # -- running --------------------------------------------------------------------------------

    def run(self, on_position: OnPosition | None = None) -> str:
        """Advance until finished, or until `on_position` returns PAUSE ('paused' is returned;
        call run() again to continue) or STOP. Returns the reason it returned. When one engine
        call processed several positions (a prefill), `on_position` runs for each of them
        before a PAUSE or STOP takes effect."""
        while not self.finished:
            if on_position is None and self._engine_may_run():
                self._engine_run()
                continue
            positions = self.advance()
            if on_position is None:
                continue
            controls = {on_position(self, p) for p in positions}
            if Control.STOP in controls:
                self.stop()
            elif Control.PAUSE in controls:
                return "paused"
        return self.reason

    def advance(self, limit: int | None = None) -> range:
        """Process the next positions: the prompt (all of it, its next token with step_prompt,
        or at most `limit` of its tokens), or the pending generated token. Returns the
        positions processed (empty once finished)."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if self.finished:
            return range(0)
        first = self.positions
        if first >= len(self.prompt):
            token = self._pending
            assert token is not None
            out = self._slot(first, 1) if self.swap is None else None  # a swap copies its row
            t0 = time.perf_counter_ns()
            if self.swap is None:
                logits = self.session.step(token, out=None if out is None else out[0])
            else:
                logits = self._swap_step(token)
            self.call_ns = time.perf_counter_ns() - t0
            return self._processed(first, 1, logits[None, :], in_file=out is not None)
        if limit is None:
            limit = 1 if self.step_prompt else len(self.prompt)
        chunk = self.prompt[first:first + limit]
        out = self._slot(first, len(chunk))
        t0 = time.perf_counter_ns()
        if self.embeddings is not None:
            rows = self.session.prefill_embeddings(self.embeddings[first:first + len(chunk)],
                                                   all_logits=self.logits is not None, out=out)
        elif len(chunk) == 1:
            rows = self.session.step(chunk[0], out=None if out is None else out[0])[None, :]
        else:
            rows = self.session.prefill(chunk, all_logits=self.logits is not None, out=out)
        self.call_ns = time.perf_counter_ns() - t0
        return self._processed(first, len(chunk), rows, in_file=out is not None)

    def _slot(self, first: int, n: int) -> np.ndarray | None:
        """Where the engine writes the logits of n positions from `first` when they are kept in
        a LogitFile (its pages, so they are written once); None otherwise."""
        return None if self._logit_file is None else self._logit_file.slot(first, n)

    def advance_layer(self) -> range:
        """Run the next layer of the next position, beginning the position first when none is in
        progress (the session pauses between layers: `session.layers_done`). Returns the
        position once its last layer has run (then as `advance`), else an empty range."""
        if self.finished:
            return range(0)
        first = self.positions
        t0 = time.perf_counter_ns()
        if self.session.layers_done is None:
            if self.embeddings is not None and first < len(self.prompt):
                self.session.begin_embedding(self.embeddings[first])
            else:
                self.session.begin_token(self.next_token)
            self._layer_ns = 0
        logits = self.session.step_layer()
        self._layer_ns += time.perf_counter_ns() - t0
        if logits is None:
            return range(0)
        self.call_ns = self._layer_ns
        return self._processed(first, 1, logits[None, :])

    def _engine_may_run(self) -> bool:
        """Whether the engine can run the next steps itself: greedy, past the prompt, and
        nothing that needs the interpreter between positions."""
        return (self.greedy and self._pending is not None and self.swap is None
                and self.stop_when is None and self.logits is None)

    def _engine_run(self) -> None:
        """Up to ENGINE_RUN greedy steps in one engine call, then the bookkeeping `advance`
        does after each. Steps that completed before an error are recorded as processed and the
        error propagates; when the error is the file's change, the last completed step's logits
        are lost with the undone step's (`last_logits` is None)."""
        assert self._pending is not None
        left = self.max_new_tokens - len(self.generated)
        chosen = np.empty(min(left, ENGINE_RUN), dtype=np.int32)
        first = self.positions
        start = self.session.position
        t0 = time.perf_counter_ns()
        logits_kept = True  # a step the file's change undid wrote over the session's logits
        try:
            self.session.greedy_steps(self._pending, chosen, self.eos)
        except ColibriFileChangedError:
            logits_kept = False
            raise
        finally:
            self.call_ns = time.perf_counter_ns() - t0
            done = self.session.position - start
            self.positions = first + done
            if done:
                self.last_logits = self.session.logits if logits_kept else None
            for token in chosen[:done]:
                self._accept(int(token))

    @property
    def next_token(self) -> int:
        """The token of the next position to process (a prompt token or the pending generated one)."""
        if self.finished:
            raise ValueError("the generation is finished")
        if self.positions < len(self.prompt):
            return self.prompt[self.positions]
        assert self._pending is not None
        return self._pending

    def _processed(self, first: int, n: int, rows: np.ndarray, in_file: bool = False) -> range:
        """Bookkeeping after the engine processed the n positions from `first`: their logits
        `rows` ([n, vocab], or the last row only; `in_file`: written into the LogitFile's slot
        already), the next token once past the prompt."""
        in_prompt = first < len(self.prompt)
        self.positions = first + n
        self.last_logits = rows[-1]
        if self.logits is not None:
            if self._logit_file is None:
                kept = rows
            elif in_file:   # the engine wrote them into the file
                kept = self._logit_file.sealed(rows)
            else:
                kept = self._logit_file.keep(first, rows)
            self.logits.append(kept)
        if in_prompt:
            self.prefill_ns += self.call_ns
            if self.positions == len(self.prompt):
                self._decode_from = time.perf_counter_ns()
                self._choose(rows[-1])
        else:
            self._choose(rows[-1])
        return range(first, self.positions)

    def rewind(self, position: int) -> None:
        """Go back to `position` processed positions (0 <= position <= positions): the session
        forgets the later ones (a position in progress too), the tokens chosen after them are
        dropped and the sampler's state is put back; `advance`/`run` continue from there and
        give what a run that never went further would have given."""
        if not 0 <= position <= self.positions:
            raise ValueError(f"cannot rewind to position {position}: {self.positions} processed")
        self.session.truncate(position)
        n_prompt = len(self.prompt)
        if self.logits is not None:  # the kept rows of the positions before, no copy
            kept, count = [], 0
            for rows in self.logits:
                if count >= position:
                    break
                kept.append(rows[:position - count])
                count += kept[-1].shape[0]
            self.logits = kept
            self.last_logits = kept[-1][-1] if kept else None
        else:
            self.last_logits = None
        self.positions = position
        self.finished, self.reason, self._pending, self._decode_to = False, "", None, 0
        if position < n_prompt:
            self._restore_rng(0)
            self.generated = []
            self._decode_from = 0
            return
        kept = position - n_prompt + 1          # tokens chosen after positions < position
        token = self.generated[kept - 1]
        self._restore_rng(kept)
        self.generated = self.generated[:kept - 1]
        self._accept(token)

    def _restore_rng(self, picks: int) -> None:
        """The sampler as it was after `picks` picks."""
        if picks < len(self._rng_states):
            self._rng.bit_generator.state = self._rng_states[picks]
            del self._rng_states[picks:]

    def _swap_step(self, token: int) -> np.ndarray:
        """One step, on a swapped-in session when the swap hook has one."""
        assert self.swap is not None
        history = History(self.tokens[:self.positions], self.embeddings)
        self.session = self.swap(self.session, history, False) or self.session
        try:
            return self.session.step(token)
        except ColibriFileChangedError:
            fresh = self.swap(self.session, history, True)
            if fresh is None:
                raise
            self.session = fresh
            return self.session.step(token)

    def _choose(self, logits: np.ndarray) -> None:
        """After the prompt or a generated token: pick the next token, or finish."""
        if self.max_new_tokens == 0:
            self._finish("finished")
            return
        if not self.greedy:
            self._rng_states.append(dict(self._rng.bit_generator.state))
        self._accept(self._pick(logits))

    def _accept(self, token: int) -> None:
        """Record the chosen `token`: finish, or make it the next position's."""
        generated = self.generated
        generated.append(token)
        if len(generated) >= self.max_new_tokens:
            self._finish("finished")
        elif token == self.eos:
            self._finish("eos")
        elif self.stop_when is not None and self.stop_when(self.generated):
            self._finish("stop")
        else:
            self._pending = token

    def _pick(self, logits: np.ndarray) -> int:
        if self.greedy:
            token = int(logits.argmax())
            best = float(logits[token])
            if best == best:  # argmax lands on the first NaN when there is one
                return token
            return int(np.argmax(np.nan_to_num(logits, nan=-np.inf)))
        if not np.isfinite(logits).all():
            logits = np.nan_to_num(logits, nan=-np.inf)
        z = logits.astype(np.float64) / self.temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        return int(self._rng.choice(p.size, p=p))

    def _finish(self, reason: str) -> None:
        self._decode_to = time.perf_counter_ns()
        self._pending = None
        self.finished = True
        self.reason = reason


__all__ = ["Control", "Generation", "History", "OnPosition", "StopFn", "SwapFn", "replay"]
