"""Datasets: the three formats read the same documents, and every bad dataset gets a clear error
naming the file and the record (never a traceback, never a partial profile)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from colibri.cli import main
from colibri.engine import Model
from colibri.profile.dataset import DatasetError, read_documents, tokenize

from profile_helpers import CORPUS, DEMO


def _texts() -> list[str]:
    return [json.loads(line)["text"] for line in CORPUS.read_text().splitlines()]


def test_jsonl_and_parquet_read_the_same_documents(tmp_path: Path) -> None:
    texts = _texts()
    pq.write_table(pa.table({"id": list(range(len(texts))), "body": texts}),
                   tmp_path / "c.parquet")
    from_parquet = [d.text for d in read_documents(str(tmp_path / "c.parquet"), field="body")]
    from_jsonl = [d.text for d in read_documents(str(CORPUS))]
    assert from_parquet == from_jsonl == texts
    (tmp_path / "one.txt").write_text(texts[0])
    assert [d.text for d in read_documents(str(tmp_path / "one.txt"))] == [texts[0]]


def test_windows_cut_each_document_and_never_span_two() -> None:
    model = Model.open(DEMO)
    tok = model.tokenizer
    corpus = tokenize(read_documents(str(CORPUS)), tok, 100, model.hparams.vocab_size,
                      str(CORPUS))
    texts = _texts()
    for i, text in enumerate(texts, start=1):
        ids = tok.encode(text).ids
        windows = [w for w in range(corpus.n_windows) if corpus.records[w] == i]
        assert len(windows) == (len(ids) + 99) // 100
        assert [int(corpus.starts[w]) for w in windows] == list(range(0, len(ids), 100))
        assert sum((corpus.window(w).tolist() for w in windows), []) == ids
    capped = tokenize(read_documents(str(CORPUS)), tok, 100, model.hparams.vocab_size,
                      str(CORPUS), max_tokens=250)
    assert capped.n_tokens == 250


def _profile(tmp_path: Path, dataset: Path, *extra: str) -> int:
    return main(["profile", str(DEMO), "--dataset", str(dataset), "--out",
                 str(tmp_path / "out"), "--workers", "1", *extra])


BAD_JSONL = [
    ('{"text": "fine"}\n{"body": "no text field"}\n', "record 2 (line 2): no field 'text'"),
    ('{"text": "fine"}\n\n{"text": null}\n', "record 2 (line 3): field 'text' is null"),
    ('{"text": 5}\n', "record 1 (line 1): field 'text' is a int, not text"),
    ('{"text": "fine"}\n["a list"]\n', "record 2 (line 2): a JSON list, not an object"),
    ('{"text": "fine"}\n{"text": "cut\n', "record 2 (line 2): not valid JSON"),
    ("", "empty, no JSON Lines records"),
    ('{"text": ""}\n{"text": ""}\n', "no text to profile (2 record(s), every one empty)"),
]


@pytest.mark.parametrize("content,message", BAD_JSONL)
def test_bad_json_lines_name_the_file_and_record(tmp_path: Path, content: str, message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert _profile(tmp_path, path) == 1
    err = capsys.readouterr().err
    assert f"{path}: {message}" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_bytes_that_are_not_utf8_name_the_record_and_offset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    assert _profile(tmp_path, path) == 1
    assert (f"{path}: record 2 (line 2): not UTF-8 at byte offset 28 (invalid continuation "
            "byte)") in capsys.readouterr().err
    text = tmp_path / "latin1.txt"
    text.write_bytes(b"line one\nna\xefve\n")
    with pytest.raises(DatasetError, match=r"latin1.txt: record 1 \(line 2\): not UTF-8 at byte "
                       r"offset 11"):
        list(read_documents(str(text)))
    blob = tmp_path / "blob.parquet"
    pq.write_table(pa.table({"text": pa.array([b"fine", b"\xff\xfe"], pa.binary())}), blob)
    with pytest.raises(DatasetError, match=r"blob.parquet: record 2: field 'text': not UTF-8 at "
                       r"byte offset 0"):
        list(read_documents(str(blob)))


def test_bad_parquet_datasets(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": ["a", "b"]}), path)
    with pytest.raises(DatasetError, match=r"c.parquet: no field 'text' in any record \(its "
                       r"columns: 'body'\)"):
        list(read_documents(str(path)))
    pq.write_table(pa.table({"text": ["a", None, "c"]}), path)
    with pytest.raises(DatasetError, match=r"c.parquet: record 2: field 'text' is null"):
        list(read_documents(str(path)))
    pq.write_table(pa.table({"text": [1, 2]}), path)
    with pytest.raises(DatasetError, match=r"c.parquet: field 'text' holds int64, not text"):
        list(read_documents(str(path)))
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    with pytest.raises(DatasetError, match=r"c.parquet: empty, no records"):
        list(read_documents(str(path)))
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    with pytest.raises(DatasetError, match=r"fake.parquet: not a readable Parquet file"):
        list(read_documents(str(tmp_path / "fake.parquet")))


def test_missing_and_empty_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _profile(tmp_path, tmp_path / "nowhere.txt") == 1
    assert f"{tmp_path / 'nowhere.txt'}: no such file" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_bytes(b"")
    assert _profile(tmp_path, tmp_path / "empty.txt") == 1
    assert "empty.txt: empty file, no text to profile" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text("x")
    assert _profile(tmp_path, tmp_path / "t.txt", "--field", "body") == 1
    assert "--field applies to JSON Lines and Parquet" in capsys.readouterr().err
