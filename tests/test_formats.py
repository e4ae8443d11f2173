"""GGUF and safetensors readers (colibri.formats) against the libraries that define the formats,
and the corpus of damaged files (tests/corpus/formats/, made by tools/make_format_corpus.py)
through the Python API and the CLI."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors import safe_open

from colibri import formats
from colibri.cli import main
from colibri.errors import ColibriFormatError, ColibriIOError
from colibri.formats import gguf_file, safetensors_file
from colibri.formats.gguf_file import GGUFFile
from colibri.formats.safetensors_file import Checkpoint

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus" / "formats"
MANIFEST: list[dict[str, Any]] = json.loads((CORPUS / "manifest.json").read_text())
FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
GGUF_FIXTURES = sorted(FIXTURES.glob("*.gguf"))


def first_finding(problems: list[Any]) -> Any:
    errs = [p for p in problems if p.severity == "error"]
    return errs[0] if errs else (problems[0] if problems else None)


# ---------------------------------------------------------------------------------------------
# GGUF against the gguf package


def all_types_file(path: Path) -> dict[str, Any]:
    """A GGUF file holding every metadata value type, nested arrays and several tensor types,
    written by the gguf package's own writer. Returns the metadata written."""
    w = gguf.GGUFWriter(str(path), "llama")
    values: dict[str, Any] = {
        "t.u8": (7, gguf.GGUFValueType.UINT8), "t.i8": (-7, gguf.GGUFValueType.INT8),
        "t.u16": (700, gguf.GGUFValueType.UINT16), "t.i16": (-700, gguf.GGUFValueType.INT16),
        "t.u32": (70000, gguf.GGUFValueType.UINT32), "t.i32": (-70000, gguf.GGUFValueType.INT32),
        "t.f32": (1.5, gguf.GGUFValueType.FLOAT32), "t.bool": (True, gguf.GGUFValueType.BOOL),
        "t.string": ("héllo", gguf.GGUFValueType.STRING),
        "t.u64": (1 << 40, gguf.GGUFValueType.UINT64), "t.i64": (-(1 << 40),
                                                                gguf.GGUFValueType.INT64),
        "t.f64": (2.25, gguf.GGUFValueType.FLOAT64),
    }
    for key, (value, vtype) in values.items():
        w.add_key_value(key, value, vtype)
    w.add_array("t.array_i32", list(range(100)))
    w.add_array("t.array_str", [f"s{i}" for i in range(70)])
    w.add_array("t.nested", [[1, 2], [3, 4, 5]])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 32)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 64)).astype(np.float16))
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
                  gguf.GGMLQuantizationType.Q5_1):
        data = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), qtype)
        w.add_tensor(qtype.name.lower(), data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: v for k, (v, _) in values.items()} | {
        "t.array_i32": list(range(100)), "t.array_str": [f"s{i}" for i in range(70)],
        "t.nested": [[1, 2], [3, 4, 5]]}


def assert_agrees_with_gguf_reader(path: Path) -> None:
    ours = GGUFFile.open(str(path))
    ref = gguf.GGUFReader(str(path))
    assert ours.problems == []
    ref_keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert ours.keys == ref_keys
    for key in ref_keys:
        expected = ref.fields[key].contents()
        got = ours.get(key)
        if isinstance(got, list) and got and isinstance(got[0], list):
            got = [x for inner in got for x in inner]  # GGUFReader flattens nested arrays
        if isinstance(expected, float):
            assert got == pytest.approx(expected, rel=1e-7), key
        elif isinstance(expected, list) and expected and isinstance(expected[0], float):
            np.testing.assert_allclose(got, expected, rtol=1e-7, err_msg=key)
        else:
            assert got == expected, key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for t, r in zip(ours.tensors, ref.tensors):
        assert t.dtype == r.tensor_type.name
        assert ours.ne(t.name) == tuple(int(n) for n in r.shape)
        assert t.offset == r.data_offset and t.nbytes == r.n_bytes
        raw = ours.raw(t.name)
        np.testing.assert_array_equal(raw.reshape(-1), np.asarray(r.data).view(np.uint8).reshape(-1))
        expected = gguf.quants.dequantize(np.asarray(r.data), r.tensor_type)
        np.testing.assert_array_equal(ours.tensor_f32(t.name).reshape(-1),
                                      np.asarray(expected, np.float32).reshape(-1))


