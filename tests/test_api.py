"""The typed Python wrappers (colibri.engine, colibri.errors) on real files built at test time."""

from __future__ import annotations

import dataclasses
import gc
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri import errors
from colibri import fileformat as ff
from colibri.engine import KERNEL_PATHS, Model, Problem, Session, best_kernels, validate, validate_bytes
from colibri.errors import ColibriFormatError, ColibriIOError, ColibriValueError

from tiny_models import ARCHS, DTYPES, TinyModel

BuildModel = Callable[..., TinyModel]
BuildPath = Callable[..., Path]
BuildImage = Callable[..., bytearray]
WriteImage = Callable[..., Path]

TABLE_OFFSET = 0x28


def table_entry(image: bytearray, index: int) -> int:
    """Absolute offset of tensor table entry `index` in a file image."""
    return struct.unpack_from("<Q", image, TABLE_OFFSET)[0] + index * ff.TENSOR_ENTRY_SIZE


def rename_every_tensor(image: bytearray) -> int:
    """Name every tensor `extra.i` (each an unknown tensor, every required one missing); returns
    the tensor count."""
    n_tensors = struct.unpack_from("<I", image, 0x14)[0]
    for i in range(n_tensors):
        entry = table_entry(image, i)
        image[entry:entry + ff.TENSOR_NAME_MAX] = f"extra.{i}".encode().ljust(64, b"\0")
    ff.refresh_checksums(image)
    return n_tensors


def rename_output(image: bytearray) -> None:
    """Rename a qwen2_moe file's last tensor, "output", to "output_extra": an unknown tensor (a
    warning) and a missing output, unless the embeddings are then marked tied."""
    last = struct.unpack_from("<I", image, 0x14)[0] - 1
    entry = table_entry(image, last)
    image[entry:entry + 64] = b"output_extra".ljust(64, b"\0")


# ---------------------------------------------------------------------------------------------
# errors.raise_for_status


def test_raise_for_status_ok_returns_none() -> None:
    assert errors.raise_for_status(0) is None


def test_raise_for_status_io_is_oserror() -> None:
    with pytest.raises(OSError) as info:
        errors.raise_for_status(1, "cannot open")
    assert isinstance(info.value, ColibriIOError) and info.value.code == 1


def test_raise_for_status_nomem_is_memoryerror() -> None:
    with pytest.raises(MemoryError):
        errors.raise_for_status(2, "out of memory")


def test_raise_for_status_bad_token_is_valueerror() -> None:
    with pytest.raises(ValueError) as info:
        errors.raise_for_status(23, "token 99")
    assert info.value.code_name == "COL_ERR_BAD_TOKEN"


def test_raise_for_status_format_error_carries_location() -> None:
    with pytest.raises(ColibriFormatError) as info:
        errors.raise_for_status(15, "bad shape", offset=0x140, tensor="output")
    assert (info.value.code, info.value.code_name, info.value.offset, info.value.tensor) == (
        15, "COL_ERR_SHAPE", 0x140, "output")


# ---------------------------------------------------------------------------------------------
# Model: metadata and tensor table


@pytest.mark.parametrize("arch", ARCHS)
def test_hparams_equal_written(tiny_model: BuildModel, arch: str) -> None:
    tm = tiny_model(arch)
    with Model.open(tm.path) as model:
        hp = model.hparams
        rules = [model.routing(layer) for layer in range(hp.n_layers)]
    written = {name: tm.hparams.v2_value(name) for name in dataclasses.asdict(tm.hparams)}
    # version 1's routing flags are stated by each routing entry of a version-2 file
    written["flags"] &= ~ff.FLAGS_V1_ONLY
    for name, value in written.items():
        assert getattr(hp, name) == pytest.approx(np.float32(value) if isinstance(value, float)
                                                  else value, rel=1e-7), name
    implied = ff.RouteRule.from_v1_flags(tm.hparams.flags)
    assert all(ff.RouteRule.from_info(r) == implied for r in rules if r.kind == "moe")


def test_hparams_n_moe_layers_counts_moe_layers(tiny_model: BuildModel) -> None:
    tm = tiny_model("qwen2_moe", n_layers=3, dense_layers=(0,))
    with Model.open(tm.path) as model:
        assert model.hparams.n_moe_layers == 2


@pytest.mark.parametrize("arch", ARCHS)
def test_metadata_has_arch_name(tiny_model_path: BuildPath, arch: str) -> None:
    with Model.open(tiny_model_path(arch)) as model:
        assert model.metadata["arch_name"] == arch == model.arch


