#!/usr/bin/env bash
# Streamed routed experts against llama.cpp with its experts on the CPU, on the GPU machine, in
# one device call: qwenrt `--expert-cache G` (a device pool of G GiB; misses from the pinned host
# copy, and with HOST_OFF=1 also from the file) against `llama-bench -ncmoe N` (the experts of the
# first N layers in host memory, computed on the CPU), at pairs of about the same device memory
# for experts, on one synthetic file. Run from the repository root:
#
#   bash bench/h200/expert_stream.sh [PAIRS]       # PAIRS default "4.2:30 8.4:20"
#
# PAIRS: G:N pairs; for the 35B-A3B (40 layers of 256 experts of 1.77 MB) N layers on the CPU
# leave (40 - N) x 0.45 GB of experts on the device, so 30 pairs with 4.2 GiB and 20 with 8.4.
# Environment: LIKE (default Qwen3.6-35B-A3B), QUANT (Q4_K_M), LAYERS (synth --layers, default
# all), QWENRT (build-cuda/qwenrt), QWENRT_BACKEND (cuda), TESTS (bench tests, default
# "-p 512 -n 32"), REPEATS (3), ROUNDS (2, the two tools alternating), HOST_OFF (1: also qwenrt
# with QWENRT_CUDA_EXPERT_HOST=0), LDIR (llama.cpp sources and build, default
# /tmp/h200-llamacpp: reuses bench/h200/run.sh's build on a still-warm machine, else builds
# llama-bench from SRC_TAR, default .carry/llamacpp-src.tar.xz, with CUDA unless LLAMA_CUDA=off),
# GGUF (the file, default /tmp/stream-<like>.gguf, kept), OUT (results: expert-stream.md and
# expert-stream-raw.tar.xz, every command's output, exit status and peak device memory; the
# device tool returns few files, so the raw ones are packed).
set -uo pipefail
pairs=${1:-"4.2:30 8.4:20"}
like=${LIKE:-Qwen3.6-35B-A3B}
quant=${QUANT:-Q4_K_M}
q=${QWENRT:-build-cuda/qwenrt}
backend=${QWENRT_BACKEND:-cuda}
tests=${TESTS:--p 512 -n 32}
repeats=${REPEATS:-3}
rounds=${ROUNDS:-2}
ldir=${LDIR:-/tmp/h200-llamacpp}
src=${SRC_TAR:-.carry/llamacpp-src.tar.xz}
gguf=${GGUF:-/tmp/stream-${like}.gguf}
out=${OUT:-/tmp/out}
raw=/tmp/expert-stream-raw
rm -rf "$raw"
mkdir -p "$raw" "$out"
[ -e "$q" ] || [ ! -e .carry/bin.tar.xz ] || tar xJf .carry/bin.tar.xz
[ -d .carry/lib ] && export LD_LIBRARY_PATH=$PWD/.carry/lib:$PWD/build-cuda:${LD_LIBRARY_PATH:-}
[ -x "$q" ] || { echo "expert_stream.sh: no qwenrt at $q" >&2; exit 1; }
lb=$ldir/build/bin/llama-bench
if [ ! -x "$lb" ]; then
  echo "== building llama-bench in $ldir"
  mkdir -p "$ldir"
  [ -f "$ldir/llama.cpp/CMakeLists.txt" ] || tar -xJf "$src" -C "$ldir" || exit 1
  cmake -S "$ldir/llama.cpp" -B "$ldir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA="$([ "${LLAMA_CUDA:-on}" = off ] && echo OFF || echo ON)" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$raw/llama-build.log" 2>&1 &&
    cmake --build "$ldir/build" --target llama-bench -j "$(nproc)" >> "$raw/llama-build.log" 2>&1 ||
    { tail -20 "$raw/llama-build.log"; exit 1; }
fi
if [ ! -f "$gguf" ]; then
  extra=()
  [ -n "${LAYERS:-}" ] && extra=(--layers "$LAYERS")
  "$q" synth --like "$like" --quant "$quant" "${extra[@]}" --out "$gguf" > "$raw/synth.log" 2>&1 ||
    { cat "$raw/synth.log"; exit 1; }
fi
# Peak device memory of a command (nvidia-smi every 0.2 s; -1 without nvidia-smi).
measure() {
  local name=$1
  shift
  local peak=$raw/$name.mem
  echo -1 > "$peak"
  if command -v nvidia-smi > /dev/null; then
    (
      m=0
      while :; do
        v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        [ "${v:-0}" -gt "$m" ] && m=$v && echo "$m" > "$peak"
        sleep 0.2
      done
    ) &
    local sampler=$!
  fi
  "$@" > "$raw/$name.out" 2> "$raw/$name.err"
  echo $? > "$raw/$name.rc"
  [ -n "${sampler:-}" ] && kill "$sampler" 2> /dev/null && wait "$sampler" 2> /dev/null
  echo "$(date -u +%T) $name: exit $(cat "$raw/$name.rc"), peak $(cat "$peak") MiB"
}
read -r -a targs <<< "$tests"
for r in $(seq 1 "$rounds"); do
  for p in $pairs; do
    g=${p%%:*}
    n=${p##*:}
    measure "llama-ncmoe$n-r$r" "$lb" -m "$gguf" -ngl 99 -fa 1 -ncmoe "$n" "${targs[@]}" -r "$repeats" -o json
    measure "qwenrt-cache$g-r$r" "$q" bench -m "$gguf" --backend "$backend" "${targs[@]}" -b 0 \
      -r "$repeats" --expert-cache "$g" --json
    if [ "${HOST_OFF:-1}" = 1 ]; then
      QWENRT_CUDA_EXPERT_HOST=0 measure "qwenrt-file-cache$g-r$r" "$q" bench -m "$gguf" \
        --backend "$backend" "${targs[@]}" -b 0 -r "$repeats" --expert-cache "$g" --json
    fi
  done
done
python3 bench/h200/expert_stream_report.py "$raw" --pairs "$pairs" --rounds "$rounds" \
  --command "bash bench/h200/expert_stream.sh \"$pairs\" (LIKE=$like QUANT=$quant TESTS=\"$tests\" REPEATS=$repeats ROUNDS=$rounds${LAYERS:+ LAYERS=$LAYERS})" \
  --gpu "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null | head -1)" \
  > "$out/expert-stream.md" && cat "$out/expert-stream.md"
tar -C /tmp -cJf "$out/expert-stream-raw.tar.xz" expert-stream-raw
