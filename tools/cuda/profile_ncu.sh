#!/usr/bin/env bash
# On the GPU machine: kernel times of one decode step of full-size synthetic files under ncu
# (graphs off; every kernel of the step timed alone). NCU_CACHE=none keeps the caches warm between
# kernels (as in a real step: activations stay in L2; the weights do not fit it either way);
# the default flushes them. Results in $OUT/ncu-*.txt: time per kernel name, then one whole step
# (from one greedy pick to the next) in launch order.
#   bash tools/cuda/profile_ncu.sh [35b] [27b]
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=build-cuda/qwenrt
for m in "$@"; do
  case $m in
    35b) like=Qwen3.6-35B-A3B; skip=1500; count=1500 ;;
    27b) like=Qwen3.6-27B; skip=2000; count=2000 ;;
  esac
  f=/tmp/prof-$m.gguf
  $B synth --like $like --quant Q4_K_M --out $f > /dev/null
  QWENRT_CUDA_GRAPHS=0 timeout 280 ncu --clock-control none --cache-control "${NCU_CACHE:-all}" \
    --metrics gpu__time_duration.sum --csv --launch-skip $skip --launch-count $count \
    $B bench -m $f -p 1 -n 8 -b 0 -r 1 > /tmp/ncu-$m.csv 2> /tmp/ncu-$m.err
  python3 tools/cuda/ncu_summary.py /tmp/ncu-$m.csv --step greedy_combine > "$out/ncu-$m.txt"
  head -45 "$out/ncu-$m.txt"
  tail -3 /tmp/ncu-$m.err
  rm -f $f
done
