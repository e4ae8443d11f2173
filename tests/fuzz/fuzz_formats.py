"""atheris fuzz target for the GGUF and safetensors readers (run by tools/run_fuzz.sh).

The first input byte picks the reader (even: GGUF, odd: safetensors); the rest is the file. The
contract: the validator (`gguf_file.walk`, `safetensors_file.validate_header`) returns problems
for any bytes and never raises; a file it passes is opened and every metadata value and every
tensor's values are read without an exception, except those it warned it cannot read. Anything
else (an IndexError, a struct.error, a numpy error, a hang) is a finding. Seeds: tests/fuzz/seeds-formats/; findings become entries of
tests/corpus/formats/ (tools/make_format_corpus.py).
"""

from __future__ import annotations


import atheris

from atheris_main import run, scratch_path

with atheris.instrument_imports():
    from colibri.formats import gguf_file, safetensors_file
    from colibri.formats.common import UNSUPPORTED

PATH = scratch_path("formats")


def read_everything(f: object, unreadable: set[str] | None = None) -> None:
    for t in f.tensors:  # type: ignore[attr-defined]
        if t.name not in (unreadable or set()):
            f.tensor_f32(t.name)  # type: ignore[attr-defined]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    body = data[1:]
    if data[0] & 1 == 0:
        layout = gguf_file.walk(body)
        if any(p.severity == "error" for p in layout.problems or []):
            return
        with open(PATH, "wb") as out:
            out.write(body)
        f = gguf_file.GGUFFile.open(PATH)
        f.metadata()
        for key in f.keys:
            f.get(key)
        read_everything(f, {p.tensor for p in layout.problems or [] if p.code == UNSUPPORTED})
    else:
        header = safetensors_file.validate_header(body, len(body), PATH)
        if any(p.severity == "error" for p in header.problems):
            return
        with open(PATH, "wb") as out:
            out.write(body)
        read_everything(safetensors_file.Checkpoint.open(PATH))


if __name__ == "__main__":
    run(test_one_input, PATH)
