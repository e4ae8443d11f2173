"""Embedding input (col_session_prefill_embeddings, Session.prefill_embeddings): rows fed in
place of the token embedding lookup. The demo model's own table rows give the same bits as its
token ids; bad input is refused with its shape, dtype, row and element named, nothing processed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.errors import ColibriValueError

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
PROMPT = "def read_header(self, data):"


@pytest.fixture(scope="module")
def demo() -> Iterator[Model]:
    with Model.open(DEMO) as model:
        yield model


def rows(model: Model, ids: list[int]) -> np.ndarray:
    """The demo's own embedding rows of `ids`, as float32 (its table is f16)."""
    return np.ascontiguousarray(model.tensor_f32("token_embd")[ids])


def test_the_tables_rows_give_the_token_ids_bits(demo: Model) -> None:
    ids = list(demo.tokenizer.encode(PROMPT).ids)
    with Session(demo) as by_id, Session(demo) as by_row:
        want = by_id.prefill(ids)
        got = by_row.prefill_embeddings(rows(demo, ids))
        assert got.tobytes() == want.tobytes()
        tid, trow = by_id.trace, by_row.trace
        assert tid is not None and trow is not None
        assert np.array_equal(tid.expert_ids, trow.expert_ids)
        assert list(trow.tokens) == [-1] * len(ids)
        # then decoding goes on from either in the same bits
        next_id = int(want[-1].argmax())
        assert by_id.step(next_id).tobytes() == by_row.step(next_id).tobytes()


def test_one_row_at_a_time_and_the_last_logits_only(demo: Model) -> None:
    ids = list(demo.tokenizer.encode(PROMPT).ids)
    x = rows(demo, ids)
    with Session(demo) as whole, Session(demo) as stepped, Session(demo) as last:
        want = whole.prefill_embeddings(x)
        got = np.concatenate([stepped.prefill_embeddings(x[i:i + 1]) for i in range(len(ids))])
        assert got.tobytes() == want.tobytes()
        assert last.prefill_embeddings(x, all_logits=False).tobytes() == want[-1:].tobytes()


def test_other_rows_change_the_result(demo: Model) -> None:
    ids = list(demo.tokenizer.encode(PROMPT).ids)
    x = rows(demo, ids)
    x[2] *= 1.5
    with Session(demo) as a, Session(demo) as b:
        assert not np.array_equal(a.prefill(ids), b.prefill_embeddings(x))


@pytest.mark.parametrize("bad, words", [
    (np.zeros((3, 256), np.float64), "embeddings must be float32, got float64"),
    (np.zeros((3, 128), np.float32), r"embeddings of shape \[3, 128\], expected \[positions, 256\]"),
    (np.zeros(256, np.float32), r"embeddings of shape \[256\], expected \[positions, 256\]"),
])
def test_shape_and_dtype_are_named(demo: Model, bad: np.ndarray, words: str) -> None:
    with Session(demo) as s:
        with pytest.raises(ColibriValueError, match=words):
            s.prefill_embeddings(bad)
        assert s.position == 0


@pytest.mark.parametrize("value, name", [(np.nan, "NaN"), (np.inf, "infinite")])
def test_a_non_finite_element_is_named_by_row_and_element(demo: Model, value: float,
                                                          name: str) -> None:
    x = rows(demo, [5, 6, 7])
    x[1, 17] = value
    with Session(demo) as s:
        with pytest.raises(ColibriValueError, match=f"embedding row 1, element 17 is {name}"):
            s.prefill_embeddings(x)
        assert s.position == 0


def test_more_rows_than_the_context_holds(demo: Model) -> None:
    with Session(demo, max_context=4) as s:
        with pytest.raises(ColibriValueError, match="5 embeddings at position 0 exceed the context "
                                                    "of 4"):
            s.prefill_embeddings(rows(demo, [1, 2, 3, 4, 5]))
        assert s.position == 0
