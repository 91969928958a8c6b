#!/usr/bin/env bash
# KL divergence of a fast qwenrt backend (cpu or cuda) and of llama.cpp to qwenrt's reference
# backend, on the same GGUF files and text (bench/results/kld-cpu-vs-llamacpp.md).
#
#   tools/kld/run.sh QWENRT LLAMA_PERPLEXITY OUTDIR [MODEL.gguf ...]
#
# QWENRT: a qwenrt binary; LLAMA_PERPLEXITY: llama.cpp's llama-perplexity; OUTDIR: where the logits,
# base files and logs go (an ignored folder, e.g. build-kld/out; the .npy/.kld files there are
# megabytes each). Models: the three tiny trained files by default. Text: the held-out stories of
# tools/train/corpus.py, 8 chunks of 512, second halves scored. Python: $PYTHON (numpy only).
#
# Environment (defaults: the CPU measurement of the results file):
#   BACKEND=cpu     the qwenrt backend under test (cpu, cuda); the reference is always --backend ref
#   THREADS=2       -t of that backend and of llama-perplexity
#   LLAMA_ARGS=     extra llama-perplexity arguments, word-split (e.g. "-ngl 99" for its CUDA build)
#   CHUNKS=8        chunks of 512 tokens
#   TEXT=           the held-out text file; unset: written by tools/train/corpus.py (which needs
#                   jinja2, i.e. the project's .venv) to OUTDIR/heldout-stories.txt
#   RESULTS=OUTDIR  where kld-summary.json, kld-summary.md and kld-logs.tar.xz (logs, check JSONs,
#                   token ids; no logits) are written: three small files
#   PARALLEL=       1: the reference passes of all models run at once in the background (one
#                   thread each) while llama.cpp's own-base checks run; 0: one thing at a time.
#                   Default 1 with 8 or more CPUs, else 0.
#   CHECKS=1        0 skips the sanity checks (llama.cpp's own base, round trips, format floor)
#   NICE=10         nice level of every step; PYTHON=python3
#
# Time: the reference backend (scalar oracle, one thread) is the slow part. One reference pass with
# CHUNKS=4 took 20 s wall (13 s CPU) for qwen35-chat-tiny.Q8_0 and 26 s wall (16 s CPU) for
# qwen35moe-chat-tiny.Q4_K_M on the shared 2-CPU AMD EPYC of the results file (load 16-48); it grows
# with CHUNKS (about twice that at 8). With PARALLEL=1 the three models' passes run side by side.
#
# GPU run (the device's python3 has numpy, not the project's .venv: pass the text a run here wrote,
# so that it is the same bytes, and carry it, build-cuda, .carry and llama.cpp's CUDA build; OUTDIR
# off $OUT, where only RESULTS' three files go):
#   LD_LIBRARY_PATH=$PWD/.carry/lib BACKEND=cuda THREADS=8 LLAMA_ARGS="-ngl 99" \
#     TEXT=build-kld/heldout-stories.txt RESULTS=$OUT PYTHON=python3 \
#     tools/kld/run.sh build-cuda/qwenrt LLAMA_PERPLEXITY /tmp/kld
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ $# -lt 3 ]; then sed -n '/^set -euo/q;2,$p' "$0" >&2; exit 2; fi
qwenrt=$(realpath "$1"); llama=$(realpath "$2"); out=$3; shift 3
models=()
for m in "$@"; do models+=("$(realpath "$m")"); done
[ ${#models[@]} -gt 0 ] || models=("$root"/models/qwen35-chat-tiny.Q8_0.gguf
  "$root"/models/qwen35-chat-tiny.Q4_K_M.gguf "$root"/models/qwen35moe-chat-tiny.Q4_K_M.gguf)
py=$(command -v "${PYTHON:-python3}"); py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"
backend=${BACKEND:-cpu}; threads=${THREADS:-2}; chunks=${CHUNKS:-8}; ctx=512
checks=${CHECKS:-1}; nice_n=${NICE:-10}
read -ra largs <<< "${LLAMA_ARGS:-}"
if [ -z "${PARALLEL:-}" ]; then
  PARALLEL=0; [ "$(nproc)" -ge 8 ] && PARALLEL=1
fi
[ "$backend" != ref ] || { echo "BACKEND=ref: the reference is what the backend is measured against" >&2; exit 2; }
mkdir -p "$out"; out=$(realpath "$out")
results=${RESULTS:-$out}; mkdir -p "$results"; results=$(realpath "$results")
text=$out/heldout-stories.txt
if [ -n "${TEXT:-}" ]; then
  src=$(realpath "$TEXT"); [ "$src" = "$text" ] || cp "$src" "$text"
else
  (cd "$root/tools/train" && nice -n "$nice_n" "$py" -c "
import sys, corpus
open(sys.argv[1], 'w', encoding='utf-8').write(corpus.eval_sets()['story_text'])" "$text")
fi
: > "$out/timings.txt"
# timed NAME CMD...: runs CMD under nice, appends its wall time to timings.txt
timed() {
  local name=$1 t0 ms rc=0; shift; t0=$(date +%s%N)
  nice -n "$nice_n" "$@" || rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s %d.%03d s rc %d\n' "$name" $((ms / 1000)) $((ms % 1000)) $rc >> "$out/timings.txt"
  return $rc
}
check() { nice -n "$nice_n" "$py" "$here/kld_check.py" "$@"; }
# llama-perplexity's asynchronous log sometimes loses its last lines at exit: run again until the
# closing statistics are there.
llama_kl() {  # NAME MODEL BASE LOG
  for _ in 1 2 3 4 5; do
    timed "$1" "$llama" -m "$2" -c $ctx -b $ctx -t "$threads" "${largs[@]}" \
      --kl-divergence-base "$3" --kl-divergence > "$4" 2>&1 || true
    grep -q "Same top p:" "$4" && return 0
  done
  echo "llama-perplexity: no statistics in $4" >&2; return 1
}
name() { basename "$1" .gguf; }
ref_pass() {  # MODEL: the reference logits (scalar oracle, one thread)
  local m; m=$(name "$1")
  timed "ref-$m" "$qwenrt" perplexity --backend ref -m "$1" -f "$text" --ctx $ctx --chunks "$chunks" \
    --save-logits "$out/ref-$m.npy" > "$out/ref-$m.log" 2>&1
}
llama_self() {  # MODEL: llama.cpp's own base (its tokens, the format round trip, itself against it)
  local m; m=$(name "$1")
  timed "llama-base-$m" "$llama" -m "$1" -f "$text" -c $ctx -b $ctx -t "$threads" "${largs[@]}" \
    --chunks "$chunks" --kl-divergence-base "$out/llama-$m.kld" > "$out/llama-base-$m.log" 2>&1
  check tokens "$out/ids-$m.txt" "$out/llama-$m.kld" > "$out/check-tokens-$m.json"
  check roundtrip "$out/llama-$m.kld" > "$out/check-roundtrip-$m.json"
  llama_kl "llama-vs-self-$m" "$1" "$out/llama-$m.kld" "$out/llama-vs-self-$m.log"
  check decode "$out/llama-$m.kld" "$out/llama-$m.npy" > /dev/null
  nice -n "$nice_n" "$py" "$here/to_llamacpp_kl_base.py" --logits "$out/llama-$m.npy" \
    --tokens "$out/ids-$m.txt" --ctx $ctx -o "$out/llama-reenc-$m.kld"
  llama_kl "llama-vs-self-reenc-$m" "$1" "$out/llama-reenc-$m.kld" "$out/llama-vs-self-reenc-$m.log"
}
echo "backend $backend, -t $threads, llama-perplexity args '${LLAMA_ARGS:-}', $chunks chunks," \
  "parallel $PARALLEL, checks $checks, out $out, results $results"
for model in "${models[@]}"; do
  m=$(name "$model")
  nice -n "$nice_n" "$qwenrt" tokenize -m "$model" "$(cat "$text")" > "$out/ids-$m.txt"
done
# 1. reference logits; with PARALLEL=1 all models at once, llama.cpp's own-base checks meanwhile
pids=()
for model in "${models[@]}"; do
  if [ "$PARALLEL" = 1 ]; then ref_pass "$model" & pids+=($!); else ref_pass "$model"; fi
done
if [ "$checks" = 1 ]; then for model in "${models[@]}"; do llama_self "$model"; done; fi
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ $fail = 0 ] || { echo "a reference pass failed: $out/ref-*.log" >&2; exit 1; }
for model in "${models[@]}"; do
  m=$(name "$model")
  echo "== $m"
  # 2. the backend under test against the reference logits
  timed "$backend-$m" "$qwenrt" perplexity --backend "$backend" -t "$threads" -m "$model" -f "$text" \
    --ctx $ctx --chunks "$chunks" --kl-base "$out/ref-$m.npy" --save-logits "$out/$backend-$m.npy" \
    > "$out/$backend-$m.log" 2>&1
  # 3. llama.cpp against the same reference logits, converted to its base format
  nice -n "$nice_n" "$py" "$here/to_llamacpp_kl_base.py" --logits "$out/ref-$m.npy" \
    --tokens "$out/ids-$m.txt" --ctx $ctx -o "$out/ref-$m.kld"
  llama_kl "llama-vs-ref-$m" "$model" "$out/ref-$m.kld" "$out/llama-vs-ref-$m.log"
  # the backend's KLD recomputed from the two logits files; as llama.cpp computes it against the
  # uint16 base; the format's floor (the reference against its own uint16 encoding); the backend
  # and llama.cpp per position on llama.cpp's support (reference log p > -16): the paired difference
  check exact "$out/ref-$m.npy" "$out/$backend-$m.npy" > "$out/check-exact-$backend-$m.json"
  check llamacpp "$out/ref-$m.kld" "$out/$backend-$m.npy" > "$out/check-llamacpp-$backend-$m.json"
  if [ "$checks" = 1 ]; then
    check llamacpp "$out/ref-$m.kld" "$out/ref-$m.npy" > "$out/check-floor-$m.json"
    check llamacpp "$out/llama-$m.kld" "$out/ref-$m.npy" > "$out/check-ref-vs-llamabase-$m.json"
    check paired --name "$backend" "$out/ref-$m.npy" "$out/$backend-$m.npy" "$out/llama-$m.kld" \
      > "$out/check-paired-$backend-$m.json"
  fi
  grep -E "^PPL|KLD|top-1" "$out/$backend-$m.log"
  grep -E "Mean PPL\(Q\)  |Mean +KLD|99.0% +KLD|Same top p:" "$out/llama-vs-ref-$m.log"
done
# the results: a summary (JSON and markdown) and the logs, small enough to come back from a device
{ uname -a; echo "nproc $(nproc)"; command -v nvidia-smi > /dev/null && nvidia-smi -L || true
  echo "qwenrt $qwenrt"; echo "llama-perplexity $llama"; sha256sum "$text"; } \
  > "$out/environment.txt" 2>&1
names=(); for model in "${models[@]}"; do names+=("$(name "$model")"); done
"$py" "$here/summarize.py" "$out" --backend "$backend" --threads "$threads" --chunks "$chunks" \
  --llama-args="${LLAMA_ARGS:-}" --json "$results/kld-summary.json" --md "$results/kld-summary.md" \
  "${names[@]}"
z=xz; command -v xz > /dev/null || z=gzip  # kld-logs.tar.gz where xz is missing
logs=$results/kld-logs.tar.${z/gzip/gz}
(cd "$out" && tar -c heldout-stories.txt environment.txt timings.txt ids-*.txt ./*.log ./*.json \
  | "$z" -9 > "$logs")
size=$(stat -c %s "$logs")
if [ "$size" -gt $((16 * 1024 * 1024)) ]; then
  echo "$logs is $size bytes, over 16 MiB: removed" >&2; rm "$logs"
fi
cat "$results/kld-summary.md"
