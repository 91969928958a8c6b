#!/usr/bin/env bash
# The sanitizer job: an ASan+UBSan build (clang) running the whole suite, the malformed-GGUF corpus
# included, then short libFuzzer runs of the GGUF reader and of the server's request readers. Any
# sanitizer report fails it.
#   bash tools/sanitize.sh [fuzz seconds, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds="${1:-60}"
bash tools/setup.sh >/dev/null  # packages and .venv (also builds the plain tree)

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DQWENRT_SANITIZE=ON -DQWENRT_FUZZ=ON -DQWENRT_CUDA=OFF >/dev/null
ninja -C build-asan
# The CUDA backend is left out here (no GPU in CI: its tests skip; the plain build compiles it).
# Two heavy checks are left to the plain run: the 10k-string tokenizer parity sweep against HF
# (the C++ tokenizer tests still run here) and the full-width synthetic checkpoints (GBs of temp
# files through the scalar engine; the small synth tests still run here).
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -E '^py\.tokenizer_parity$|^SynthFile\.'

corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp tests/fixtures/malformed/*.gguf tests/fixtures/malformed/model/*.gguf "$corpus"/ 2>/dev/null || true
dict=()
[ -f fuzz/gguf.dict ] && dict=(-dict=fuzz/gguf.dict)
build-asan/gguf_reader_fuzz "$corpus" "${dict[@]}" -max_total_time="$fuzz_seconds" \
  -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 20
# The server's request readers and reply writers (fuzz/serve_request_fuzz.cpp), seeded with
# fuzz/serve_corpus/; new inputs go to a scratch copy.
serve_corpus=$(mktemp -d)
trap 'rm -rf "$corpus" "$serve_corpus"' EXIT
cp fuzz/serve_corpus/* "$serve_corpus"/
build-asan/serve_request_fuzz "$serve_corpus" -max_total_time="$fuzz_seconds" -max_len=4096 \
  -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 20
