"""The converter against hostile inputs: tests/corpus/convert/ holds config.json files and
.safetensors files found by fuzzing (tests/fuzz/fuzz_convert.py) or by the review that followed,
each with the ConversionError message it must produce (manifest.json). Before the fixes each of
them raised TypeError, ValueError, OverflowError or RecursionError, or hung."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from colibri import convert

CASES = Path(__file__).resolve().parent / "corpus" / "convert"
MANIFEST: list[dict[str, Any]] = json.loads((CASES / "manifest.json").read_text())


def test_every_case_is_listed_and_small() -> None:
    on_disk = {p.name for p in CASES.iterdir() if p.name != "manifest.json"}
    assert on_disk == {m["file"] for m in MANIFEST}
    assert all((CASES / name).stat().st_size <= 64 * 1024 for name in on_disk)


@pytest.mark.parametrize("m", MANIFEST, ids=[m["file"] for m in MANIFEST])
def test_hostile_input_gives_a_conversion_error(m: dict[str, Any], tmp_path: Path) -> None:
    if m["kind"] == "config":
        shutil.copyfile(CASES / m["file"], tmp_path / "config.json")
        with pytest.raises(convert.ConversionError) as info:
            convert.convert(tmp_path, tmp_path / "out.colibri")
    else:
        with pytest.raises(convert.ConversionError) as info:
            convert.read_safetensors_header(str(CASES / m["file"]))
    assert m["message"] in str(info.value)
    assert not (tmp_path / "out.colibri").exists()
