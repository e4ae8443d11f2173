"""The corrupt-file corpus (tests/corpus/, built by tools/make_corpus.py; fuzzer findings in
tests/corpus/fuzz/): every file gives exactly the finding its manifest entry states, through
`colibri.validate`, `Model.open` and `colibri validate --json`. The same manifest drives the C
test engine_c/tests/test_corpus.c (via manifest.txt)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import colibri
from colibri import errors
from colibri.cli import main
from colibri.engine import Model, Problem, validate_bytes

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"
MANIFEST: list[dict[str, Any]] = json.loads((CORPUS / "manifest.json").read_text())
MAX_FILE = 64 * 1024

# Every col_status a file (as opposed to a caller or a running session) can produce.
FILE_CODES = {"COL_ERR_IO", "COL_ERR_TRUNCATED", "COL_ERR_BAD_MAGIC", "COL_ERR_BAD_VERSION",
              "COL_ERR_LIMIT", "COL_ERR_HEADER", "COL_ERR_SECTION_BOUNDS",
              "COL_ERR_TENSOR_BOUNDS", "COL_ERR_MISALIGNED", "COL_ERR_SIZE_MISMATCH",
              "COL_ERR_OVERLAP", "COL_ERR_MISSING_TENSOR", "COL_ERR_SHAPE", "COL_ERR_DTYPE",
              "COL_ERR_NAME", "COL_ERR_CHECKSUM", "COL_ERR_NONFINITE", "COL_ERR_UNSUPPORTED",
              "COL_ERR_ROUTING", "COL_ERR_UNKNOWN_TENSOR"}


def first_finding(problems: list[Problem]) -> Problem | None:
    errs = [p for p in problems if p.severity == "error"]
    return errs[0] if errs else (problems[0] if problems else None)


def test_every_file_error_class_is_in_the_corpus() -> None:
    assert FILE_CODES <= {m["code"] for m in MANIFEST}
    assert any(m["code"] == "COL_OK" for m in MANIFEST)


def test_manifest_txt_matches_manifest_json() -> None:
    lines = [l.split() for l in (CORPUS / "manifest.txt").read_text().splitlines()
             if l and not l.startswith("#")]
    assert [l[0] for l in lines] == [m["file"] for m in MANIFEST]
    for line, m in zip(lines, MANIFEST):
        flags = (1 if m["checksums"] else 0) | (2 if m["nan_check"] else 0)
        assert line[1:] == [str(flags), str(errors.COL_OK if m["code"] == "COL_OK" else
                                            _code(m["code"])), str(m["offset"])]


def test_corpus_files_are_small_and_listed() -> None:
    listed = {m["file"] for m in MANIFEST}
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
               if p.is_file() and p.suffix not in (".json", ".txt")
               and p.relative_to(CORPUS).parts[0] not in ("convert", "formats")}  # other tests
    assert on_disk == {m["file"] for m in MANIFEST if not m["absent"]}
    assert listed >= on_disk
    assert all((CORPUS / f).stat().st_size <= MAX_FILE for f in on_disk)


def _code(name: str) -> int:
    from colibri.engine import ffi
    return {v: k for k, v in ffi.typeof("col_status").elements.items()}[name]


@pytest.mark.parametrize("m", MANIFEST, ids=[m["file"] for m in MANIFEST])
def test_validate_reports_the_expected_finding(m: dict[str, Any]) -> None:
    path = CORPUS / m["file"]
    if m["absent"]:
        with pytest.raises(errors.ColibriIOError, match=m["message"]):
            colibri.validate(path)
        return
    problems = colibri.validate(path, checksums=m["checksums"], nan_check=m["nan_check"])
    got = first_finding(problems)
    if m["code"] == "COL_OK":
        assert problems == []
        return
    assert got is not None, f"{m['file']}: no finding"
    assert (got.code_name, got.severity, got.offset, got.tensor) == (
        m["code"], m["severity"], m["offset"], m["tensor"]), str(got)
    assert m["message"] in got.message
    # The in-memory validator agrees with the file one.
    if path.stat().st_size:
        again = validate_bytes(path.read_bytes(), checksums=m["checksums"],
                                       nan_check=m["nan_check"])
        assert again == problems


@pytest.mark.parametrize("m", MANIFEST, ids=[m["file"] for m in MANIFEST])
def test_model_open_refuses_structural_errors(m: dict[str, Any]) -> None:
    path = CORPUS / m["file"]
    structural = m["severity"] == "error" and not (m["checksums"] or m["nan_check"])
    if m["absent"]:
        with pytest.raises(errors.ColibriIOError):
            Model.open(path)
    elif structural:
        with pytest.raises(errors.ColibriFormatError) as info:
            Model.open(path)
        assert (info.value.code_name, info.value.offset) == (m["code"], m["offset"])
        assert m["message"] in info.value.message
    else:
        with Model.open(path) as model:  # data damage and warnings do not stop a model opening
            assert model.tensors


@pytest.mark.parametrize("m", MANIFEST, ids=[m["file"] for m in MANIFEST])
def test_cli_validate_json(m: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", str(CORPUS / m["file"]), "--json"]
    argv += ["--checksums"] if m["checksums"] else []
    argv += ["--nan-check"] if m["nan_check"] else []
    code = main(argv)
    doc = json.loads(capsys.readouterr().out)
    if m["absent"]:
        assert code == 2 and doc["valid"] is False
        return
    if doc.get("format") not in ("colibri", None):
        # Content decides the format: bad_magic.colibri is a GGUF file with a .colibri name, so
        # the CLI validates it as GGUF (tests/test_formats.py) and finds it invalid too.
        assert code == 1 and doc["valid"] is False and doc["problems"]
        return
    valid = m["code"] == "COL_OK" or m["severity"] == "warning"
    assert code == (0 if valid else 1) and doc["valid"] is valid
    if m["code"] != "COL_OK":
        found = [p for p in doc["problems"] if p["code_name"] == m["code"]
                 and p["offset"] == m["offset"] and m["message"] in p["message"]]
        assert found, doc["problems"]
