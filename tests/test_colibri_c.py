"""`colibri-c`, the C command-line tool (engine_c/tools/colibri-c.c), says what the Python
`colibri` says: on the same file, `validate` and `info` print the same lines on stdout, the same
message on stderr (after each tool's own name) and exit with the same status, and their --json
documents parse to the same values. `run` generates the same greedy tokens."""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri import fileformat as ff
from colibri import formats
from colibri.cli import main
from quant_models import make_model

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine_c"
# colibri-c reads .colibri files only; the Python tool also judges GGUF and safetensors files
CORPUS = [p for p in sorted((ROOT / "tests" / "corpus").glob("*.colibri"))
          if formats.detect(p) not in ("gguf", "safetensors")]
DEMO = ROOT / "resources" / "demo" / "demo.colibri"

BuildPath = Callable[..., Path]
BuildImage = Callable[..., bytearray]
WriteImage = Callable[..., Path]
Capture = pytest.CaptureFixture[str]
Output = tuple[int, str, str]


@pytest.fixture(scope="module")
def colibri_c() -> Path:
    subprocess.run(["make", "-s", "-C", str(ENGINE), "build/colibri-c"], check=True)
    return ENGINE / "build" / "colibri-c"


def python_tool(capsys: Capture, *argv: str | Path) -> Output:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err.replace("colibri: ", "", 1)


def c_tool(binary: Path, *argv: str | Path) -> Output:
    result = subprocess.run([str(binary), *map(str, argv)], capture_output=True, text=True,
                            timeout=120)
    return result.returncode, result.stdout, result.stderr.replace("colibri-c: ", "", 1)


def same_output(capsys: Capture, binary: Path, *argv: str | Path) -> Output:
    """Run both tools; assert they print and exit alike; return the Python tool's output."""
    python, c = python_tool(capsys, *argv), c_tool(binary, *argv)
    assert c == python
    return python


def same_json(capsys: Capture, binary: Path, *argv: str | Path) -> object:
    """Run both tools with --json; assert the documents parse to the same values."""
    code, out, err = python_tool(capsys, *argv, "--json")
    c_code, c_out, c_err = c_tool(binary, *argv, "--json")
    assert (c_code, c_err) == (code, err)
    assert json.loads(c_out) == json.loads(out)
    return json.loads(out)


def with_metadata(image: bytearray, text: bytes) -> bytearray:
    """The file with `text` as its user metadata, stored where the tokenizer was (dropped): a tiny
    model's own metadata section has no room for long text."""
    tok_offset = struct.unpack_from("<Q", image, 0x30)[0]
    data_offset = struct.unpack_from("<Q", image, 0x20)[0]
    assert len(text) <= data_offset - tok_offset
    struct.pack_into("<QQQQ", image, 0x30, 0, 0, tok_offset, len(text))
    image[tok_offset:tok_offset + len(text)] = text
    ff.refresh_checksums(image)
    return image


# ---------------------------------------------------------------------------------------------
# validate


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_validate_prints_the_same_lines_for_every_corpus_file(capsys: Capture, colibri_c: Path,
                                                              path: Path) -> None:
    same_output(capsys, colibri_c, "validate", path, "--checksums", "--nan-check")


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_validate_json_is_the_same_for_every_corpus_file(capsys: Capture, colibri_c: Path,
                                                         path: Path) -> None:
    same_json(capsys, colibri_c, "validate", path, "--checksums", "--nan-check")


def test_validate_counts_errors_and_warnings_alike(capsys: Capture, colibri_c: Path) -> None:
    _, out, _ = same_output(capsys, colibri_c, "validate", ROOT / "tests/corpus/unknown_tensor.colibri")
    assert out.splitlines()[-1].endswith(": valid (0 error(s), 1 warning(s))")


def test_validate_summarises_a_run_of_tensor_findings_alike(capsys: Capture, colibri_c: Path,
                                                            write_image: WriteImage) -> None:
    truncated = write_image(DEMO.read_bytes()[:100_000])
    code, out, _ = same_output(capsys, colibri_c, "validate", truncated)
    assert code == 1 and "  ... and 41 more COL_ERR_TENSOR_BOUNDS errors like it" in out


