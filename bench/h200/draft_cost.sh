#!/usr/bin/env bash
# What MTP drafting costs on the H200 against a plain decode step: plain decode, speculative
# checks of 2 / 4 / 8 rows and chained MTP drafts with every id and with the first 65,536
# (--draft-vocab), at batch 1, on full-size synthetic Q4_K_M files with an MTP block, each setting
# in the same call. The implied speed-up at k drafts is tokens a check / (check cost + k x draft
# cost), costs in plain steps (bench/results/h200-check-cost.md, draft-vocab.md).
# Run ON the H200 from the repository root with the binaries in build-cuda/ and their libraries
# in .carry/lib. Logs under $OUT.
#   bash bench/h200/draft_cost.sh          (MODELS: default "27B 35B-A3B"; VOCABS: "0 65536")
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.carry/lib
q=build-cuda/qwenrt
for m in ${MODELS:-27B 35B-A3B}; do
  f=/tmp/draft-$m.gguf
  $q synth --like Qwen3.6-$m --quant Q4_K_M --mtp --out $f > /dev/null
  for v in ${VOCABS:-0 65536}; do
    echo "== $m Q4_K_M + MTP, --draft-vocab $v"
    timeout 200 $q bench -m $f --backend cuda -p 1 -n 32 -d 256 -b 0 --check-rows 2,4,8 \
      --mtp-drafts --draft-vocab $v -r 3 2>&1 | tee -a "$out/draft-cost-$m.txt" | grep -E "tg|rror"
  done
  rm -f $f
done
