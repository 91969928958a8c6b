#!/usr/bin/env bash
# Batch-1 decode settings against each other in one device call, and where the decode step's
# time goes inside its CUDA graph: on full-size synthetic Q4_K_M files, `qwenrt bench -p 1 -n 128
# -d 512 -b 0 -r 3` (tg128 after an untimed 512-token prompt, medians of 3) once per setting,
# the settings alternated over ROUNDS rounds; then, for each kernel class in DROP, the same with
# QWENRT_CUDA_DROP=<class> (ops/cuda README: the class left out of the captured graph; the output
# is wrong, the time is the step without that class), under the setting DROP_ENV.
# Run ON the GPU machine from the repository root with the binaries in build-cuda/ (or packed by
# tools/cuda/pack_binaries.sh into .carry/bin.tar.xz) and their libraries in .carry/lib
# (docs/bench.md "H200 side by side"). Logs under $OUT.
#   bash bench/h200/decode_ab.sh [setting...]   (default: "default"; a setting may hold several
#                                               VAR=VALUE words: "A=1 B=2"; BIN=PATH runs that
#                                               qwenrt binary instead of build-cuda's)
# MODELS (default "35B-A3B 27B"), ROUNDS (default 2), DROP (default none), DROP_ENV (default
# none), DROP_MODELS (default: the first of MODELS), BENCH (the bench arguments after -m), KEEP
# (non-empty: the files stay in /tmp for a later step of the same call).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
# Binaries packed by tools/cuda/pack_binaries.sh (build-cuda/, build-base/).
[ -e build-cuda/qwenrt ] || [ ! -f .carry/bin.tar.xz ] || tar xJf .carry/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/lib
q=build-cuda/qwenrt
settings=("$@"); [ ${#settings[@]} -gt 0 ] || settings=(default)
bench=${BENCH:--p 1 -n 128 -d 512 -b 0 -r 3}
run() {  # run SETTING ARGS...: qwenrt ARGS with the setting's variables and binary
  local s=$1 bin=$q w; shift
  local vars=()
  for w in $s; do
    case $w in
      default) ;;
      BIN=*) bin=${w#BIN=} ;;
      *) vars+=("$w") ;;
    esac
  done
  env "${vars[@]}" timeout 150 "$bin" "$@"
}
models=(${MODELS:-35B-A3B 27B})
drop_models=${DROP_MODELS:-${models[0]}}
for m in "${models[@]}"; do
  f=/tmp/ab-$m.gguf  # kept if there already (an earlier step of the same call wrote it)
  [ -f $f ] || $q synth --like Qwen3.6-$m --quant Q4_K_M --out $f > /dev/null
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for s in "${settings[@]}"; do
      echo "== $m Q4_K_M, round $r, $s"
      # shellcheck disable=SC2086
      run "$s" bench -m $f $bench 2>&1 | tee -a "$out/decode-ab-$m.txt" | grep -E "tg|rror"
    done
  done
  if [[ " $drop_models " == *" $m "* ]]; then
    for d in ${DROP:-}; do
      echo "== $m Q4_K_M, ${DROP_ENV:-default}, QWENRT_CUDA_DROP=$d"
      # shellcheck disable=SC2086
      run "${DROP_ENV:-default} QWENRT_CUDA_DROP=$d" bench -m $f $bench 2>&1 |
        tee -a "$out/decode-drop-$m.txt" | grep -E "tg|rror"
    done
  fi
  [ -n "${KEEP:-}" ] || rm -f $f
done