def test_validate_names_a_tensor_once(capsys: Capture, colibri_c: Path) -> None:
    _, out, _ = same_output(capsys, colibri_c, "validate",
                            ROOT / "tests/corpus/dtype_not_allowed.colibri")
    line = next(l for l in out.splitlines() if "tensor '" in l)
    name = line.split("tensor '")[1].split("'")[0]
    assert line.count(name) == 1


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_validate_an_unreadable_path_alike(capsys: Capture, colibri_c: Path, tmp_path: Path,
                                           what: str) -> None:
    path = tmp_path / "missing.colibri" if what == "missing" else tmp_path
    assert same_output(capsys, colibri_c, "validate", path)[0] == 2
    same_json(capsys, colibri_c, "validate", path)


def test_validate_random_bytes_alike(capsys: Capture, colibri_c: Path,
                                     write_image: WriteImage) -> None:
    data = np.random.default_rng(2).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    assert same_output(capsys, colibri_c, "validate", write_image(data))[0] == 1


# ---------------------------------------------------------------------------------------------
# info


@pytest.mark.parametrize("arch,dtype", [("mixtral", "f32"), ("qwen2_moe", "bf16"),
                                        ("qwen3_moe", "f16"), ("olmoe", "f32")])
def test_info_prints_the_same_lines(capsys: Capture, colibri_c: Path, tiny_model_path: BuildPath,
                                    arch: str, dtype: str) -> None:
    code, out, _ = same_output(capsys, colibri_c, "info", tiny_model_path(arch, dtype))
    assert code == 0 and "\nhyper-parameters:\n" in out and "\ntensors:\n" in out


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_info_of_quantised_files_alike(capsys: Capture, colibri_c: Path, tmp_path: Path,
                                       quant: str) -> None:
    path = make_model(tmp_path, "qwen2_moe", "bf16", quant, "all")
    _, out, _ = same_output(capsys, colibri_c, "info", path)
    assert f"  {quant} " in out
    same_json(capsys, colibri_c, "info", path)


def test_info_of_the_demo_alike(capsys: Capture, colibri_c: Path) -> None:
    same_output(capsys, colibri_c, "info", DEMO)
    doc = same_json(capsys, colibri_c, "info", DEMO)
    assert isinstance(doc, dict) and doc["user_metadata"]["hf_config"]["model_type"] == "mixtral"


def test_info_of_a_format_version_1_file_alike(capsys: Capture, colibri_c: Path) -> None:
    """Only the header fields version 1 has, and its rules read as version 1 means them."""
    path = ROOT / "tests" / "v1" / "qwen2_moe-v1.colibri"
    _, out, _ = same_output(capsys, colibri_c, "info", path)
    assert "  0x004  version                      1\n" in out and "\nrouting:\n  layer 0" in out
    same_json(capsys, colibri_c, "info", path)


def test_info_of_a_family_of_format_version_2_alike(capsys: Capture, colibri_c: Path,
                                                    tmp_path: Path) -> None:
    """DeepSeek-V3's latent attention and grouped, biased routing: the version-2 header and
    hyper-parameters, and each layer's rule in the engine's words."""
    pytest.importorskip("torch")
    hf_reference = pytest.importorskip("hf_reference")
    from colibri.convert import convert

    variant = next(v for v in hf_reference.VARIANTS if v.name == "deepseek_v3-groups-qlora")
    hf_dir = hf_reference.save(hf_reference.build(variant), tmp_path / "hf")
    convert(hf_dir, tmp_path / "ds.colibri", dtype="bf16")
    capsys.readouterr()  # the checkpoint writer's progress
    _, out, _ = same_output(capsys, colibri_c, "info", tmp_path / "ds.colibri")
    assert "deepseek_v3" in out.splitlines()[0] and "groups" in out.split("\nrouting:\n")[1]
    doc = same_json(capsys, colibri_c, "info", tmp_path / "ds.colibri")
    assert isinstance(doc, dict) and doc["hparams"]["kv_lora_rank"] > 0


