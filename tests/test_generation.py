"""Session.generate and colibri.generation.Generation: the one decoding loop every tool uses
(positions, greedy and sampled choice, stop conditions, pause and stop, hot-reload hand-over)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.errors import ColibriError
from colibri.generation import ENGINE_RUN, Control, Generation, History, replay

from tiny_models import TinyModel

BuildPath = Callable[..., Path]
BuildModel = Callable[..., TinyModel]
PROMPT = [1, 3, 4]


def hand_loop(model: Model, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Greedy decoding written out with prefill and step: (generated ids, logits per position)."""
    with Session(model) as s:
        rows = [s.prefill(prompt)]
        generated: list[int] = []
        while len(generated) < n:
            token = int(np.argmax(rows[-1][-1]))
            generated.append(token)
            if len(generated) == n or token == model.hparams.eos_token_id:
                break
            rows.append(s.step(token)[None, :])
    return generated, np.concatenate(rows)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "olmoe"])
def test_greedy_generation_equals_prefill_and_steps(tiny_model_path: BuildPath, arch: str) -> None:
    with Model.open(tiny_model_path(arch)) as model, Session(model) as session:
        generated, logits = hand_loop(model, PROMPT, 6)
        g = session.generate(PROMPT, 6, keep_logits=True)
        assert g.generated == generated and g.reason == "finished"
        assert g.positions == session.position == len(PROMPT) + 6 - 1
        assert g.logits is not None and np.concatenate(g.logits).tobytes() == logits.tobytes()
        assert g.tokens == PROMPT + generated


def test_stepping_the_prompt_gives_the_same_bits(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path("qwen2_moe")) as model:
        with Session(model) as a, Session(model) as b:
            batch = a.generate(PROMPT, 5)
            steps = Generation(b, PROMPT, 5, eos=model.hparams.eos_token_id, step_prompt=True)
            advanced = [list(steps.advance()) for _ in range(len(PROMPT))]
            assert advanced == [[0], [1], [2]]
            steps.run()
            assert steps.generated == batch.generated
            for name in ("expert_ids", "expert_weights", "router_logits"):
                assert getattr(a.trace, name).tobytes() == getattr(b.trace, name).tobytes()


def test_the_prompt_in_pieces_gives_the_bits_of_one_prefill(tiny_model_path: BuildPath) -> None:
    prompt = [1, 3, 4, 5, 6, 7, 8]
    with Model.open(tiny_model_path("qwen2_moe")) as model:
        with Session(model) as a, Session(model) as b:
            whole = Generation(a, prompt, 3, keep_logits=True)
            whole.run()
            pieces = Generation(b, prompt, 3, keep_logits=True)
            advanced = [list(pieces.advance(limit)) for limit in (3, 1, 9)]
            assert advanced == [[0, 1, 2], [3], [4, 5, 6]]
            with pytest.raises(ValueError, match="limit must be at least 1"):
                pieces.advance(0)
            pieces.run()
            assert pieces.generated == whole.generated
            assert whole.logits is not None and pieces.logits is not None
            assert np.concatenate(pieces.logits).tobytes() == np.concatenate(whole.logits).tobytes()