def test_every_metadata_type_and_nested_arrays_read_like_the_gguf_package(tmp_path: Path) -> None:
    path = tmp_path / "types.gguf"
    written = all_types_file(path)
    assert_agrees_with_gguf_reader(path)
    f = GGUFFile.open(str(path))
    for key, value in written.items():
        assert f.get(key) == value, key


@pytest.mark.parametrize("path", GGUF_FIXTURES, ids=[p.name for p in GGUF_FIXTURES])
def test_llama_cpp_fixtures_read_like_the_gguf_package(path: Path) -> None:
    assert_agrees_with_gguf_reader(path)


def test_tensor_views_are_read_only_views_of_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "types.gguf"
    all_types_file(path)
    f = GGUFFile.open(str(path))
    view = f.tensor("f32")
    assert view.shape == (3, 32) and not view.flags.writeable and not view.flags.owndata
    assert f.raw("q8_0").shape == (4, 2 * 34)
    with pytest.raises(ValueError):
        view[0, 0] = 1.0


# ---------------------------------------------------------------------------------------------
# safetensors against the safetensors library


def test_a_type_with_no_dequantiser_is_a_warning_and_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "q8_1.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("f32", np.ones((2, 32), np.float32))
    q8_1 = gguf.GGMLQuantizationType.Q8_1
    block, size = gguf.GGML_QUANT_SIZES[q8_1]
    w.add_tensor("activations", np.zeros((2, 2 * size), np.uint8), raw_dtype=q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile.open(str(path))
    [problem] = f.problems
    assert problem.severity == "warning" and problem.tensor == "activations"
    assert "Q8_1 cannot be read" in problem.message
    assert f.tensor_f32("f32").sum() == 64
    with pytest.raises(ColibriFormatError, match="Q8_1 cannot be read") as caught:
        f.tensor_f32("activations")
    assert caught.value.tensor == "activations"
    scan = f.scan(checksums=True, nan_check=True)
    assert scan.complete and set(scan.crc32) == {"f32", "activations"}


def test_sharded_checkpoint_reads_like_safe_open(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    rng = torch.Generator().manual_seed(0)
    tensors = {f"w{i}": torch.randn(8, 16, generator=rng) for i in range(4)}
    tensors["h"] = torch.randn(16, generator=rng).to(torch.bfloat16)
    tensors["e4"] = torch.randn(32, generator=rng).to(torch.float8_e4m3fn)
    tensors["ids"] = torch.arange(10, dtype=torch.int64)
    names = sorted(tensors)
    weight_map = {}
    for shard, chunk in enumerate((names[:3], names[3:])):
        file = f"model-0000{shard + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in chunk}, str(tmp_path / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in chunk})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
         "weight_map": weight_map}))
    for path in (tmp_path, tmp_path / "model.safetensors.index.json"):
        assert formats.detect(path) == "safetensors"
        ckpt = Checkpoint.open(str(path))
        assert ckpt.problems == []
        assert sorted(t.name for t in ckpt.tensors) == names
        for name in names:
            expected = tensors[name].float().numpy()
            np.testing.assert_array_equal(ckpt.tensor_f32(name), expected)
            file = tmp_path / weight_map[name]
            assert ckpt.tensor_info(name).path == str(file)
            if name not in ("e4",):  # safe_open's numpy has no float8 (ml_dtypes does)
                with safe_open(str(file), framework="np") as lib:
                    np.testing.assert_array_equal(ckpt.tensor(name), lib.get_tensor(name))
        assert ckpt.metadata[weight_map["w0"]] == {"format": "pt"}
        assert ckpt.scan(checksums=True, nan_check=True).problems == []


