# One device call of the session's CUDA work: the CUDA tests, the GEMV micro-benchmark, and batch-1
# decode on full-size synthetic 35B-A3B and 27B Q4_K_M files (graphs on), each decode run once per
# kernel variant (the environment switches of ops/cuda/README.md) in the same call, so their
# ratios compare like with like. Results (full logs) under $OUT.
#   bash tools/cuda/quick_bench.sh [variants...]   e.g. "QWENRT_CUDA_RESIDENT=0" "QWENRT_CUDA_PDL=0"
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib; B=build-cuda/qwenrt
bash tools/cuda/device_check.sh tests 2>&1 | grep -E "FAILED|PASSED|cuda e2e|Failure|exception|cuda moe" | head -60
variants=("default" "$@")
for v in "${variants[@]}"; do
  echo "== GEMV micro-benchmark, $v"
  if [ "$v" = default ]; then env_args=(); else env_args=("$v"); fi
  env "${env_args[@]}" timeout 150 build-cuda/cuda_gemv_bench 20 2>&1 | tee -a "$out/gemv-bench.txt" |
    grep -E " 1 |type" | grep -E "type|Q4_K|Q8_0|Q6_K"
done
for model in 35B-A3B 27B; do
  f=/tmp/s-$model.gguf; $B synth --like Qwen3.6-$model --quant Q4_K_M --out $f >/dev/null
  for v in "${variants[@]}"; do
    echo "== $model Q4_K_M, $v"
    if [ "$v" = default ]; then env_args=(); else env_args=("$v"); fi
    env "${env_args[@]}" QWENRT_LOG=info $B bench -m $f -p 512 -n 128 -d 512 -b 0 -r 3 2>&1 |
      tee -a "$out/bench-$model.txt" | grep -E "captured|pp512|tg128|load|rror"
  done
  rm -f $f
done
