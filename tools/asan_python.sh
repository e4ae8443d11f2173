#!/usr/bin/env bash
# asan_python.sh [PYTEST ARGS] - the Python tests against an AddressSanitizer + UBSan build of the
# engine (the second build CI runs; the first is the normal one `./dev test` uses).
#
# The package is copied to build/asan-py/colibri and its cffi extension compiled there with
# -fsanitize=address,undefined; PYTHONPATH puts that copy ahead of the editable install, so the
# normal extension in app/colibri is never touched. CPython itself is not instrumented, so
# libasan is preloaded, and leak detection is off for the interpreter (CPython keeps objects
# alive until exit by design); every other report aborts the run (halt_on_error). Default tests:
# the conformance suite, the API tests, the corrupt-file corpus, expert caching, embedding input,
# interventions (with caching too) and rewinding. PYTHON selects the interpreter (default
# .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT=build/asan-py
rm -rf "$OUT"
mkdir -p "$OUT"
cp -r app/colibri "$OUT/colibri"
find "$OUT/colibri" -name '_colibri_cffi*.so' -delete
find "$OUT/colibri" -name '__pycache__' -prune -exec rm -rf {} +
"$PYTHON" - "$OUT" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "app/colibri")
import _build_ffi as b

out = Path(sys.argv[1]).resolve()
builder = b.make_builder(absolute=True, sanitize=True)
built = builder.compile(tmpdir=str(out / "tmp"), verbose=False)
Path(built).rename(out / "colibri" / Path(built).name)
PY
LIBASAN="$(${CC:-cc} -print-file-name=libasan.so)"
export LD_PRELOAD="$LIBASAN"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONPATH="$PWD/$OUT${PYTHONPATH:+:$PYTHONPATH}"
export QT_QPA_PLATFORM=offscreen
so="$("$PYTHON" -c 'import colibri._colibri_cffi as m; print(m.__file__)')"
case "$so" in
    "$PWD/$OUT"/*) echo "[asan] engine: $so" >&2 ;;
    *) echo "[asan] wrong extension loaded: $so" >&2; exit 1 ;;
esac
if [ $# -eq 0 ]; then
    set -- tests/test_conformance.py tests/test_families_engine.py tests/test_api.py tests/test_corpus.py \
        tests/test_hostile_files.py \
        tests/test_reload.py tests/test_expert_cache.py tests/test_embedding_input.py \
        tests/test_interventions.py tests/test_interventions_caching.py tests/test_generation_rewind.py -q
fi
exec "$PYTHON" -m pytest -p no:cacheprovider "$@"
