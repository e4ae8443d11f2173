"""Opening a file in the Inspector reads it once: `load_state` opens and validates it in one pass
of the engine (Model.open), keeps every finding, and takes the header and the hexdump's regions
from that open model instead of reading and decoding the file again."""

from __future__ import annotations

import builtins
import struct
from pathlib import Path
from typing import Any

import pytest

from colibri import fileformat as ff
from colibri.engine import Model, validate
from colibri.inspection import document
from colibri.inspection.document import load_state
from corrupt_files import corrupt_cases


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count Model.open calls and Python-level opens of any file, by path."""
    counts: dict[str, int] = {}
    real_open, real_model_open = builtins.open, Model.open.__func__  # type: ignore[attr-defined]

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        counts[f"read {Path(file).name}"] = counts.get(f"read {Path(file).name}", 0) + 1
        return real_open(file, *args, **kwargs)

    def counting_model_open(cls: type[Model], path: Any) -> Model:
        counts[f"Model.open {Path(path).name}"] = counts.get(f"Model.open {Path(path).name}", 0) + 1
        return real_model_open(cls, path)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(document.Model, "open", classmethod(counting_model_open))
    return counts


def test_a_valid_file_is_opened_once_and_never_read_again(tiny_model_path, opens) -> None:
    path = Path(tiny_model_path())
    state = load_state(path)
    regions = document.ModelDocument(path, state).regions()
    assert opens == {f"Model.open {path.name}": 1}
    assert state.model is not None and state.problems == []
    assert state.head == path.read_bytes()[:document.HEAD_BYTES]
    assert [f.name for f in state.header_fields] == [f.name for f in
                                                    state.model.header_fields()]
    assert {r.kind for r in regions} >= {"header", "routing", "tensor_table", "tokenizer",
                                         "metadata", "tensor"}


def test_a_broken_file_is_opened_once_and_its_head_read_once(tiny_image, tmp_path, opens) -> None:
    case = next(c for c in corrupt_cases(tiny_image()) if c.name == "misaligned")
    path = tmp_path / "broken.colibri"
    path.write_bytes(case.data)
    opens.clear()
    state = load_state(path)
    assert opens == {"Model.open broken.colibri": 1, "read broken.colibri": 1}
    assert state.model is None and state.problems == validate(path)
    assert state.header_fields[0].name == "magic" and state.head == case.data[:len(state.head)]


def test_the_warnings_of_a_file_that_opens_are_its_problems(tiny_image, tmp_path) -> None:
    image = tiny_image("qwen2_moe")          # "output" renamed and the embeddings marked tied:
    n_tensors, = struct.unpack_from("<I", image, 0x14)  # the file opens with one warning
    table, = struct.unpack_from("<Q", image, 0x28)
    entry = table + (n_tensors - 1) * ff.TENSOR_ENTRY_SIZE
    image[entry:entry + 64] = b"output_extra".ljust(64, b"\0")
    flags, = struct.unpack_from("<I", image, 0x5C)
    struct.pack_into("<I", image, 0x5C, flags | ff.FLAG_TIED_EMBEDDINGS)
    ff.refresh_checksums(image)
    path = tmp_path / "warned.colibri"
    path.write_bytes(bytes(image))
    state = load_state(path)
    assert state.model is not None and state.problems == validate(path)
    assert [(p.code_name, p.severity) for p in state.problems] == [("COL_ERR_UNKNOWN_TENSOR",
                                                                    "warning")]
    assert document.ModelDocument(path, state).status == "warnings"
