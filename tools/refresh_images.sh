#!/usr/bin/env bash
# refresh_images.sh - docs/images/ from the visual check of every view
# (tests/inspector/test_visual.py: the demo model after real runs and a llama.cpp GGUF file,
# Qt offscreen, 1280x800), so
# the README shows the Inspector as it is. Run from anywhere; it uses ./dev test.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
COLIBRI_VISUAL_ARTIFACTS="$out" QT_QPA_PLATFORM=offscreen \
    ./dev test -q tests/inspector/test_visual.py -k "renders_cleanly and 1280x800"
for pair in validation:inspector-validation header:inspector-header tensors:inspector-tensors \
            hex:inspector-hex values-tensor:inspector-values debugger-routing:inspector-debugger \
            debugger-latency:inspector-latency jitter:inspector-jitter \
            jitter-epsilon:inspector-epsilon gguf-header:inspector-gguf; do
    cp "$out/offscreen-1280x800/${pair%%:*}.png" "docs/images/${pair##*:}.png"
done
ls -l docs/images