def test_no_new_tokens_processes_the_prompt_only(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        g = session.generate(PROMPT, 0)
        assert (g.generated, g.positions, g.reason) == ([], len(PROMPT), "finished")
        assert g.last_logits is not None and g.last_logits.shape == (model.hparams.vocab_size,)


def test_eos_stops_after_it_and_none_never_stops(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        generated, _ = hand_loop(model, PROMPT, 6)
    with Model.open(tiny_model_path(eos_token_id=generated[0])) as model:
        with Session(model) as session:
            g = session.generate(PROMPT, 6)
            assert (g.generated, g.reason, g.positions) == ([generated[0]], "eos", len(PROMPT))
        with Session(model) as session:
            g = session.generate(PROMPT, 6, eos=None)
            assert len(g.generated) == 6 and g.reason == "finished"


def test_a_stop_callback_ends_the_generation(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        g = session.generate(PROMPT, 10, stop=lambda generated: len(generated) == 3)
        assert (len(g.generated), g.reason, g.positions) == (3, "stop", len(PROMPT) + 2)


def test_pausing_and_resuming_equals_an_uninterrupted_sampled_run(tiny_model_path: BuildPath
                                                                  ) -> None:
    with Model.open(tiny_model_path()) as model:
        with Session(model) as s:
            whole = s.generate(PROMPT, 12, decoding="sample", temperature=1.5, seed=7, eos=None)
        with Session(model) as s:
            seen: list[int] = []

            def pause_every_other(g: Generation, position: int) -> Control | None:
                seen.append(position)
                return Control.PAUSE if position % 2 else None

            g = s.generate(PROMPT, 12, decoding="sample", temperature=1.5, seed=7, eos=None,
                           step_prompt=True, on_position=pause_every_other)
            pauses = 0
            while not g.finished:
                assert g.run(pause_every_other) in ("paused", "finished")
                pauses += 1
        assert g.generated == whole.generated and pauses > 3
        assert seen == list(range(len(PROMPT) + 11))


def test_sampling_depends_on_the_seed_and_temperature_zero_is_greedy(tiny_model_path: BuildPath
                                                                     ) -> None:
    with Model.open(tiny_model_path()) as model:
        def run(**kw: object) -> list[int]:
            with Session(model) as s:
                return s.generate(PROMPT, 10, eos=None, **kw).generated  # type: ignore[arg-type]

        assert run(decoding="sample", seed=1, temperature=3.0) == run(decoding="sample", seed=1,
                                                                      temperature=3.0)
        assert run(decoding="sample", seed=1, temperature=3.0) != run(decoding="sample", seed=2,
                                                                      temperature=3.0)
        assert run(decoding="sample", temperature=0.0) == run()


def test_stop_from_the_position_callback_keeps_what_was_made(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        g = session.generate(PROMPT, 10, eos=None,
                             on_position=lambda g, p: Control.STOP if p == 5 else None)
        assert (g.reason, g.positions, len(g.generated)) == ("stopped", 6, 4)
        assert g.run() == "stopped" and g.positions == 6


def test_a_swapped_in_session_continues_the_generation(tiny_model_path: BuildPath) -> None:
    """The hot-reload hand-over: a new session that replays the history goes on bit-identically
    (same model here), and every later position runs on it."""
    with Model.open(tiny_model_path()) as model:
        generated, logits = hand_loop(model, PROMPT, 6)
        swaps: list[int] = []

        def swap(session: Session, history: History, changed: bool) -> Session | None:
            if len(history) != 5:
                return None
            fresh = Session(model)
            fresh.prefill(history, all_logits=False)
            session.close()
            swaps.append(len(history))
            return fresh

        first = Session(model)
        g = first.generate(PROMPT, 6, keep_logits=True, swap=swap)
        assert swaps == [5] and g.session is not first and first.closed
        assert g.generated == generated and g.session.position == g.positions
        assert g.logits is not None and np.concatenate(g.logits).tobytes() == logits.tobytes()


def embedding_rows(model: Model, ids: list[int]) -> np.ndarray:
    return np.ascontiguousarray(model.tensor_f32("token_embd")[ids])


@pytest.mark.parametrize("step_prompt", [False, True])
def test_an_embedding_prompt_generates_what_its_tokens_do(tiny_model_path: BuildPath,
                                                          step_prompt: bool) -> None:
    """Rows of the model's own table as the prompt: the same tokens, logits and routing as the
    ids, with -1 at the prompt's positions."""
    with Model.open(tiny_model_path()) as model, Session(model) as a, Session(model) as b:
        by_id = a.generate(PROMPT, 5, keep_logits=True)
        by_row = Generation(b, embedding_rows(model, PROMPT), 5, keep_logits=True,
                            step_prompt=step_prompt)
        by_row.run()
        assert by_row.generated == by_id.generated
        assert by_row.tokens == [-1] * len(PROMPT) + by_id.generated
        assert by_row.logits is not None and by_id.logits is not None
        assert np.concatenate(by_row.logits).tobytes() == np.concatenate(by_id.logits).tobytes()
        assert a.trace.expert_ids.tobytes() == b.trace.expert_ids.tobytes()


def test_a_swap_replays_the_embedding_prompt(tiny_model_path: BuildPath) -> None:
    """The hand-over gets a History whose replay feeds the rows, then the generated ids."""
    with Model.open(tiny_model_path()) as model:
        generated, logits = hand_loop(model, PROMPT, 6)
        seen: list[History] = []

        def swap(session: Session, history: History, changed: bool) -> Session | None:
            if len(history) != 5:
                return None
            seen.append(history)
            fresh = Session(model)
            replay(fresh, history)
            session.close()
            return fresh

        g = Generation(Session(model), embedding_rows(model, PROMPT), 6, keep_logits=True,
                       swap=swap)
        g.run()
        assert len(seen) == 1 and list(seen[0]) == [-1, -1, -1, *generated[:2]]
        assert seen[0].embeddings is not None and seen[0].embeddings.shape == (3, 32)
        assert g.generated == generated
        assert g.logits is not None and np.concatenate(g.logits).tobytes() == logits.tobytes()


def test_arguments_only_python_uses_are_checked_here(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        with pytest.raises(ValueError, match="empty"):
            session.generate([], 3)
        with pytest.raises(ValueError, match="max_new_tokens"):
            session.generate(PROMPT, -1)
        with pytest.raises(ValueError, match="decoding"):
            session.generate(PROMPT, 3, decoding="beam")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="temperature"):
            session.generate(PROMPT, 3, decoding="sample", temperature=-1.0)
        assert session.position == 0


def test_prefill_and_decode_times_are_kept_and_stop_at_the_end(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        g = session.generate(PROMPT, 5, eos=None)
        assert g.prefill_ns > 0 and g.decode_ns > 0 and g.call_ns > 0
        decode = g.decode_ns
        time.sleep(0.01)
        assert g.decode_ns == decode  # the clock stopped when the generation finished


def stepped(session: Session, prompt: list[int], n: int, eos: int | None) -> Generation:
    """A greedy generation advanced one position at a time (a callback between positions keeps
    the engine's own loop out of it)."""
    g = Generation(session, prompt, n, eos=eos)
    g.run(lambda _g, _p: None)
    return g


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_the_engines_greedy_loop_matches_stepping(tiny_model_path: BuildPath, arch: str) -> None:
    n = 2 * ENGINE_RUN + 3  # several engine runs and a short last one
    with Model.open(tiny_model_path(arch)) as model:
        with Session(model, threads=2) as a, Session(model, threads=2) as b:
            fast = a.generate(PROMPT, n, eos=None)
            slow = stepped(b, PROMPT, n, None)
            assert fast.generated == slow.generated and len(fast.generated) == n
            assert fast.positions == slow.positions == a.position == len(PROMPT) + n - 1
            assert fast.last_logits is not None and slow.last_logits is not None
            assert fast.last_logits.tobytes() == slow.last_logits.tobytes()
            for name in ("expert_ids", "expert_weights", "router_logits"):
                assert getattr(a.trace, name).tobytes() == getattr(b.trace, name).tobytes()


def test_the_engines_greedy_loop_stops_after_eos(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as s:
        whole = stepped(s, PROMPT, 12, None).generated
    eos = whole[5]
    with Model.open(tiny_model_path()) as model, Session(model) as s:
        g = s.generate(PROMPT, 12, eos=eos)
        cut = whole.index(eos) + 1
        assert (g.generated, g.reason) == (whole[:cut], "eos" if cut < 12 else "finished")
        assert g.positions == s.position == len(PROMPT) + cut - 1


def test_an_error_in_the_engines_loop_keeps_the_steps_before_it(tiny_model_path: BuildPath
                                                                ) -> None:
    context = len(PROMPT) + 5
    with Model.open(tiny_model_path()) as model:
        ends = []
        for run in ("engine", "stepped"):
            with Session(model, max_context=context) as s:
                g = Generation(s, PROMPT, 20, eos=None)
                with pytest.raises(ColibriError, match="exceed the context"):
                    g.run() if run == "engine" else g.run(lambda _g, _p: None)
                assert g.last_logits is not None
                ends.append((g.generated, g.positions, s.position, g.finished,
                             g.last_logits.tobytes()))
        assert ends[0] == ends[1]
        assert ends[0][1] == context and len(ends[0][0]) == 6


def test_a_greedy_run_without_callbacks_calls_the_engine_once_per_run_of_steps(
        tiny_model_path: BuildPath, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(name: str, method: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            calls.append(name)
            return method(*args, **kwargs)
        return call

    with Model.open(tiny_model_path()) as model, Session(model) as s:
        for name in ("step", "greedy_steps"):
            monkeypatch.setattr(s, name, counted(name, getattr(s, name)))
        s.generate(PROMPT, 2 * ENGINE_RUN + 3, eos=None)
        assert calls == ["greedy_steps"] * 3  # the prompt is one prefill; 2 * 16 + 2 steps
        calls.clear()
        s.reset()
        s.generate(PROMPT, 4, eos=None, decoding="sample")
        assert calls == ["step"] * 3
