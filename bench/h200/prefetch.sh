#!/usr/bin/env bash
# The L2 prefetch of decode weights (ops/cuda/prefetch_schedule.h, QWENRT_CUDA_PREFETCH*) in one
# device call: the cold / warm / prefetched GEMV micro-benchmark (bench/micro/
# cuda_l2_prefetch_bench.cu), then batch-1 decode after a 512-token prompt on full-size synthetic
# 35B-A3B and 27B Q4_K_M files once per setting, ROUNDS times in alternation, the CUDA tests with
# the prefetch on last.
# Run ON the H200 from the repository root with the binaries in build-cuda/ (and a baseline
# qwenrt in build-cuda-base/, if present, run as the setting "base") and their libraries in
# .carry/lib (docs/bench.md "H200 side by side"). Logs under $OUT.
#   bash bench/h200/prefetch.sh [setting...]   (a setting: "default", "base", or VAR=VALUE words)
# MODELS (default "35B-A3B 27B"), ROUNDS (default 2) and TESTS=0 (skip the tests) narrow a call.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib
on="QWENRT_CUDA_PREFETCH=1 QWENRT_CUDA_PREFETCH_EXPERTS=1"
settings=("$@")
if [ ${#settings[@]} -eq 0 ]; then
  settings=(default "$on" QWENRT_CUDA_PREFETCH=1 QWENRT_CUDA_PREFETCH_EXPERTS=1
            QWENRT_CUDA_PREFETCH_EXPERTS=2 "QWENRT_CUDA_PREFETCH=2 QWENRT_CUDA_PREFETCH_EXPERTS=1"
            "$on QWENRT_CUDA_PREFETCH_FORK=0")
  [ -x build-cuda-base/qwenrt ] && settings=(base "${settings[@]}")
fi
run() {  # run SETTING ARGS...: qwenrt ARGS with the setting
  local s=$1; shift
  # shellcheck disable=SC2086  # a setting is one or more VAR=VALUE words
  case $s in
    base) build-cuda-base/qwenrt "$@" ;;
    default) build-cuda/qwenrt "$@" ;;
    *) env $s build-cuda/qwenrt "$@" ;;
  esac
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
timeout 90 build-cuda/cuda_l2_prefetch_bench 40 0,5,10,20 2>&1 | tee "$out/prefetch-micro.txt"
for m in ${MODELS:-35B-A3B 27B}; do
  f=/tmp/prefetch-$m.gguf
  build-cuda/qwenrt synth --like "Qwen3.6-$m" --quant Q4_K_M --out "$f" > /dev/null
  for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
    for s in "${settings[@]}"; do
      echo "== $m Q4_K_M round $r: $s"
      run "$s" bench -m "$f" -p 1 -n 128 -d 512 -b 0 -r 3 2>&1 | tee -a "$out/bench-$m.txt" |
        grep -E "tg128|rror|ailed"
    done
  done
  rm -f "$f"
done
if [ "${TESTS:-1}" != 0 ]; then
  # The test binary has the source folder it was built in compiled in (for its fixtures).
  src_dir=$(strings build-cuda/qwenrt_tests | grep -m1 -E '^/.*/src/ops/cuda/cuda_ops.cpp$' | sed 's#/src/ops/cuda/cuda_ops.cpp$##')
  if [ -n "$src_dir" ] && [ ! -e "$src_dir" ]; then mkdir -p "$(dirname "$src_dir")"; ln -s "$PWD" "$src_dir"; fi
  # shellcheck disable=SC2086
  env $on timeout 300 build-cuda/qwenrt_tests --gtest_filter='*Cuda*:*cuda*:*Prefetch*' \
    > "$out/tests-prefetch.txt" 2>&1
  echo "tests with the prefetch on: exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/tests-prefetch.txt" | tail -20
fi