def test_safetensors_view_is_zero_copy(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    save_file({"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, str(tmp_path / "m.safetensors"))
    ckpt = Checkpoint.open(str(tmp_path / "m.safetensors"))
    view = ckpt.tensor("x")
    assert not view.flags.writeable and not view.flags.owndata
    np.testing.assert_array_equal(view, np.arange(12).reshape(3, 4))


# ---------------------------------------------------------------------------------------------
# Detection and huge sparse files


def test_detect_by_content_not_extension(tmp_path: Path) -> None:
    assert formats.detect(ROOT / "resources" / "demo" / "demo.colibri") == "colibri"
    assert formats.detect(CORPUS / "valid.gguf") == "gguf"
    assert formats.detect(CORPUS / "valid.safetensors") == "safetensors"
    assert formats.detect(CORPUS / "sharded") == "safetensors"
    assert formats.detect(CORPUS / "bad_version.gguf") == "gguf"
    renamed = tmp_path / "model.colibri"
    renamed.write_bytes((CORPUS / "valid.safetensors").read_bytes())
    assert formats.detect(renamed) == "safetensors"
    (tmp_path / "notes.txt").write_text("hello")
    assert formats.detect(tmp_path / "notes.txt") is None
    (tmp_path / "config.json").write_text('{"model_type": "qwen2_moe"}')
    assert formats.detect(tmp_path / "config.json") is None


def test_a_broken_index_file_is_validated_as_an_index(tmp_path: Path) -> None:
    """Opened by its name, an index that is no longer JSON reports that, as its directory does,
    instead of failing the `.colibri` magic check."""
    index = CORPUS / "index_not_json" / "model.safetensors.index.json"
    assert formats.detect(index) == "safetensors"
    empty = tmp_path / "model.safetensors.index.json"
    empty.write_bytes(b"")
    assert formats.validate(empty)[1][0].message.startswith("index is not valid UTF-8 JSON")
    fmt, (problem,) = formats.validate(index)
    assert fmt == "safetensors"
    assert problem.code_name == "COL_ERR_HEADER" and "index is not valid UTF-8 JSON" in problem.message
    with pytest.raises(ColibriIOError):
        formats.detect(tmp_path / "absent.gguf")


def sparse_gguf(path: Path, size: int) -> None:
    """A GGUF header describing one F16 tensor of `size` bytes, the data a hole in the file."""
    n = size // 2
    head = (b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + struct.pack("<Q", 20)
            + b"general.architecture" + struct.pack("<IQ", 8, 5) + b"llama"
            + struct.pack("<Q", 4) + b"huge" + struct.pack("<IQIQ", 1, n, 1, 0))
    data_offset = -(-len(head) // 32) * 32
    with open(path, "wb") as f:
        f.write(head + bytes(data_offset - len(head)))
        f.truncate(data_offset + n * 2)


def test_a_20_gb_sparse_gguf_and_safetensors_open_from_their_headers(tmp_path: Path) -> None:
    """Opening reads the header only (the data is a hole: reading it would take minutes)."""
    size = 20 * 10 ** 9
    g = tmp_path / "huge.gguf"
    sparse_gguf(g, size)
    f = GGUFFile.open(str(g))
    assert f.tensors[0].nbytes == size and f.problems == []
    header = json.dumps({"huge": {"dtype": "BF16", "shape": [size // 2],
                                  "data_offsets": [0, size]}}).encode()
    s = tmp_path / "huge.safetensors"
    with open(s, "wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        out.truncate(8 + len(header) + size)
    ckpt = Checkpoint.open(str(s))
    assert ckpt.tensors[0].nbytes == size and ckpt.problems == []
    assert ckpt.tensor("huge").shape == (size // 2,)  # a view: nothing read


# ---------------------------------------------------------------------------------------------
# The corpus of damaged files


def test_corpus_covers_every_check_and_stays_small() -> None:
    codes = {m["code"] for m in MANIFEST}
    assert {"COL_OK", "COL_ERR_TRUNCATED", "COL_ERR_BAD_VERSION", "COL_ERR_LIMIT",
            "COL_ERR_HEADER", "COL_ERR_SECTION_BOUNDS", "COL_ERR_TENSOR_BOUNDS",
            "COL_ERR_MISALIGNED", "COL_ERR_SIZE_MISMATCH", "COL_ERR_OVERLAP",
            "COL_ERR_MISSING_TENSOR", "COL_ERR_SHAPE", "COL_ERR_DTYPE", "COL_ERR_NAME",
            "COL_ERR_NONFINITE", "COL_ERR_UNSUPPORTED"} <= codes
    listed = {m["file"] for m in MANIFEST}
    assert listed == {p.name for p in CORPUS.iterdir() if p.name != "manifest.json"}
    assert all(p.stat().st_size <= 64 * 1024 for p in CORPUS.rglob("*") if p.is_file())


@pytest.mark.parametrize("m", MANIFEST, ids=[m["file"] for m in MANIFEST])
def test_validate_reports_the_expected_finding(m: dict[str, Any]) -> None:
    fmt, problems = formats.validate(CORPUS / m["file"], nan_check=m["nan_check"])
    assert fmt == ("gguf" if m["file"].endswith(".gguf") else "safetensors")
    got = first_finding(problems)
    if m["code"] == "COL_OK":
        assert problems == []
        return
    assert got is not None
    assert (got.code_name, got.severity, got.offset, got.tensor) == (
        m["code"], m["severity"], m["offset"], m["tensor"]), str(got)
    assert m["message"] in got.message


@pytest.mark.parametrize("m", MANIFEST, ids=[m["file"] for m in MANIFEST])
def test_open_refuses_errors_and_accepts_warnings(m: dict[str, Any]) -> None:
    path = str(CORPUS / m["file"])
    structural = m["severity"] == "error" and not m["nan_check"]
    if structural:
        with pytest.raises(ColibriFormatError) as info:
            formats.open_file(path)
        assert (info.value.code_name, info.value.offset) == (m["code"], m["offset"])
    else:
        f = formats.open_file(path)
        for t in f.tensors:  # every tensor of an openable file reads
            assert f.tensor_f32(t.name).size == t.n_elements


@pytest.mark.parametrize("m", MANIFEST, ids=[m["file"] for m in MANIFEST])
def test_cli_validate_json(m: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", str(CORPUS / m["file"]), "--json"] + (
        ["--nan-check"] if m["nan_check"] else [])
    code = main(argv)
    doc = json.loads(capsys.readouterr().out)
    valid = m["code"] == "COL_OK" or m["severity"] == "warning"
    assert code == (0 if valid else 1) and doc["valid"] is valid
    assert doc["format"] == ("gguf" if m["file"].endswith(".gguf") else "safetensors")
    if m["code"] != "COL_OK":
        assert any(p["code_name"] == m["code"] and p["offset"] == m["offset"]
                   and m["message"] in p["message"] for p in doc["problems"]), doc["problems"]


def test_cli_unreadable_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "absent.gguf")]) == 2
    assert main(["info", str(tmp_path / "absent.safetensors")]) == 2


# ---------------------------------------------------------------------------------------------
# info and dump


def test_cli_info_json_for_gguf(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(CORPUS / "valid.gguf"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "gguf" and doc["metadata"]["general.architecture"] == "llama"
    f = GGUFFile.open(str(CORPUS / "valid.gguf"))
    assert doc["tensors"] == [dict(t.to_dict(), ne=list(f.ne(t.name))) for t in f.tensors]
    assert doc["tensors"][1]["dtype"] == "Q8_0" and doc["tensors"][1]["shape"] == [2, 32]


def test_cli_info_json_for_a_sharded_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(CORPUS / "sharded"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "safetensors" and len(doc["files"]) == 2
    assert [(t["name"], t["dtype"], t["shape"]) for t in doc["tensors"]] == [
        ("a", "F32", [2, 4]), ("b", "F16", [4])]
    assert doc["metadata"]["index"] == {"total_size": 40}
    assert all(set(t) >= {"name", "dtype", "shape", "offset", "nbytes"} for t in doc["tensors"])


def test_cli_dump_dequantises_a_gguf_block_tensor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", str(CORPUS / "valid.gguf"), "--tensor", "blk.0.ffn_up.weight",
                 "--rows", "1"]) == 0
    out = capsys.readouterr().out
    assert "dtype Q8_0, shape [2, 32]" in out and "first 1 row(s)" in out
    assert main(["dump", str(CORPUS / "valid.gguf"), "--tensor", "nope"]) == 1


def test_cli_dump_safetensors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", str(CORPUS / "sharded"), "--tensor", "b"]) == 0
    assert "dtype F16, shape [4]" in capsys.readouterr().out


def test_scan_reports_progress_and_stops_when_cancelled() -> None:
    f = formats.open_file(str(CORPUS / "valid.gguf"))
    seen: list[tuple[int, int]] = []
    result = f.scan(checksums=True, nan_check=True,
                    progress=lambda done, total, text: seen.append((done, total)))
    assert result.complete and seen[-1][0] == seen[-1][1] == sum(t.nbytes for t in f.tensors)
    assert set(result.crc32) == {t.name for t in f.tensors}
    stopped = f.scan(checksums=True, cancelled=lambda: True)
    assert not stopped.complete and stopped.crc32 == {}


def test_gguf_walk_never_raises_on_any_prefix() -> None:
    """Every prefix of a valid file is judged (TRUNCATED somewhere), never a crash."""
    image = (CORPUS / "valid.gguf").read_bytes()
    for n in range(len(image)):
        problems = gguf_file.validate_bytes(image[:n])
        assert any(p.severity == "error" for p in problems), n
    header = safetensors_file.validate_header(b"", 0)
    assert header.problems[0].code_name == "COL_ERR_TRUNCATED"