def test_info_json_is_the_same(capsys: Capture, colibri_c: Path,
                               tiny_model_path: BuildPath) -> None:
    doc = same_json(capsys, colibri_c, "info", tiny_model_path("qwen2_moe", "bf16"))
    assert isinstance(doc, dict) and doc["hparams"]["flags"] != 0


@pytest.mark.parametrize("metadata", [
    b'{\n  "pretty": [1, 2.5e-3, "x"],\n  "nested": {"a": null}\n}\n',
    '{"caf\u00e9": "\u65e5\u672c", "emoji": "\U0001F600"}'.encode(),
    b'{"long": "' + b"x" * 2500 + b'"}',
    b'{"nan": NaN, "big": -Infinity}',
    b'["not an object", true, false]',
], ids=["pretty", "utf8", "long", "nan", "array"])
def test_info_shows_user_metadata_as_stored(capsys: Capture, colibri_c: Path,
                                            tiny_image: BuildImage, write_image: WriteImage,
                                            metadata: bytes) -> None:
    path = write_image(with_metadata(tiny_image(tokenizer_bytes=b" " * 8192), metadata))
    _, out, _ = same_output(capsys, colibri_c, "info", path)
    shown = out.split("\nuser metadata:\n")[1].split("\n\ntensors:")[0]
    assert shown.replace("\n  ", "\n").removeprefix("  ") == metadata.decode()[:2000]


@pytest.mark.parametrize("metadata", [
    b'{"unterminated": ', b'{"bad utf-8": "\xff"}', b'{"overlong": "\xc0\xaf"}',
    b'{"trailing": 1} x', b'{"ctl": "a\tb"}', b'{"escape": "\\x"}', b"null", b"[" * 2000,
    b"1" * 4301, b"\xef\xbb\xbf{}",
], ids=["unterminated", "bad-utf8", "overlong", "trailing", "control", "escape", "null", "deep",
        "huge-int", "bom"])
def test_info_leaves_out_metadata_that_is_not_json_alike(capsys: Capture, colibri_c: Path,
                                                         tiny_image: BuildImage,
                                                         write_image: WriteImage,
                                                         metadata: bytes) -> None:
    path = write_image(with_metadata(tiny_image(tokenizer_bytes=b" " * 8192), metadata))
    code, out, _ = same_output(capsys, colibri_c, "info", path)
    assert code == 0 and "user metadata" not in out
    assert same_json(capsys, colibri_c, "info", path)["user_metadata"] is None  # type: ignore[index]


@pytest.mark.parametrize("name", ["bad_version.colibri", "truncated_data.colibri",
                                  "name_duplicate.colibri", "missing_tensor.colibri"])
def test_info_refuses_an_invalid_file_alike(capsys: Capture, colibri_c: Path, name: str) -> None:
    code, _, err = same_output(capsys, colibri_c, "info", ROOT / "tests" / "corpus" / name)
    assert code == 1 and err.startswith("COL_ERR_")


def test_info_of_a_missing_file_alike(capsys: Capture, colibri_c: Path, tmp_path: Path) -> None:
    assert same_output(capsys, colibri_c, "info", tmp_path / "missing.colibri")[0] == 2


# ---------------------------------------------------------------------------------------------
# run


def test_run_generates_the_same_tokens(capsys: Capture, colibri_c: Path,
                                       tiny_model_path: BuildPath) -> None:
    path = tiny_model_path("olmoe")
    code, out, _ = python_tool(capsys, "run", path, "--tokens", "1,3,4", "-n", "6", "-t", "2")
    expected = next(l for l in out.splitlines() if l.startswith("tokens: "))
    c_code, c_out, _ = c_tool(colibri_c, "run", path, "--tokens", "1,3,4", "--generate", "6",
                              "--threads", "2")
    assert (c_code, c_out.strip()) == (code, expected.removeprefix("tokens: ").strip())


def test_run_leaves_ranges_to_the_engine(colibri_c: Path, tiny_model_path: BuildPath) -> None:
    code, _, err = c_tool(colibri_c, "run", tiny_model_path(), "--tokens", "1", "-t", "100000")
    assert code == 1 and "COL_ERR_INVALID_ARG" in err and "thread" in err
