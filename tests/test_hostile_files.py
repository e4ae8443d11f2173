"""Files that change or vanish under the engine, absurd headers, and the fixed cost of `validate`.

A mapped file truncated while a session runs or while a checksum scan reads it must give a clear
ColibriFileChangedError and leave the process alive (on Linux the read past the new end raises
SIGBUS; the engine's guard serves zeros and reports). An atomic replace leaves the mapping intact
and is reported as "replaced". Headers claiming absurd sizes are refused before any allocation,
and `validate` on any input up to 1 MiB stays fast.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import errors
from colibri import fileformat as ff
from colibri.values import HParams
from colibri.engine import Model, Session, validate_bytes

from tiny_models import TinyModel

CORPUS = Path(__file__).resolve().parent / "corpus"


@pytest.fixture
def private_copy(tmp_path: Path) -> Callable[..., Path]:
    def copy(source: Path = CORPUS / "valid.colibri", name: str = "model.colibri") -> Path:
        target = tmp_path / name
        shutil.copyfile(source, target)
        return target
    return copy


# ---------------------------------------------------------------------------------------------
# Truncation and rewrites while mapped


def test_step_after_truncation_raises_file_changed(private_copy: Callable[..., Path]) -> None:
    path = private_copy()
    with Model.open(path) as model:
        session = Session(model, max_context=8)
        session.step(1)
        os.truncate(path, 4096)
        with pytest.raises(errors.ColibriFileChangedError, match="size is now 4096"):
            session.step(2)
        assert session.position == 1
        with pytest.raises(errors.ColibriFileChangedError):
            model.check_file()
        with pytest.raises(errors.ColibriFileChangedError):
            model.check_tensor(len(model.tensors) - 1)


def test_read_past_new_end_is_served_zeros_not_sigbus(private_copy: Callable[..., Path]) -> None:
    path = private_copy()
    model = Model.open(path)
    data = model.bytes()
    os.truncate(path, 100)
    assert int(data[-1]) == 0          # without the guard: SIGBUS, the interpreter dies
    with pytest.raises(errors.ColibriFileChangedError, match="faulted"):
        model.check_file()


def test_atomic_replace_is_reported_and_mapping_intact(private_copy: Callable[..., Path]) -> None:
    path = private_copy()
    with Model.open(path) as model:
        session = Session(model, max_context=8)
        before = session.step(1)
        assert model.check_file() is False
        replacement = private_copy(name="new.colibri")
        os.replace(replacement, path)
        assert model.check_file() is True
        session.reset()
        np.testing.assert_array_equal(session.step(1), before)  # the old mapping still serves


def test_rewrite_in_place_is_detected(private_copy: Callable[..., Path]) -> None:
    path = private_copy()
    with Model.open(path) as model:
        time.sleep(0.02)
        with open(path, "r+b") as f:
            f.seek(300)
            f.write(b"\x5a")
        with pytest.raises(errors.ColibriFileChangedError, match="modified in place"):
            model.check_file()


def big_model(tiny_model: Callable[..., TinyModel]) -> TinyModel:
    # ~17 MB: token_embd and output of [16384, 128] f32 dominate, so a scan takes a while.
    return tiny_model("mixtral", "f32", vocab_size=16384, d_model=128, with_tokenizer=False)


def test_truncation_racing_a_running_session(tiny_model: Callable[..., TinyModel],
                                             tmp_path: Path) -> None:
    source = big_model(tiny_model).path
    for attempt in range(3):
        path = tmp_path / f"race{attempt}.colibri"
        shutil.copyfile(source, path)
        outcome: list[BaseException | int] = []
        with Model.open(path) as model:
            session = Session(model, max_context=64)
            started = threading.Event()

            def run() -> None:
                try:
                    for i in range(60):
                        session.step(i % 100)
                        started.set()
                    outcome.append(session.position)
                except BaseException as exc:  # noqa: BLE001 - the outcome is what we check
                    outcome.append(exc)
                finally:
                    started.set()

            worker = threading.Thread(target=run)
            worker.start()
            started.wait(30)
            os.truncate(path, (attempt + 1) * 1_000_000)
            worker.join(120)
            assert not worker.is_alive()
        (result,) = outcome
        if isinstance(result, BaseException):
            assert isinstance(result, errors.ColibriFileChangedError), repr(result)
        else:
            assert result == 60  # the run finished before the truncation


def test_truncation_racing_a_checksum_scan(tiny_model: Callable[..., TinyModel],
                                           tmp_path: Path) -> None:
    source = big_model(tiny_model).path
    seen: set[str] = set()
    for attempt in range(6):
        path = tmp_path / f"scan{attempt}.colibri"
        shutil.copyfile(source, path)
        results: list[object] = []

        def scan() -> None:
            try:
                results.append(colibri.validate(path, checksums=True, nan_check=True))
            except errors.ColibriError as exc:
                results.append(exc)

        worker = threading.Thread(target=scan)
        worker.start()
        time.sleep(0.001 * attempt)
        os.truncate(path, 3_000_000)
        worker.join(120)
        (result,) = results
        if isinstance(result, errors.ColibriError):
            assert isinstance(result, errors.ColibriFileChangedError), repr(result)
            seen.add("changed")
        else:
            assert isinstance(result, list)
            seen.add("finished" if not result else result[0].code_name)
    assert seen <= {"changed", "finished", "COL_ERR_TRUNCATED"}
    # And deterministically, through a model: truncated before the scan.
    path = tmp_path / "scan.colibri"
    shutil.copyfile(source, path)
    with Model.open(path) as model:
        os.truncate(path, 3_000_000)
        with pytest.raises(errors.ColibriFileChangedError):
            model.check_tensor(len(model.tensors) - 1)


# ---------------------------------------------------------------------------------------------
# Limits and the cost of validate


def absurd_table_image(n_tensors: int, size: int = 1 << 20) -> bytearray:
    """A header claiming `n_tensors` entries, with a table of distinct garbage names filling
    the rest of a `size`-byte image: the most work the validator can be asked for per byte."""
    image = bytearray((CORPUS / "valid.colibri").read_bytes()[:ff.HEADER_SIZE])
    image += bytes(size - len(image))
    struct.pack_into("<I", image, 0x14, n_tensors)
    struct.pack_into("<Q", image, 0x28, ff.HEADER_SIZE + 1024)
    struct.pack_into("<Q", image, 0x50, size)
    base = ff.HEADER_SIZE + 1024
    for i in range(min(n_tensors, (size - base) // ff.TENSOR_ENTRY_SIZE)):
        at = base + i * ff.TENSOR_ENTRY_SIZE
        image[at:at + 12] = f"layers.{i}.x".encode()[:12].ljust(12, b"\0")
        struct.pack_into("<II4Q", image, at + 0x40, 0, 4, *(1 << 31,) * 4)
    ff.refresh_checksums(image)
    return image


@pytest.mark.parametrize("n_tensors", [4096, 8000, 0xFFFFFFFF])
def test_validate_one_mebibyte_worst_cases_is_fast(n_tensors: int) -> None:
    image = absurd_table_image(n_tensors)
    # CPU time of this thread: the bound is on the validator's work, which a busy machine's
    # run-queue waits would otherwise add to (the call runs on this thread, GIL released).
    start = time.thread_time()
    problems = validate_bytes(image, checksums=True, nan_check=True)
    elapsed = time.thread_time() - start
    assert problems and elapsed < 1.0, elapsed


def test_validate_random_mebibytes_is_fast() -> None:
    rng = np.random.default_rng(7)
    image = bytearray((CORPUS / "valid.colibri").read_bytes())
    image += rng.integers(0, 256, (1 << 20) - len(image), dtype=np.uint8).tobytes()
    for _ in range(5):
        mutated = bytearray(image)
        for at in rng.integers(0, 8448, 40):
            mutated[at] = int(rng.integers(0, 256))
        start = time.thread_time()
        validate_bytes(mutated, checksums=True, nan_check=True)
        assert time.thread_time() - start < 1.0


def test_absurd_tensor_count_states_the_limit() -> None:
    problems = validate_bytes(absurd_table_image(0xFFFFFFF0, size=1 << 16))
    first = next(p for p in problems if p.severity == "error")
    assert first.code_name == "COL_ERR_LIMIT" and first.offset == 0x14
    assert "1..1048576" in first.message


# ---------------------------------------------------------------------------------------------
# Interrupted writes leave the previous file intact


def test_interrupted_cli_dump_keeps_the_previous_file(tmp_path: Path) -> None:
    from colibri.files import atomic_write as _atomic_write

    target = tmp_path / "logits.npy"
    target.write_bytes(b"previous")

    def write_half_then_fail(f: object) -> None:
        f.write(b"half a file")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _atomic_write(str(target), write_half_then_fail)
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["logits.npy"]


def test_interrupted_colibri_write_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "model.colibri"
    shutil.copyfile(CORPUS / "valid.colibri", target)
    before = target.read_bytes()
    hp = HParams(arch=ff.ARCH_MIXTRAL, n_layers=1, n_experts=1, n_experts_active=1, d_model=4,
                 n_heads=1, n_kv_heads=1, head_dim=4, vocab_size=4, max_context=4,
                 d_ff_expert=4)

    def boom() -> np.ndarray:
        raise KeyboardInterrupt

    plan = ff.plan_file(hp, [ff.LAYER_MOE], [ff.TensorSpec("token_embd", ff.DTYPE_F32, (4, 4),
                                                           boom)])
    with pytest.raises(KeyboardInterrupt):
        ff.write_colibri(target, plan)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.colibri"]
