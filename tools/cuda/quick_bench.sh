# One device call of the session's CUDA work: the CUDA tests, the GEMV micro-benchmark, and batch-1
# decode on full-size synthetic 35B-A3B and 27B Q4_K_M files (graphs on), each decode run once per
# kernel variant (the environment switches of ops/cuda/README.md) in the same call, so their
# ratios compare like with like. Results (full logs) under $OUT.
#   bash tools/cuda/quick_bench.sh [variants...]   e.g. "QWENRT_CUDA_RESIDENT=0" "QWENRT_CUDA_PDL=0"
#   TEST_FILTER=... narrows the tests; PREFILL_VARIANTS="X=0 ..." adds 4,096-token prefills;
#   BENCH_ARGS replaces the decode run's bench arguments (default "-p 512 -n 128 -d 512 -b 0 -r 3",
#   e.g. "-p 1 -n 32 -b 1,8,32,64 --check-rows 2,5 -r 3" for aggregate decode and checks);
#   GEMV_ROWS sets the micro-benchmark's row counts (default 1,4,8), GEMV_TYPES its types.
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib; B=build-cuda/qwenrt
# The test binary has the source folder it was built in compiled in (for its fixtures).
src_dir=$(strings build-cuda/qwenrt_tests | grep -m1 -E '^/.*/src/ops/cuda/cuda_ops.cpp$' | sed 's#/src/ops/cuda/cuda_ops.cpp$##')
if [ -n "$src_dir" ] && [ ! -e "$src_dir" ]; then mkdir -p "$(dirname "$src_dir")"; ln -s "$PWD" "$src_dir"; fi
# TEST_FILTER (a gtest filter) narrows the tests; TEST_FILTER=none skips them.
filter=${TEST_FILTER:-'*Cuda*:*cuda*'}
if [ "$filter" != none ]; then
  timeout 300 build-cuda/qwenrt_tests --gtest_filter="$filter" 2>&1 | tee "$out/tests-cuda.log" |
    grep -E "FAILED|PASSED|cuda e2e|Failure|exception|cuda moe" | head -60
fi
variants=("default" "$@")
for v in "${variants[@]}"; do
  echo "== GEMV micro-benchmark, $v"
  if [ "$v" = default ]; then env_args=(); else env_args=("$v"); fi
  env "${env_args[@]}" QWENRT_BENCH_TYPES="${GEMV_TYPES:-}" timeout 150 build-cuda/cuda_gemv_bench 20 \
    "${GEMV_ROWS:-1,4,8}" 2>&1 | tee -a "$out/gemv-bench.txt" | grep -E "type|Q4_K|Q8_0|Q6_K"
done
for model in 35B-A3B 27B; do
  f=/tmp/s-$model.gguf; $B synth --like Qwen3.6-$model --quant Q4_K_M --out $f >/dev/null
  for v in "${variants[@]}"; do
    echo "== $model Q4_K_M, $v"
    if [ "$v" = default ]; then env_args=(); else env_args=("$v"); fi
    # shellcheck disable=SC2086
    env "${env_args[@]}" QWENRT_LOG=info $B bench -m $f ${BENCH_ARGS:--p 512 -n 128 -d 512 -b 0 -r 3} \
      2>&1 | tee -a "$out/bench-$model.txt" | grep -E "captured|pp|tg|load|rror"
  done
  # PREFILL_VARIANTS="A=0 B=0": a 4,096-token prefill once as built and once per variant.
  if [ -n "${PREFILL_VARIANTS:-}" ]; then
    for v in default $PREFILL_VARIANTS; do
      echo "== $model Q4_K_M prefill, $v"
      if [ "$v" = default ]; then env_args=(); else env_args=("$v"); fi
      env "${env_args[@]}" $B bench -m $f -p 4096 -n 1 -b 0 -r 3 2>&1 |
        tee -a "$out/prefill-$model.txt" | grep -E "pp4096|rror"
    done
  fi
  rm -f $f
done
