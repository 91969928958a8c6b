#!/usr/bin/env bash
# Speculative decoding across processes on the CPU: each round runs `qwenrt run` (greedy, --no-think,
# -t 1, one chat prompt) three ways in alternation: plain (--draft none), MTP drafting whose step
# costs every process measures afresh (QWENRT_STEP_COSTS=0: it explores) and MTP drafting with the
# step costs persisted in a folder (one untimed run first fills it). Each configuration runs twice
# a round: once for its tok/s, once for its drafted count. Prints "arm tok/s tokens drafted N".
#   R=25 M=models/qwen35-chat-tiny.Q8_0.gguf N=100 bash bench/draft_persist.sh
set -uo pipefail
m=${M:-models/qwen35-chat-tiny.Q8_0.gguf}; n=${N:-100}
p="Tell me a short story about a cat who wants to see the sea."
one() { # $1 = costs dir or 0, rest = draft args
  local dir=$1; shift
  QWENRT_STEP_COSTS=$dir ./build/qwenrt run -m $m --backend cpu -t 1 --temp 0 --no-think -n $n "$@" --prompt "$p" 2>&1 |
    sed -n 's/.*generated \([0-9]*\) tokens, \([0-9.]*\) tok\/s.*/\2 \1/p' | tr '\n' ' '
  QWENRT_STEP_COSTS=$dir ./build/qwenrt run -m $m --backend cpu -t 1 --temp 0 --no-think -n $n "$@" --prompt "$p" 2>&1 | grep -o "drafted [0-9]*" | head -1
}
costs=$(mktemp -d)
one "$costs" --draft mtp > /dev/null
for i in $(seq ${R:-25}); do
  echo "none $(one 0 --draft none)"
  echo "fresh $(one 0 --draft mtp)"
  echo "persist $(one "$costs" --draft mtp)"
done
rm -rf "$costs"
