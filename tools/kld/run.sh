#!/usr/bin/env bash
# KL divergence of the cpu backend and of llama.cpp to qwenrt's reference backend, on the same
# GGUF files and text (bench/results/kld-cpu-vs-llamacpp.md).
#
#   tools/kld/run.sh QWENRT LLAMA_PERPLEXITY OUTDIR [MODEL.gguf ...]
#
# QWENRT: a qwenrt binary; LLAMA_PERPLEXITY: llama.cpp's llama-perplexity; OUTDIR: where the logits,
# base files and logs go (an ignored folder, e.g. build-kld/out). Models: the three tiny trained
# files by default. Text: the held-out stories of tools/train/corpus.py (written to
# OUTDIR/heldout-stories.txt), 8 chunks of 512, second halves scored. Python: $PYTHON (numpy).
# Everything runs under nice with at most 2 threads.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
qwenrt=$(realpath "$1"); llama=$(realpath "$2"); out=$3; shift 3
models=("$@")
[ ${#models[@]} -gt 0 ] || models=("$root"/models/qwen35-chat-tiny.Q8_0.gguf
  "$root"/models/qwen35-chat-tiny.Q4_K_M.gguf "$root"/models/qwen35moe-chat-tiny.Q4_K_M.gguf)
py=$(command -v "${PYTHON:-python3}"); py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"
ctx=512; chunks=8
mkdir -p "$out"; out=$(realpath "$out")
text=$out/heldout-stories.txt
(cd "$root/tools/train" && nice -n 10 "$py" -c "
import sys, corpus
open(sys.argv[1], 'w', encoding='utf-8').write(corpus.eval_sets()['story_text'])" "$text")
check() { nice -n 10 "$py" "$here/kld_check.py" "$@"; }
# llama-perplexity's asynchronous log sometimes loses its last lines at exit: run again until the
# closing statistics are there.
llama_kl() {  # MODEL BASE LOG
  for _ in 1 2 3 4 5; do
    nice -n 10 "$llama" -m "$1" -c $ctx -b $ctx -t 2 --kl-divergence-base "$2" --kl-divergence \
      > "$3" 2>&1
    grep -q "Same top p:" "$3" && return 0
  done
  echo "llama-perplexity: no statistics in $3" >&2; return 1
}
for model in "${models[@]}"; do
  m=$(basename "$model" .gguf)
  echo "== $m"
  nice -n 10 "$qwenrt" tokenize -m "$model" "$(cat "$text")" > "$out/ids-$m.txt"
  # 1. reference logits (scalar oracle)
  nice -n 10 "$qwenrt" perplexity --backend ref -m "$model" -f "$text" --ctx $ctx --chunks $chunks \
    --save-logits "$out/ref-$m.npy" > "$out/ref-$m.log" 2>&1
  # 2. the cpu backend against them
  nice -n 10 "$qwenrt" perplexity --backend cpu -t 2 -m "$model" -f "$text" --ctx $ctx \
    --chunks $chunks --kl-base "$out/ref-$m.npy" --save-logits "$out/cpu-$m.npy" \
    > "$out/cpu-$m.log" 2>&1
  # 3. llama.cpp against the same reference logits, converted to its base format
  nice -n 10 "$py" "$here/to_llamacpp_kl_base.py" --logits "$out/ref-$m.npy" \
    --tokens "$out/ids-$m.txt" --ctx $ctx -o "$out/ref-$m.kld"
  llama_kl "$model" "$out/ref-$m.kld" "$out/llama-vs-ref-$m.log"
  # sanity checks: llama.cpp's own base (its tokens, the format round trip, itself against it)
  nice -n 10 "$llama" -m "$model" -f "$text" -c $ctx -b $ctx -t 2 --chunks $chunks \
    --kl-divergence-base "$out/llama-$m.kld" > "$out/llama-base-$m.log" 2>&1
  check tokens "$out/ids-$m.txt" "$out/llama-$m.kld" > "$out/check-tokens-$m.json"
  check roundtrip "$out/llama-$m.kld" > "$out/check-roundtrip-$m.json"
  llama_kl "$model" "$out/llama-$m.kld" "$out/llama-vs-self-$m.log"
  check decode "$out/llama-$m.kld" "$out/llama-$m.npy" > /dev/null
  nice -n 10 "$py" "$here/to_llamacpp_kl_base.py" --logits "$out/llama-$m.npy" \
    --tokens "$out/ids-$m.txt" --ctx $ctx -o "$out/llama-reenc-$m.kld"
  llama_kl "$model" "$out/llama-reenc-$m.kld" "$out/llama-vs-self-reenc-$m.log"
  # the cpu backend's KLD recomputed from the two logits files; as llama.cpp computes it against
  # the uint16 base; and the format's floor (the reference against its own uint16 encoding)
  check exact "$out/ref-$m.npy" "$out/cpu-$m.npy" > "$out/check-exact-cpu-$m.json"
  check llamacpp "$out/ref-$m.kld" "$out/cpu-$m.npy" > "$out/check-llamacpp-cpu-$m.json"
  check llamacpp "$out/ref-$m.kld" "$out/ref-$m.npy" > "$out/check-floor-$m.json"
  check llamacpp "$out/llama-$m.kld" "$out/ref-$m.npy" > "$out/check-ref-vs-llamabase-$m.json"
  # cpu and llama.cpp per position on llama.cpp's support (reference log p > -16): the paired difference
  check paired "$out/ref-$m.npy" "$out/cpu-$m.npy" "$out/llama-$m.kld" > "$out/check-paired-$m.json"
  grep -E "^PPL|KLD|top-1" "$out/cpu-$m.log"
  grep -E "Mean PPL\(Q\)  |Mean +KLD|99.0% +KLD|Same top p:" "$out/llama-vs-ref-$m.log"
done
