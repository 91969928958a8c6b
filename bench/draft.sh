#!/usr/bin/env bash
# Speculative decoding on the BACKEND backend (default cpu): end-to-end decode tok/s and acceptance
# with and without n-gram or MTP drafting, on the tiny trained models, for chat, arithmetic and
# code-like prompts (greedy, thinking off). Each configuration runs REPEATS times in alternation;
# the table gives medians.
# MODES picks the configurations: none, ngramK (--draft ngram --draft-max K), mtpK (--draft mtp
# --draft-max K), mtpKvN (--draft mtp --draft-max K --draft-vocab N); default "none ngram2 ngram4".
#   bash bench/draft.sh [qwenrt binary] [threads] [repeats] > bench/results/draft-cpu.md
#   MODES="none mtp1 mtp2 mtp4" bash bench/draft.sh build/qwenrt 1 5
#   BACKEND=cuda REV=<commit> bash bench/draft.sh build-cuda/qwenrt 1 3   (on the GPU machine,
#                                                                       whose copy has no .git)
set -euo pipefail
bin=${1:-build/qwenrt}
threads=${2:-1}
repeats=${3:-5}
backend=${BACKEND:-cpu}
read -r -a modes <<< "${MODES:-none ngram2 ngram4}"
models=(models/qwen35-chat-tiny.Q8_0.gguf models/qwen35moe-chat-tiny.Q4_K_M.gguf)
declare -A prompts=(
  [chat]="Tell me a short story about a cat who wants to see the sea."
  [arith]="What is 12 plus 30? Then what is 42 plus 30? Then 72 plus 30?"
  [code]="Write a python function that adds two numbers, then write the same function again with type hints and a docstring."
  [quote]="Repeat this sentence three times: the quick brown fox jumps over the lazy dog near the river bank."
)
echo "# Speculative decoding on the $backend backend (${modes[*]})"
echo
echo "\`MODES=\"${modes[*]}\" BACKEND=$backend bash bench/draft.sh $bin $threads $repeats\` on $(nproc) cores, $(date -u +%Y-%m-%d), git $(git rev-parse --short HEAD 2>/dev/null || echo "${REV:-unknown (no .git here: REV=... names it)}")."
echo "Greedy, --no-think, -n 200, --backend $backend -t $threads; medians of $repeats alternating runs."
echo
echo "| model | prompt | draft | tok/s | drafted | accepted | rate | speedup |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
for m in "${models[@]}"; do
  for p in chat arith code quote; do
    plain_med=0
    for mode in "${modes[@]}"; do : > /tmp/draft-$mode.txt; done
    for ((r = 0; r < repeats; ++r)); do
      for mode in "${modes[@]}"; do
        case $mode in
          none) args="--draft none" ;;
          ngram*) args="--draft ngram --draft-max ${mode#ngram}" ;;
          mtp*v*) k=${mode#mtp}; args="--draft mtp --draft-max ${k%v*} --draft-vocab ${k#*v}" ;;
          mtp*) args="--draft mtp --draft-max ${mode#mtp}" ;;
          *) echo "unknown mode $mode" >&2; exit 1 ;;
        esac
        line=$($bin run -m "$m" -p "${prompts[$p]}" --no-think --temp 0 -n 200 --backend "$backend" -t "$threads" $args 2>&1 >/dev/null | grep -E '^\[prompt' | tail -1)
        echo "$line" >> /tmp/draft-$mode.txt
      done
    done
    for mode in "${modes[@]}"; do
      tps=$(sed -E 's/.*generated [0-9]+ tokens, ([0-9.]+) tok\/s.*/\1/' /tmp/draft-$mode.txt | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
      dr=$({ grep -oE 'drafted [0-9]+' /tmp/draft-$mode.txt || true; } | head -1 | awk '{print $2}'); dr=${dr:-0}
      ac=$({ grep -oE 'accepted [0-9]+' /tmp/draft-$mode.txt || true; } | head -1 | awk '{print $2}'); ac=${ac:-0}
      [ "$mode" = none ] && plain_med=$tps
      rate=$(awk -v a="$ac" -v d="$dr" 'BEGIN {if (d > 0) printf "%.0f%%", 100 * a / d; else print "-"}')
      sp=$(awk -v t="$tps" -v p="$plain_med" 'BEGIN {printf "%.2fx", t / p}')
      echo "| $(basename "$m" .gguf) | $p | $mode | $tps | $dr | $ac | $rate | $sp |"
    done
  done
done