def test_metadata_user_is_parsed_json(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    with Model.open(tm.path) as model:
        assert model.metadata["user"] == tm.metadata


def test_metadata_has_hparams(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    with Model.open(tm.path) as model:
        assert model.metadata["vocab_size"] == tm.hparams.vocab_size


def test_path_is_kept(tiny_model_path: BuildPath) -> None:
    path = tiny_model_path()
    with Model.open(path) as model:
        assert model.path == str(path)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_table_equals_written(tiny_model: BuildModel, dtype: str) -> None:
    tm = tiny_model("mixtral", dtype)
    with Model.open(tm.path) as model:
        table = [(t.name, t.dtype, t.shape, t.nbytes) for t in model.tensors]
    expected = [(name, ff.DTYPE_NAMES[tm.dtypes[name]], tm.stored[name].shape,
                 tm.stored[name].nbytes) for name in tm.names]
    assert table == expected


def test_tensor_indices_and_alignment(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        infos = model.tensors
    assert [t.index for t in infos] == list(range(len(infos)))
    assert all(t.offset % ff.ALIGNMENT == 0 for t in infos)


def test_tensor_crc32_equals_data_crc(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    with Model.open(tm.path) as model:
        crcs = {t.name: t.crc32 for t in model.tensors}
    assert crcs == {n: zlib.crc32(tm.stored[n].tobytes()) & 0xFFFFFFFF for n in tm.names}


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_data_equals_stored(tiny_model: BuildModel, dtype: str) -> None:
    tm = tiny_model("qwen2_moe", dtype)
    with Model.open(tm.path) as model:
        for name in tm.names:
            view = model.tensor(name)
            assert view.dtype == tm.stored[name].dtype, name
            np.testing.assert_array_equal(view, tm.stored[name], err_msg=name)


def test_tensor_is_zero_copy(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        assert np.shares_memory(model.tensor("layers.1.moe_w2"), model.bytes())


def test_tensor_view_is_read_only(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        view = model.tensor("token_embd")
        with pytest.raises(ValueError):
            view[0, 0] = 1.0


def test_tensor_view_cannot_be_made_writable(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        view = model.tensor("token_embd")
        with pytest.raises(ValueError):
            view.flags.writeable = True


def mapping_flags(path: Path) -> list[str]:
    """The VmFlags of this process's mapping of `path` (/proc/self/smaps), [] if it has none."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    inside = False
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and line.startswith("VmFlags:"):
            return fields[1:]
    return []


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").exists(),
                    reason="a Linux kernel with transparent huge pages")
def test_model_mapping_asks_for_huge_pages(tiny_model_path: BuildPath) -> None:
    """The engine's mapping of the file carries the huge-page hint (smaps flag `hg`), so the pages
    a first read brings in through it are 2 MiB ones and decode's weight streams miss the TLB
    once per 2 MiB."""
    path = tiny_model_path().resolve()
    with Model.open(path):
        assert "hg" in mapping_flags(path)


def test_tensor_f32_widens_bf16_exactly(tiny_model: BuildModel) -> None:
    tm = tiny_model("mixtral", "bf16")
    with Model.open(tm.path) as model:
        values = model.tensor_f32("layers.0.moe_w1")
    np.testing.assert_array_equal(values, ff.bf16_bits_to_f32(tm.stored["layers.0.moe_w1"]))


def test_tensor_f32_of_f16(tiny_model: BuildModel) -> None:
    tm = tiny_model("mixtral", "f16")
    with Model.open(tm.path) as model:
        values = model.tensor_f32("output")
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values, tm.stored["output"].astype(np.float32))


def test_bytes_equal_file(tiny_model_path: BuildPath) -> None:
    path = tiny_model_path()
    with Model.open(path) as model:
        assert model.bytes().tobytes() == path.read_bytes()


def test_view_outlives_close(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    model = Model.open(tm.path)
    view = model.tensor("output")
    model.close()
    del model
    gc.collect()
    np.testing.assert_array_equal(view, tm.stored["output"])


def test_closed_model_refuses_calls(tiny_model_path: BuildPath) -> None:
    model = Model.open(tiny_model_path())
    model.close()
    with pytest.raises(ColibriValueError):
        model.tensor("output")


def test_unknown_tensor_raises_keyerror(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(KeyError):
            model.tensor("layers.9.moe_w1")


def test_tensor_info_by_name(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    with Model.open(tm.path) as model:
        info = model.tensor_info("layers.0.moe_gate")
    assert (info.dtype, info.shape) == ("f32", (tm.hparams.n_experts, tm.hparams.d_model))


def test_tokenizer_from_embedded_json(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        assert model.tokenizer.encode("the cat sat").ids == [3, 4, 5]


def test_tokenizer_none_when_absent(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path(with_tokenizer=False)) as model:
        assert model.tokenizer is None


def test_broken_tokenizer_is_format_error(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path(tokenizer_bytes=b"{not json")) as model:
        with pytest.raises(ColibriFormatError):
            model.tokenizer


def test_header_fields_start_with_magic(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        first = model.header_fields()[0]
    assert (first.offset, first.value) == (0, b"COLI")


def test_header_fields_decode_tensor_count(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    with Model.open(tm.path) as model:
        by_offset = {f.offset: f for f in model.header_fields()}
    assert by_offset[0x14].value == len(tm.names)


def test_header_fields_of_short_buffer_are_absent() -> None:
    from colibri.engine import header_fields

    fields = header_fields(b"COLI")
    assert fields[0].present and not fields[-1].present


def test_routing_of_moe_layer(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    with Model.open(tm.path) as model:
        entry = model.routing(1)
    assert (entry.kind, entry.gate_tensor, entry.top_k, entry.n_experts) == (
        "moe", tm.names.index("layers.1.moe_gate"), 2, 4)


def test_routing_of_dense_layer(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path("qwen2_moe", dense_layers=(0,))) as model:
        entry = model.routing(0)
    assert (entry.kind, entry.gate_tensor, entry.top_k) == ("dense", None, 0)


def test_routing_layer_out_of_range(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ColibriValueError):
            model.routing(2)


def test_check_tensor_clean(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        assert model.check_tensor(3) == []


# ---------------------------------------------------------------------------------------------
# Model.open failures


def test_open_missing_file_is_io_error(tmp_path: Path) -> None:
    with pytest.raises(ColibriIOError):
        Model.open(tmp_path / "missing.colibri")


def test_open_bad_magic_reports_code_and_offset(tiny_image: BuildImage,
                                                write_image: WriteImage) -> None:
    image = tiny_image()
    image[0:4] = b"GGUF"
    ff.refresh_checksums(image)
    with pytest.raises(ColibriFormatError) as info:
        Model.open(write_image(image))
    assert (info.value.code_name, info.value.offset) == ("COL_ERR_BAD_MAGIC", 0)


def test_open_misaligned_tensor_names_it(tiny_model: BuildModel, tiny_image: BuildImage,
                                         write_image: WriteImage) -> None:
    image = tiny_image()
    entry = table_entry(image, 2)
    offset = struct.unpack_from("<Q", image, entry + 0x68)[0]
    struct.pack_into("<Q", image, entry + 0x68, offset + 4)
    ff.refresh_checksums(image)
    with pytest.raises(ColibriFormatError) as info:
        Model.open(write_image(image))
    assert (info.value.code_name, info.value.tensor) == ("COL_ERR_MISALIGNED",
                                                         tiny_model().names[2])
    assert entry <= info.value.offset < entry + ff.TENSOR_ENTRY_SIZE


def test_open_keeps_every_finding_of_a_broken_file(tiny_image: BuildImage,
                                                   write_image: WriteImage) -> None:
    """One validation pass: the error raised carries every finding, the same ones (in the same
    order) as a separate validate() of the file."""
    image = tiny_image("qwen2_moe")
    rename_output(image)                         # a warning and a missing tensor
    struct.pack_into("<I", image, 0x74, 0)       # max_context 0: a header error
    ff.refresh_checksums(image)
    path = write_image(image)
    with pytest.raises(ColibriFormatError) as info:
        Model.open(path)
    found = info.value.problems
    assert found == validate(path) and len(found) >= 3
    assert {"error", "warning"} == {p.severity for p in found}
    first = next(p for p in found if p.severity == "error")
    assert (info.value.code, info.value.offset, info.value.tensor) == (first.code, first.offset,
                                                                      first.tensor)


def test_open_keeps_the_warnings_of_a_file_that_opens(tiny_image: BuildImage,
                                                      write_image: WriteImage) -> None:
    image = tiny_image("qwen2_moe")
    rename_output(image)
    flags = struct.unpack_from("<I", image, 0x5C)[0] | ff.FLAG_TIED_EMBEDDINGS
    struct.pack_into("<I", image, 0x5C, flags)
    ff.refresh_checksums(image)
    with Model.open(write_image(image)) as model:
        assert [(p.code_name, p.severity, p.tensor) for p in model.problems] == [
            ("COL_ERR_UNKNOWN_TENSOR", "warning", "output_extra")]


def test_open_of_a_clean_file_has_no_problems(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        assert model.problems == []


def test_open_keeps_more_findings_than_its_first_array_holds(tiny_image: BuildImage,
                                                            write_image: WriteImage) -> None:
    image = tiny_image(n_layers=40)
    n_tensors = rename_every_tensor(image)
    assert n_tensors > 256
    path = write_image(image)
    with pytest.raises(ColibriFormatError) as info:
        Model.open(path)
    assert info.value.problems == validate(path)
    assert sum(p.code_name == "COL_ERR_UNKNOWN_TENSOR" for p in info.value.problems) == n_tensors


def test_sections_locate_every_region(tiny_model: BuildModel) -> None:
    tm = tiny_model()
    data = tm.path.read_bytes()
    head = struct.unpack_from("<IIQQQQQQQ", data, 0x10)
    header_size, n_tensors, routing, data_offset, table, tok, tok_size, meta, meta_size = head
    with Model.open(tm.path) as model:
        sections = model.sections
        assert list(sections) == ["header", "routing", "tensor_table", "tokenizer", "metadata",
                                  "data"]
        entry = ff.routing_entry_size(struct.unpack_from("<I", data, 4)[0])
        assert [(s.offset, s.size) for s in sections.values()] == [
            (0, header_size), (routing, entry * tm.hparams.n_layers), (table, 128 * n_tensors),
            (tok, tok_size), (meta, meta_size), (data_offset, len(data) - data_offset)]
        assert data[tok:tok + tok_size] == model.tokenizer_json == tm.tokenizer_json


def test_sections_of_a_file_without_tokenizer(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path(with_tokenizer=False)) as model:
        tokenizer = model.sections["tokenizer"]
        assert (tokenizer.offset, tokenizer.size) == (0, 0)


# ---------------------------------------------------------------------------------------------
# validate


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_validate_clean_file(tiny_model_path: BuildPath, arch: str, dtype: str) -> None:
    assert validate(tiny_model_path(arch, dtype), checksums=True, nan_check=True) == []


def test_validate_bad_magic(tiny_image: BuildImage, write_image: WriteImage) -> None:
    image = tiny_image()
    image[0] ^= 0xFF
    ff.refresh_checksums(image)
    problems = validate(write_image(image))
    assert [(p.code_name, p.severity, p.offset) for p in problems][:1] == [
        ("COL_ERR_BAD_MAGIC", "error", 0)]


def test_validate_bytes_matches_validate(tiny_image: BuildImage, write_image: WriteImage) -> None:
    image = tiny_image()
    image[0] ^= 0xFF
    assert validate_bytes(bytes(image)) == validate(write_image(image))


def test_validate_bytes_empty_is_truncated() -> None:
    assert validate_bytes(b"")[0].code_name == "COL_ERR_TRUNCATED"


def test_validate_header_crc_mismatch(tiny_image: BuildImage, write_image: WriteImage) -> None:
    image = tiny_image()
    image[0x60] ^= 0x01  # d_model, without refreshing the CRC
    codes = {p.code_name for p in validate(write_image(image))}
    assert "COL_ERR_CHECKSUM" in codes


def test_validate_data_flip_needs_checksums(tiny_image: BuildImage, write_image: WriteImage) -> None:
    image = tiny_image()
    image[-1] ^= 0x01
    assert validate(write_image(image)) == []


def test_validate_data_flip_found_by_checksums(tiny_model: BuildModel, tiny_image: BuildImage,
                                               write_image: WriteImage) -> None:
    image = tiny_image()
    image[-1] ^= 0x01
    problems = validate(write_image(image), checksums=True)
    assert [(p.code_name, p.tensor) for p in problems] == [("COL_ERR_CHECKSUM",
                                                            tiny_model().names[-1])]


def test_validate_nan_found_by_nan_check(tiny_model: BuildModel, tiny_image: BuildImage,
                                         write_image: WriteImage) -> None:
    image = tiny_image()
    offset = struct.unpack_from("<Q", image, table_entry(image, 0) + 0x68)[0]
    struct.pack_into("<f", image, offset + 8, float("nan"))
    problems = validate(write_image(image), nan_check=True)
    assert [(p.code_name, p.tensor) for p in problems] == [("COL_ERR_NONFINITE", "token_embd")]


def test_validate_grows_problem_buffer(tiny_image: BuildImage, write_image: WriteImage) -> None:
    image = tiny_image(n_layers=8)
    n_tensors = rename_every_tensor(image)
    assert n_tensors > 64
    warnings = [p for p in validate(write_image(image)) if p.code_name == "COL_ERR_UNKNOWN_TENSOR"]
    assert len(warnings) == n_tensors


def test_data_checks_read_the_tensors_once_however_many_findings(tiny_image: BuildImage) -> None:
    from colibri import engine
    from colibri._colibri_cffi import ffi, lib
    image = tiny_image(n_layers=8)
    n_tensors = rename_every_tensor(image)  # a warning a tensor: more than the first pass's room
    image[-1] ^= 0x01                       # and a checksum finding
    data = ffi.from_buffer("uint8_t[]", image)
    passes: list[int] = []

    def validate_buffer(flags: int, problems: object, room: int, count: object) -> int:
        passes.append(flags)
        return int(lib.col_validate_buffer(data, len(image), flags, problems, room, count))

    status, problems = engine._collect_checked(validate_buffer, lib.COL_CHECK_CHECKSUMS, image)
    assert passes.count(lib.COL_CHECK_CHECKSUMS) == 1
    assert status != lib.COL_OK and len(problems) > n_tensors
    assert [p.code_name for p in problems].count("COL_ERR_CHECKSUM") == 1
    assert problems == validate_bytes(image, checksums=True)


def test_validate_unknown_tensor_is_warning(tiny_image: BuildImage, write_image: WriteImage) -> None:
    image = tiny_image("qwen2_moe")
    rename_output(image)  # and mark the embeddings tied
    flags = struct.unpack_from("<I", image, 0x5C)[0] | ff.FLAG_TIED_EMBEDDINGS
    struct.pack_into("<I", image, 0x5C, flags)
    ff.refresh_checksums(image)
    problems = validate(write_image(image))
    assert [(p.code_name, p.severity, p.tensor) for p in problems] == [
        ("COL_ERR_UNKNOWN_TENSOR", "warning", "output_extra")]


def test_validate_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(ColibriIOError):
        validate(tmp_path / "nope.colibri")


def test_validate_random_bytes_lists_problems(write_image: WriteImage) -> None:
    data = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    problems = validate(write_image(data))
    assert problems and problems[0].severity == "error"


def test_problem_is_frozen() -> None:
    problem = Problem(5, "COL_ERR_BAD_MAGIC", "error", 0, "", "magic")
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.offset = 4  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Session


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_returns_logits_per_position(tiny_model_path: BuildPath, arch: str) -> None:
    with Model.open(tiny_model_path(arch)) as model, Session(model) as session:
        logits = session.prefill([1, 3, 4, 5])
    assert (logits.shape, logits.dtype) == ((4, 50), np.float32)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_logits_are_finite(tiny_model_path: BuildPath, arch: str) -> None:
    with Model.open(tiny_model_path(arch, "bf16")) as model, Session(model) as session:
        assert np.isfinite(session.prefill([1, 3, 4, 5])).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_equals_steps_bit_identical(tiny_model_path: BuildPath, arch: str) -> None:
    tokens = [1, 7, 3, 9, 4, 4, 12]
    with Model.open(tiny_model_path(arch, dense_layers=(0,) if arch != "mixtral" else ())) as model:
        with Session(model) as a, Session(model) as b:
            batch = a.prefill(tokens)
            steps = np.stack([b.step(t) for t in tokens])
    assert batch.tobytes() == steps.tobytes()


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_of_last_logits_only_gives_the_last_row_bit_identical(tiny_model_path: BuildPath,
                                                                       arch: str) -> None:
    tokens = [1, 7, 3, 9, 4]
    with Model.open(tiny_model_path(arch)) as model:
        with Session(model) as a, Session(model) as b:
            every = a.prefill(tokens)
            last = b.prefill(tokens, all_logits=False)
            assert b.position == a.position == len(tokens)
            after = (a.step(5).tobytes(), b.step(5).tobytes())
    assert (last.shape, last.dtype) == ((1, 50), np.float32)
    assert last.tobytes() == every[-1:].tobytes()
    assert after[0] == after[1]


def test_prefill_of_no_tokens_for_last_logits_only_is_empty(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        assert session.prefill([], all_logits=False).shape == (0, 50)


def test_prefill_and_step_write_into_a_given_array(tiny_model_path: BuildPath) -> None:
    """`out` receives the logits (the array itself is returned), with the bits of a call that
    makes its own array."""
    tokens = [1, 7, 3, 9]
    with Model.open(tiny_model_path()) as model, Session(model) as a, Session(model) as b:
        rows, row = np.zeros((4, 50), np.float32), np.zeros(50, np.float32)
        assert a.prefill(tokens, out=rows) is rows and a.step(5, out=row) is row
        assert rows.tobytes() == b.prefill(tokens).tobytes() and row.tobytes() == b.step(5).tobytes()


@pytest.mark.parametrize("out", [np.zeros((3, 50), np.float32), np.zeros((4, 50), np.float64),
                                 np.zeros((4, 100), np.float32)[:, ::2], "rows"])
def test_an_unfit_output_array_is_refused_before_anything_runs(tiny_model_path: BuildPath,
                                                                out: object) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        with pytest.raises(ColibriValueError, match="out must be a writable C-contiguous float32"):
            session.prefill([1, 7, 3, 9], out=out)  # type: ignore[arg-type]
        frozen = np.zeros(50, np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ColibriValueError, match=r"of shape \[50\], got float32 \[50\]"):
            session.step(3, out=frozen)
        assert session.position == 0


def test_step_returns_vocab_logits(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        logits = session.step(3)
    assert (logits.shape, logits.dtype) == ((50,), np.float32)


def test_position_counts_processed_tokens(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        session.prefill([1, 2, 3])
        session.step(4)
        assert session.position == 4


def test_reset_restarts_identically(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        first = session.prefill([1, 3, 4])
        session.reset()
        assert session.position == 0
        assert session.prefill([1, 3, 4]).tobytes() == first.tobytes()


def test_threads_do_not_change_logits(tiny_model_path: BuildPath) -> None:
    tokens = [1, 5, 9, 13]
    with Model.open(tiny_model_path("qwen2_moe")) as model:
        with Session(model, threads=1) as one, Session(model, threads=3) as three:
            assert one.prefill(tokens).tobytes() == three.prefill(tokens).tobytes()


@pytest.mark.parametrize("routing", ["topk", "stable", "soft", "gumbel"])
def test_routing_modes_accepted(tiny_model_path: BuildPath, routing: str) -> None:
    with Model.open(tiny_model_path()) as model, Session(model, routing=routing) as session:
        assert session.prefill([1, 3]).shape == (2, 50)


def test_unknown_routing_raises(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ValueError):
            Session(model, routing="greedy")  # type: ignore[arg-type]


def test_zero_threads_raises(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ColibriValueError):
            Session(model, threads=0)


def test_threads_beyond_the_engines_limit_raise_its_message(tiny_model_path: BuildPath) -> None:
    """The engine judges ranges (col_session_config_check); Python forwards its words."""
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ColibriValueError, match="n_threads 257 outside 1..256"):
            Session(model, threads=257)
        with pytest.raises(ColibriValueError, match="n_threads 257 outside 1..256"):
            Session.memory_estimate(model, threads=257)
        Session(model, threads=256).close()


@pytest.mark.parametrize("arguments,words", [
    ({"max_context": 65}, "max_context 65 exceeds the model's 64"),
    ({"epsilon": float("nan")}, "epsilon must be finite and >= 0"),
    ({"epsilon": -1e-9}, "epsilon must be finite and >= 0"),
    ({"numerics": "blocked300"}, "lanes in 1..256, got 300"),
    ({"numerics": "split999"}, "split 999 outside 0..256"),
])
def test_session_ranges_are_the_engines(tiny_model_path: BuildPath, arguments: dict[str, object],
                                        words: str) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ColibriValueError, match=words):
            Session(model, **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("arguments", [{"threads": 1.5}, {"threads": True}, {"seed": "7"},
                                       {"max_context": None}, {"epsilon": "small"}])
def test_session_argument_types_are_checked_in_python(tiny_model_path: BuildPath,
                                                      arguments: dict[str, object]) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ColibriValueError, match="must be"):
            Session(model, **arguments)  # type: ignore[arg-type]


def test_arguments_the_c_types_cannot_hold_raise(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ColibriValueError, match="does not fit"):
            Session(model, seed=-1)
        with pytest.raises(ColibriValueError, match="does not fit"):
            Session(model, threads=2**32)
        with Session(model) as session:
            with pytest.raises(ColibriValueError, match="does not fit int32"):
                session.prefill([1, 2**40])
            with pytest.raises(ColibriValueError, match="does not fit int32"):
                session.step(2**31)
            assert session.position == 0


def test_values_restated_from_the_header_match_the_engine() -> None:
    from colibri.engine import lib
    from colibri.values import ARCH_NAMES, KERNEL_PATHS as VALUE_PATHS, ROUTING_MODES

    assert {getattr(lib, f"COL_ARCH_{name.upper()}"): name for name in ARCH_NAMES.values()} == (
        ARCH_NAMES)
    assert [getattr(lib, f"COL_ROUTING_{name.upper()}") for name in ROUTING_MODES] == [0, 1, 2, 3, 4]
    assert [getattr(lib, f"COL_KERNELS_{name.upper()}") for name in VALUE_PATHS] == [1, 2, 3, 4, 5]
    assert VALUE_PATHS == KERNEL_PATHS


def test_gumbel_is_deterministic_per_seed(tiny_model_path: BuildPath) -> None:
    tokens = [1, 3, 4, 5, 6]
    with Model.open(tiny_model_path()) as model:
        with Session(model, routing="gumbel", seed=7) as a, \
                Session(model, routing="gumbel", seed=7) as b:
            assert a.prefill(tokens).tobytes() == b.prefill(tokens).tobytes()


def test_bad_token_raises_before_processing(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        with pytest.raises(ColibriValueError) as info:
            session.prefill([1, 2, 50])
        assert (info.value.code_name, session.position) == ("COL_ERR_BAD_TOKEN", 0)


def test_negative_token_step_raises(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        with pytest.raises(ValueError):
            session.step(-1)


def test_context_full_raises(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model, max_context=4) as session:
        with pytest.raises(ColibriValueError) as info:
            session.prefill([1, 2, 3, 4, 5])
    assert info.value.code_name == "COL_ERR_CONTEXT_FULL"


def test_trace_shapes(tiny_model: BuildModel) -> None:
    tm = tiny_model("qwen2_moe", n_layers=3, dense_layers=(1,))
    with Model.open(tm.path) as model, Session(model) as session:
        session.prefill([1, 3, 4])
        trace = session.trace
        assert trace is not None
        assert (trace.expert_ids.shape, trace.expert_weights.shape, trace.router_logits.shape,
                trace.phase_ns.shape) == ((3, 2, 2), (3, 2, 2), (3, 2, 4), (3, 3, 5))
        assert trace.moe_layers.tolist() == [0, 2]


def test_trace_records_tokens(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        session.prefill([1, 3])
        session.step(8)
        assert session.trace is not None and session.trace.tokens.tolist() == [1, 3, 8]


def test_trace_soft_routing_uses_every_expert(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model, routing="soft") as session:
        session.prefill([1, 3])
        trace = session.trace
        assert trace is not None and trace.expert_ids.shape == (2, 2, 4)


def test_trace_weights_normalised_for_mixtral(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path("mixtral")) as model, Session(model) as session:
        session.prefill([1, 3, 4, 5])
        trace = session.trace
        assert trace is not None
        np.testing.assert_allclose(trace.expert_weights.sum(axis=-1), 1.0, rtol=1e-5)


def test_trace_off_is_none(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model, trace=False) as session:
        session.prefill([1, 3])
        assert session.trace is None


def test_trace_copy_survives_reset(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        session.prefill([1, 3])
        trace = session.trace
        assert trace is not None
        snapshot = trace.copy()
        session.reset()
        session.prefill([9, 9])
        assert snapshot.tokens.tolist() == [1, 3]


def test_trace_view_outlives_session(tiny_model_path: BuildPath) -> None:
    model = Model.open(tiny_model_path())
    session = Session(model)
    session.prefill([1, 3])
    trace = session.trace
    session.close()
    model.close()
    del session, model
    gc.collect()
    assert trace is not None and trace.tokens.tolist() == [1, 3]


def test_session_keeps_model_alive(tiny_model_path: BuildPath) -> None:
    model = Model.open(tiny_model_path())
    session = Session(model)
    model.close()
    del model
    gc.collect()
    assert session.step(3).shape == (50,)


def test_closed_model_refuses_sessions(tiny_model_path: BuildPath) -> None:
    model = Model.open(tiny_model_path())
    model.close()
    with pytest.raises(ColibriValueError):
        Session(model)


def test_memory_estimate_grows_with_context(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        small = Session.memory_estimate(model, max_context=8)
        large = Session.memory_estimate(model, max_context=64)
    assert 0 < small < large


def test_demo_session_memory_under_16_mb_at_2048_tokens() -> None:
    """The engine issue's budget: what a session allocates beyond the mapped weights, for the
    demo model at 2048 tokens of context, on the kernel path this machine runs."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    with Model.open(demo) as model:
        estimate = Session.memory_estimate(model, max_context=2048, threads=2)
    assert estimate < 16_000_000


def test_kernels_option_runs_the_path_asked_for(tiny_model_path: BuildPath) -> None:
    """A session's kernel ceiling picks a real path: the portable one always exists, and a
    ceiling at the machine's best path gives the same session as no ceiling."""
    with Model.open(tiny_model_path("mixtral", "bf16")) as model:
        assert Session(model, kernels="portable").kernels == "portable"
        best = best_kernels()
        assert Session(model, kernels=best).kernels == best == Session(model).kernels


def test_kernel_paths_agree_in_process(tiny_model_path: BuildPath) -> None:
    """Every path this machine has computes the same logits to rounding, and each is itself
    bit-identical between a batch and single steps."""
    tokens = [1, 7, 3, 9, 4, 4, 12]
    paths = KERNEL_PATHS[:KERNEL_PATHS.index(best_kernels()) + 1]
    with Model.open(tiny_model_path("mixtral", "bf16")) as model:
        results = {}
        for path in paths:
            with Session(model, kernels=path) as a, Session(model, kernels=path) as b:
                assert a.kernels == path
                batch = a.prefill(tokens)
                assert batch.tobytes() == np.stack([b.step(t) for t in tokens]).tobytes(), path
                results[path] = batch
    ref = results["portable"]
    for path, logits in results.items():
        assert np.allclose(logits, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max()), path


def test_unknown_kernel_path_is_refused(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        with pytest.raises(ColibriValueError, match="kernel path"):
            Session(model, kernels="neon")


def test_session_refuses_concurrent_use(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        session._busy.acquire()  # as if another thread were inside a C call
        try:
            with pytest.raises(RuntimeError):
                session.step(3)
        finally:
            session._busy.release()


# ---------------------------------------------------------------------------------------------
# Hidden-state capture (col_session_capture)


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_are_the_same_for_prefill_steps_and_threads(tiny_model_path: BuildPath,
                                                                  arch: str) -> None:
    tokens = [1, 7, 3, 9, 4, 4, 12]
    with Model.open(tiny_model_path(arch, dense_layers=(1,))) as model:
        with Session(model, capture_hidden=True) as a, \
                Session(model, capture_hidden=True, threads=3) as b:
            a.prefill(tokens)
            for t in tokens:
                b.step(t)
            assert a.hidden_states is not None and b.hidden_states is not None
            assert a.hidden_states.shape == (7, 2, 32)
            assert a.hidden_states.tobytes() == b.hidden_states.tobytes()
            assert np.abs(a.hidden_states).max(axis=2).min() > 0   # every row written
            assert not a.hidden_states.flags.writeable


def test_the_last_layer_hidden_state_gives_the_logits(tiny_model: BuildModel) -> None:
    """The captured state is the residual stream: the final norm and the LM head on the last
    layer's row reproduce the engine's logits."""
    tiny = tiny_model("mixtral", "f32")
    with Model.open(tiny.path) as model, Session(model, capture_hidden=True) as session:
        logits = session.prefill([1, 5, 2])
        x = session.hidden_states[:, -1].astype(np.float64)
        eps = model.hparams.norm_eps
    normed = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * tiny.values["output_norm"]
    expected = normed @ tiny.values["output"].astype(np.float64).T
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_capture_into_fills_its_window_only(tiny_model_path: BuildPath) -> None:
    tokens = [1, 7, 3, 9, 4]
    with Model.open(tiny_model_path()) as model:
        with Session(model, capture_hidden=True) as own:
            own.prefill(tokens)
            every = np.array(own.hidden_states)
        with Session(model) as session:
            assert session.hidden_states is None
            window = np.full((2, 2, 32), -7.0, dtype=np.float32)
            session.capture_into(window, first_position=3)
            session.prefill(tokens[:4])
            assert (window[1] == -7.0).all()            # position 4: not processed yet
            session.step(tokens[4])
            session.step(8)                            # position 5: outside the window
            session.capture_into(None)
    assert window.tobytes() == every[3:5].tobytes()


def test_capture_into_refuses_a_buffer_it_cannot_write(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model, Session(model) as session:
        for wrong in (np.zeros((4, 2, 32), np.float64), np.zeros((4, 3, 32), np.float32),
                      np.zeros((4, 2, 64), np.float32)[:, :, ::2], np.zeros((0, 2, 32), np.float32),
                      [[[0.0] * 32] * 2]):
            with pytest.raises(ColibriValueError):
                session.capture_into(wrong)  # type: ignore[arg-type]
        frozen = np.zeros((4, 2, 32), np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ColibriValueError, match="writable"):
            session.capture_into(frozen)
        with pytest.raises(ColibriValueError, match="first_position"):
            session.capture_into(np.zeros((4, 2, 32), np.float32), first_position=-1)


def test_memory_estimate_counts_the_capture(tiny_model_path: BuildPath) -> None:
    with Model.open(tiny_model_path()) as model:
        plain = Session.memory_estimate(model, max_context=40)
        captured = Session.memory_estimate(model, max_context=40, capture_hidden=True)
    assert 0 <= captured - plain - 40 * 2 * 32 * 4 < 64


# ---------------------------------------------------------------------------------------------
# Imports


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_fileformat_does_not_load_engine() -> None:
    proc = run_python("import sys, colibri.fileformat, colibri.errors\n"
                      "assert 'colibri.engine' not in sys.modules")
    assert proc.returncode == 0, proc.stderr


def test_package_exports_api() -> None:
    import colibri

    assert (colibri.Model, colibri.Session, colibri.validate) == (Model, Session, validate)


def test_generated_wrappers_release_the_gil(tmp_path: Path) -> None:
    import runpy

    root = Path(__file__).resolve().parents[1]
    builder = runpy.run_path(str(root / "app" / "colibri" / "_build_ffi.py"))["ffibuilder"]
    builder.emit_c_code(str(tmp_path / "binding.c"))
    source = (tmp_path / "binding.c").read_text()
    for function in ("col_session_prefill", "col_session_step", "col_validate_file",
                     "col_model_open", "col_model_check_tensor"):
        call = source.index(f"{{ result = {function}(x0")  # the Python-facing wrapper
        assert "Py_BEGIN_ALLOW_THREADS" in source[call - 200:call], function
