#!/usr/bin/env bash
# On the GPU machine (through the device tool), from the repository root: the CUDA tests, the
# kernel micro-benchmarks and a profile of batch-1 decode on a full-size synthetic file, with the
# binaries built here (build-cuda/, or packed into .carry/bin.tar.xz by tools/cuda/pack_binaries.sh)
# and the shared libraries the GPU image lacks (.carry/lib).
#   bash tools/cuda/device_check.sh [tests] [micro] [profile] [prefill] [memory] [profile4k] [gemm] [timeline] [stalls] [all-tests]
# tests: TEST_FILTER (default '*Cuda*:*cuda*'), TEST_TIMEOUT (s, default 300), TEST_LOG (log name
# suffix) narrow a run.
# prefill: prompt processing (512 and 4,096 tokens) of the 35B-A3B and 27B Q4_K_M files, timed and
# then per op class (QWENRT_CUDA_PROFILE=1).
# Results go to $OUT (the device tool brings them back).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
# Binaries packed by tools/cuda/pack_binaries.sh (libcupti among them, in build-cuda/).
[ -e build-cuda/qwenrt ] || [ ! -f .carry/bin.tar.xz ] || tar xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib:$PWD/build-cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The test binary has the source folder it was built in compiled in (for its fixtures).
src_dir=$(strings build-cuda/qwenrt_tests | grep -m1 -E '^/.*/src/ops/cuda/cuda_ops.cpp$' | sed 's#/src/ops/cuda/cuda_ops.cpp$##')
if [ -n "$src_dir" ] && [ ! -e "$src_dir" ]; then mkdir -p "$(dirname "$src_dir")"; ln -s "$PWD" "$src_dir"; fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
# The tests' verdict again at the very end (the output's tail is what comes back first).
trap 'for f in "$out"/tests-*.log; do [ -f "$f" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$f" | tail -20; done' EXIT
for what in "$@"; do
  case $what in
    tests)
      timeout "${TEST_TIMEOUT:-300}" build-cuda/qwenrt_tests --gtest_filter="${TEST_FILTER:-*Cuda*:*cuda*}" 2>&1 | tee "$out/tests-cuda${TEST_LOG:+-$TEST_LOG}.log" |
        grep -E '^\[  (FAILED|PASSED|  OK) |^\[ RUN|Failure|Expected|Which is|actual|rel|\[cuda|\[parity' | tail -150 ;;
    all-tests)
      timeout 400 build-cuda/qwenrt_tests 2>&1 | tee "$out/tests-all.log" | grep -E '^\[  (FAILED|PASSED) |FAILED' | tail -60 ;;
    micro)
      timeout 200 build-cuda/cuda_gemv_bench 2>&1 | tee "$out/gemv-bench.txt" | tail -60 ;;
    profile)
      f=/tmp/synth35.gguf
      [ -f $f ] || build-cuda/qwenrt synth --like Qwen3.6-35B-A3B --quant Q4_K_M --out $f > /dev/null
      timeout 200 build-cuda/qwenrt bench -m $f --backend cuda -p 512 -n 128 -d 512 -b 0 -r 3 2>&1 | tee "$out/bench35.txt"
      QWENRT_CUDA_PROFILE=1 timeout 200 build-cuda/qwenrt bench -m $f --backend cuda -p 512 -n 64 -d 512 -b 0 -r 1 2>&1 | tee "$out/profile35.txt" ;;
    prefill)
      for m in 35B-A3B 27B; do
        f=/tmp/synth-$m.gguf
        [ -f $f ] || build-cuda/qwenrt synth --like Qwen3.6-$m --quant Q4_K_M --out $f > /dev/null
        timeout 200 build-cuda/qwenrt bench -m $f --backend cuda -p 512,4096 -n 32 -b 0 -r 3 2>&1 | tee "$out/prefill-$m.txt"
        # The same binary with the prefill GEMMs off (the GEMV kernels over chunks of 8 rows).
        QWENRT_CUDA_GEMM_ROWS=0 QWENRT_CUDA_GROUPED_ROWS=0 timeout 200 build-cuda/qwenrt bench -m $f --backend cuda -p 512 -n 32 -b 0 -r 1 2>&1 | tee "$out/prefill-gemv-$m.txt"
        QWENRT_CUDA_PROFILE=1 timeout 200 build-cuda/qwenrt bench -m $f --backend cuda -p 512 -n 1 -b 0 -r 1 2>&1 | tee "$out/prefill-profile-$m.txt"
      done ;;
    memory)
      # Peak GPU memory of a 4,096-token prefill (nvidia-smi every 0.2 s during the process).
      for m in 35B-A3B 27B; do
        f=/tmp/synth-$m.gguf
        [ -f $f ] || build-cuda/qwenrt synth --like Qwen3.6-$m --quant Q4_K_M --out $f > /dev/null
        ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > "$out/mem-$m.txt" &
        sampler=$!
        timeout 200 build-cuda/qwenrt bench -m $f --backend cuda -p 4096 -n 16 -b 0 -r 2 2>&1 | tee "$out/mem-bench-$m.txt"
        kill $sampler
        echo "$m peak GPU MiB: $(sort -n "$out/mem-$m.txt" | tail -1)" | tee -a "$out/mem-summary.txt"
      done ;;
    profile4k)
      # Time per op class of a 4,096-token prefill (QWENRT_CUDA_PROFILE=1: graphs off, events).
      for m in 35B-A3B 27B; do
        f=/tmp/synth-$m.gguf
        [ -f $f ] || build-cuda/qwenrt synth --like Qwen3.6-$m --quant Q4_K_M --out $f > /dev/null
        QWENRT_CUDA_PROFILE=1 timeout 200 build-cuda/qwenrt bench -m $f --backend cuda -p 4096 -n 1 -b 0 -r 1 2>&1 | tee "$out/prefill4k-profile-$m.txt"
      done ;;
    timeline)
      # Kernel by kernel inside the replayed decode step (tools/cuda/timeline.py), with the CUPTI
      # injection library (build-cuda/libqwenrt_timeline.so, libcupti from .carry/lib or build-cuda/); the same
      # bench without it first, so the tracing's own cost shows. BATCH=B (default 0) times the
      # aggregate decode of B sequences instead (the graph replayed last; steps of more than 16
      # rows are not graphs: read the CSV with timeline.py --eager); DEPTH (default 512).
      b=${BATCH:-0}; tag=$([ "$b" = 0 ] && echo "" || echo "-x$b")
      graph=$([ "$b" = 0 ] && echo most || echo last)
      for m in ${MODELS:-35B-A3B 27B}; do
        f=/tmp/synth-$m.gguf
        [ -f $f ] || build-cuda/qwenrt synth --like Qwen3.6-$m --quant Q4_K_M --out $f > /dev/null
        args="-m $f --backend cuda -p 1 -n ${STEPS:-128} -d ${DEPTH:-512} -b $b -r 1"
        timeout 120 build-cuda/qwenrt bench $args 2>&1 | tee "$out/timeline-plain-$m$tag.txt" | tail -3
        CUDA_INJECTION64_PATH=$PWD/build-cuda/libqwenrt_timeline.so QWENRT_TIMELINE=/tmp/timeline-$m$tag.csv \
          timeout 180 build-cuda/qwenrt bench $args 2>&1 | tee "$out/timeline-bench-$m$tag.txt" | tail -3
        python3 tools/cuda/timeline.py /tmp/timeline-$m$tag.csv --graph $graph --layers 40 > "$out/timeline-$m$tag.txt" 2>&1
        head -45 "$out/timeline-$m$tag.txt"
        xz -T4 -c /tmp/timeline-$m$tag.csv > "$out/timeline-$m$tag.csv.xz"
      done ;;
    stalls)
      # Where the 35B-A3B's decode kernels stall (ncu sections, graphs off, caches warm): the norm
      # and routing, the MoE row's two launches, the projection GEMVs and the one-block norm, a
      # few of each from the second token on. KERNELS overrides the name filter (ncu regex).
      f=/tmp/synth-35B-A3B.gguf
      [ -f $f ] || build-cuda/qwenrt synth --like Qwen3.6-35B-A3B --quant Q4_K_M --out $f > /dev/null
      QWENRT_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        --section LaunchStats --section MemoryWorkloadAnalysis --print-details all \
        -k "regex:${KERNELS:-norm_route|resident_two|resident_gemv|rmsnorm_regs}" --launch-skip 400 \
        --launch-count 12 build-cuda/qwenrt bench -m $f -p 1 -n 8 -b 0 -r 1 > "$out/stalls-35B-A3B.txt" 2>&1
      grep -E "^  [a-zA-Z_:]+.*\(|Duration|Warp Cycles Per Issued|Achieved Occupancy|Memory Throughput" \
        "$out/stalls-35B-A3B.txt" | head -60 ;;
    gemm)
      QWENRT_BENCH_TYPES=Q4_K,Q5_K,Q6_K,IQ4_XS,Q8_0sb timeout 200 build-cuda/cuda_gemv_bench 5 32,128,512 2>&1 | tee "$out/gemm-bench.txt"
      QWENRT_CUDA_GEMM_ROWS=0 QWENRT_BENCH_TYPES=Q4_K,Q8_0sb timeout 200 build-cuda/cuda_gemv_bench 3 32,128 2>&1 | tee "$out/gemm-bench-gemv.txt" ;;
  esac
done
