#!/usr/bin/env bash
# Aggregate decode side by side on the H200, in one device call: qwenrt bench -b and llama.cpp's
# llama-batched-bench (the pinned sdist's source, built here in the background) on the same
# full-size synthetic 35B-A3B and 27B Q4_K_M files. Run ON the H200 from the repository root with
# the carried qwenrt build in build-cuda/, its libraries in .carry/lib and the sources from
# bench/pack_llamacpp_src.sh in .carry/llamacpp-src.tar.xz. Results (logs) under $OUT.
#
# Both decode after a 256-token prompt per sequence: llama-batched-bench -npp 256 -ntg 64
# (its S_TG t/s: aggregate decode tok/s) and qwenrt bench -d 256 -n 64 -b ... (tgN @ d256 xB).
# qwenrt runs while llama.cpp builds (on the CPU; qwenrt's steps are CUDA graph replays).
#   bash bench/h200/batched_side_by_side.sh [BATCHES]    (default 8,16,32,64)
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
batches=${1:-8,16,32,64}
export LD_LIBRARY_PATH=$PWD/.carry/lib
q=build-cuda/qwenrt
ldir=/tmp/bsb-llamacpp
mkdir -p "$ldir"
start=$(date +%s)
(
  tar xJf .carry/llamacpp-src.tar.xz -C "$ldir" &&
    cmake -S "$ldir/llama.cpp" -B "$ldir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > /dev/null &&
    nice -n 19 cmake --build "$ldir/build" --target llama-batched-bench -j "$(($(nproc) - 2))"
) > "$out/llamacpp-build.log" 2>&1 &
build=$!
for m in 35B-A3B 27B; do
  $q synth --like Qwen3.6-$m --quant Q4_K_M --out /tmp/bsb-$m.gguf > /dev/null
done
for m in 35B-A3B 27B; do
  echo "== qwenrt $m (+$(( $(date +%s) - start )) s)"
  $q bench -m /tmp/bsb-$m.gguf -p 1 -n 64 -d 256 -b "$batches" -r 3 2>&1 | tee "$out/qwenrt-$m.txt"
done
echo "== qwenrt 35B-A3B x64, grouped MoE GEMMs from 128 rows"
QWENRT_CUDA_GROUPED_ROWS=128 $q bench -m /tmp/bsb-35B-A3B.gguf -p 1 -n 64 -d 256 -b 64 -r 3 2>&1 |
  tee "$out/qwenrt-35B-A3B-grouped128.txt" | grep -E 'x64|rror'
wait $build; echo "llama.cpp build rc=$? (+$(( $(date +%s) - start )) s)"
lb=$ldir/build/bin/llama-batched-bench
for m in 35B-A3B 27B; do
  echo "== llama-batched-bench $m (+$(( $(date +%s) - start )) s)"
  timeout 120 $lb -m /tmp/bsb-$m.gguf -ngl 99 -fa on -c 33000 -npp 256 -ntg 64 -npl "$batches" 2>&1 |
    tee "$out/llamacpp-$m.txt" | grep -E '^\|'
done
echo "done (+$(( $(date +%s) - start )) s)"
