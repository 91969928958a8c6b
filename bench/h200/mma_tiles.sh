#!/usr/bin/env bash
# Settings of the tensor-core GEMV (ops/cuda/gemv_mma.cu, 3..32 rows) against each other in one
# device call: the GEMV micro-benchmark, then aggregate decode (x8 / x16 / x32) and speculative
# checks of 2 / 4 / 8 rows on full-size synthetic 27B and 35B-A3B Q4_K_M files, each once per
# setting, in the same call.
# Run ON the H200 from the repository root with the binaries in build-cuda/ and their libraries in
# .carry/lib (docs/bench.md "H200 side by side"). Logs under $OUT.
#   bash bench/h200/mma_tiles.sh [setting...]   (default settings: "default" and
#                                                QWENRT_CUDA_MMA_MT=1; a setting may hold several
#                                                VAR=VALUE words: "A=1 B=2")
# MODELS (default "27B 35B-A3B"), ROWS and TYPES (the micro-benchmark's rows and types, default
# 1,8,16,24 and Q4_K,Q6_K,Q8_0sb) and BENCH (the bench arguments after -m) narrow a call.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib
q=build-cuda/qwenrt
settings=("$@"); [ ${#settings[@]} -gt 0 ] || settings=(default QWENRT_CUDA_MMA_MT=1)
run() {  # run SETTING COMMAND...: the command with the setting's variables (none for "default")
  local s=$1; shift
  # shellcheck disable=SC2086  # a setting is one or more VAR=VALUE words
  if [ "$s" = default ]; then "$@"; else env $s "$@"; fi
}
for s in "${settings[@]}"; do
  echo "== GEMV micro-benchmark, $s"
  run "$s" env QWENRT_BENCH_TYPES=${TYPES:-Q4_K,Q6_K,Q8_0sb} timeout 120 build-cuda/cuda_gemv_bench 20 "${ROWS:-1,8,16,24}" \
    2>&1 | tee -a "$out/gemv-bench.txt" | grep -E "type|Q4_K|Q8_0|Q6_K"
done
for m in ${MODELS:-27B 35B-A3B}; do
  f=/tmp/mma-$m.gguf
  $q synth --like Qwen3.6-$m --quant Q4_K_M --out $f > /dev/null
  for s in "${settings[@]}"; do
    echo "== $m Q4_K_M, $s"
    # shellcheck disable=SC2086
    run "$s" timeout 150 $q bench -m $f ${BENCH:--p 1 -n 32 -d 256 -b 8,16,32 --check-rows 2,4,8 -r 3} \
      2>&1 | tee -a "$out/bench-$m.txt" | grep -E "tg|check|rror"
  done
  rm -f $f
done
