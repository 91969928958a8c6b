# One device call of the session's CUDA work: the CUDA tests, the GEMV micro-benchmark, and batch-1
# decode on full-size synthetic 35B-A3B and 27B Q4_K_M files (graphs on).
export LD_LIBRARY_PATH=$PWD/.carry/lib; B=build-cuda/qwenrt
bash tools/cuda/device_check.sh tests 2>&1 | grep -E "FAILED|PASSED|cuda e2e|Failure|exception|cuda moe" | head -60
timeout 120 build-cuda/cuda_gemv_bench 2>&1 | grep -E "Q4_K|Q6_K|Q8_0|type" | grep -E " 1 |type" | head -20
f=/tmp/s35.gguf; $B synth --like Qwen3.6-35B-A3B --quant Q4_K_M --out $f >/dev/null
QWENRT_LOG=info $B bench -m $f -p 512 -n 128 -d 512 -b 0 -r 3 2>&1 | grep -E "captured|pp512|tg128|load"
rm $f; f=/tmp/s27.gguf; $B synth --like Qwen3.6-27B --quant Q4_K_M --out $f >/dev/null
$B bench -m $f -p 512 -n 128 -d 512 -b 0 -r 3 2>&1 | grep -E "pp512|tg128|load"
