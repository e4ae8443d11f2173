#!/usr/bin/env bash
# ci_hostile.sh - the hostile-input stages CI runs before the test suite (see .ci/run):
#   1. the toolchain they need: clang + libFuzzer from Debian packages (CI runs as root), atheris
#      from PyPI into .venv;
#   2. the corpus manifest still matches the committed files (tools/make_corpus.py --check);
#   3. `make -C engine_c asan`: the engine and its C tests under ASan + UBSan (LSan on: the
#      failing-allocator and truncation tests must leave nothing behind);
#   4. tools/asan_python.sh: the conformance, API, corpus and hostile-file tests against an
#      ASan + UBSan build of the Python extension;
#   5. tools/run_fuzz.sh: each fuzz target for FUZZ_SECONDS (default 60), seeded with the corpus.
# Any sanitizer report, fuzzer finding or test failure fails the stage. About 17 minutes on two
# Zen 1 cores from clean builds. Run it locally after `./dev setup test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
log() { printf '[hostile] %s\n' "$*" >&2; }
started=$SECONDS

have_libfuzzer() {
    command -v clang >/dev/null 2>&1 || return 1
    local probe
    probe="$(mktemp -d)"
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
        >"$probe/p.c"
    clang -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" >/dev/null 2>&1
    local rc=$?
    rm -rf "$probe"
    return $rc
}

if ! have_libfuzzer; then
    log "installing clang and libFuzzer (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq clang libclang-rt-14-dev >/dev/null 2>&1 ||
        apt-get install -y -qq clang libclang-rt-dev >/dev/null
    have_libfuzzer || { log "clang -fsanitize=fuzzer does not link; cannot fuzz"; exit 1; }
fi
if ! "$PY" -c 'import atheris' 2>/dev/null; then
    log "installing atheris"
    "$PY" -m pip install --quiet "atheris==3.0.0"
fi

log "corpus manifests"
"$PY" tools/make_corpus.py --check
"$PY" tools/make_format_corpus.py --check

log "C engine and tests under ASan + UBSan"
make -s -C engine_c asan

log "Python tests against the ASan + UBSan extension"
PYTHON="$PY" tools/asan_python.sh

log "fuzzing, ${FUZZ_SECONDS}s per target"
PYTHON="$PY" tools/run_fuzz.sh "$FUZZ_SECONDS" format convert formats

log "done in $((SECONDS - started))s"
