#!/usr/bin/env bash
# run_fuzz.sh SECONDS [format|convert|formats]... - run the fuzz targets for SECONDS each (default all).
#
#   format   engine_c/fuzz/fuzz_format.c: libFuzzer + ASan + UBSan over the .colibri reader
#            (`make -C engine_c fuzz`; needs clang and libFuzzer, e.g. Debian's clang +
#            libclang-rt-14-dev), seeded with tests/corpus/.
#   convert  tests/fuzz/fuzz_convert.py: atheris over the converter's config.json and
#            safetensors header handling (`pip install atheris`), seeded with tests/fuzz/seeds/.
#   formats  tests/fuzz/fuzz_formats.py: atheris over the GGUF and safetensors validators and
#            readers (colibri.formats), seeded with tests/fuzz/seeds-formats/.
#
# Working corpora and crash artifacts go to engine_c/build-fuzz/ (ignored by git). Each run ends
# with libFuzzer's final stats (executions, coverage); the script exits non-zero when a target
# found a crash, a leak or a hang (the artifact's path is in the log). PYTHON selects the
# interpreter for atheris (default: python3). JOBS>1 runs that many format workers in parallel.
# FUZZ_OUT moves corpora, logs and artifacts elsewhere (two runs at once need two).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(format convert formats)
PYTHON="${PYTHON:-python3}"
OUT="${FUZZ_OUT:-engine_c/build-fuzz}"
mkdir -p "$OUT/artifacts" "$OUT/corpus-format" "$OUT/corpus-convert" "$OUT/corpus-formats"
status=0
for target in "${targets[@]}"; do
    log="$OUT/$target.log"
    echo "[fuzz] $target for ${seconds}s (log: $log)" >&2
    case "$target" in
        format)
            make -s -j"$(nproc)" -C engine_c fuzz >/dev/null
            engine_c/build-fuzz/fuzz_format -max_total_time="$seconds" -max_len=65536 \
                -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
                -artifact_prefix="$OUT/artifacts/format-" \
                ${JOBS:+-fork="$JOBS"} -ignore_crashes=0 \
                "$OUT/corpus-format" tests/corpus >"$log" 2>&1 || status=1
            ;;
        convert)
            "$PYTHON" tests/fuzz/fuzz_convert.py -max_total_time="$seconds" -max_len=4096 \
                -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
                -artifact_prefix="$OUT/artifacts/convert-" \
                "$OUT/corpus-convert" tests/fuzz/seeds >"$log" 2>&1 || status=1
            ;;
        formats)
            "$PYTHON" tests/fuzz/fuzz_formats.py -max_total_time="$seconds" -max_len=8192 \
                -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
                -artifact_prefix="$OUT/artifacts/formats-" \
                "$OUT/corpus-formats" tests/fuzz/seeds-formats >"$log" 2>&1 || status=1
            ;;
        *)
            echo "[fuzz] unknown target $target" >&2
            exit 2
            ;;
    esac
    grep -E '^stat::|^#[0-9]+.*(DONE|cov:)' "$log" | tail -n 6 >&2 || true
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" >&2 || true
done
exit $status
