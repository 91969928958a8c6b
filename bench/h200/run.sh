#!/usr/bin/env bash
# The H200 side by side: qwenrt's CUDA decode against llama.cpp's llama-bench, on the same
# full-size synthetic GGUFs, on the same machine, in one device call (docs/bench.md,
# "H200 side by side"). Run ON the H200 from the repository root:
#
#   bash bench/h200/run.sh [options]          # results under $OUT (or --out DIR)
#
# Carried in: a prebuilt qwenrt (--qwenrt, default build-cuda/qwenrt), the shared libraries it
# needs that the machine lacks (--lib, default .carry/lib, put on LD_LIBRARY_PATH), and the
# trimmed llama.cpp sources (--src, default .carry/llamacpp-src.tar.xz, from
# bench/pack_llamacpp_src.sh). Nothing is downloaded.
#
# Steps: the llama.cpp CUDA build (llama-bench, llama-batched-bench, llama-perplexity) starts in
# the background (nice 19, on the cores other than 0-1); meanwhile each file is written with
# `qwenrt synth` into --gguf-dir, its tensor table read with `qwenrt info --json` (weight bytes per
# token), and qwenrt measured once on cores 0-1 at depth 0 and at --depth ("qwenrt-during-build",
# "qwenrt-d512-during-build"). Once llama.cpp is built, per file and in this order: a llama-bench
# load probe, llama-bench (-d 0,512), qwenrt at depth 0 ("qwenrt": pp512, tg128) and after an
# untimed 512-token prompt ("qwenrt-d512": tg128 @ d512, `qwenrt bench -d 512`): the figures the
# report uses, no build running. qwenrt's load time is the `load_seconds` its bench JSON reports.
# A file is deleted once measured; the disk holds about two full-size files, so a file that does
# not fit waits for the build and the files before it. GPU memory (nvidia-smi memory.used, every
# 0.5 s) is sampled during every measured process. With --kld, last: tools/kld/run.sh (KL
# divergence of qwenrt's --backend and of llama.cpp's CUDA llama-perplexity to qwenrt's reference
# backend, the three tiny models of models/), its three result files into OUT.
#
# Options:
#   --files LIST      comma-separated, of 35b-q4km 27b-q4km 35b-q8 27b-q8 (default 35b-q4km,27b-q4km);
#                     none: no file (with --kld: only the build of llama-perplexity and the KLD)
#   --layers N        synth only the first N layers (a quick check of this script)
#   --no-llamacpp     qwenrt only: no build, no llama-bench
#   --no-qwenrt       llama.cpp only
#   --batched         also aggregate decode: qwenrt -b 8,32,64 and llama-batched-bench
#                     -npp 256 -ntg 128 -npl 1,8,32,64
#   --repeats R       qwenrt repeats (default 5);  --llama-repeats R  llama-bench's -r (default 3)
#   --backend B       qwenrt --backend (default cuda)
#   --qwenrt-args S   extra arguments for qwenrt bench
#   --qwenrt-tests S  qwenrt bench's test arguments at depth 0 (default "-p 512 -n 128"; -b 0 -r R
#                     --json added)
#   --depth D         qwenrt's second run: decode after an untimed D-token prompt (default 512, the
#                     headline figure; 0: no such run)
#   --qwenrt-depth-tests S   that run's test arguments (default "-p 1 -n 128"; -d D -b 0 -r R
#                     --json added)
#   --llama-tests S   llama-bench's test arguments (default "-p 512 -n 128 -d 0,<depth>")
#   --kld             after the files: tools/kld/run.sh with BACKEND=<--backend> THREADS=8
#                     LLAMA_ARGS="-ngl 99" PARALLEL=1 PYTHON=python3 RESULTS=OUT, the built
#                     llama-perplexity, the three tiny models (needs the llama.cpp build)
#   --kld-text F      its held-out text, carried (default build-kld/heldout-stories.txt, written
#                     here by a CPU run of tools/kld/run.sh: the device has no jinja2)
#   --kld-chunks N    its CHUNKS (default 8);  --kld-threads N  its THREADS (default 8)
#   --kld-dir D       its OUTDIR: logits and logs (default /tmp/h200-kld)
#   --kld-python P    its PYTHON, with numpy (default python3; here: .venv/bin/python)
#   --llamacpp-cuda on|off   GGML_CUDA for the build (default on; off only to test the script)
#   --llamacpp-dir D  where the sources are unpacked and built (default /tmp/h200-llamacpp; a
#                     follow-up call on a still-warm machine reuses an existing build there)
#   --jobs J          build jobs (default: cores - 2)
#   --gguf-dir D      where the synthetic files go (default /tmp)
#   --work D          raw outputs and logs (default /tmp/h200-work)
#   --out D           results (default $OUT)
#   --budget S        seconds: start no new file after S - 150, stop waiting for the build at
#                     S - 60, no quiet run of a file after S - 40, the KLD only with 45 s left
#                     (then stopped at S - 10) (default 570, inside the device tool's 10 minutes)
#   --rev TEXT        what qwenrt was built from (default: `git log -1` when .git is there)
#
# Results under OUT (4 files, 7 with --kld): h200-results.json (everything, report.py collect),
# h200-report.md (report.py render), h200-raw.tar.xz (every command's stdout/stderr/timings/memory
# samples, the tensor tables, the build log, the KLD run's log), h200-run.log; with --kld also
# kld-summary.json, kld-summary.md, kld-logs.tar.xz (tools/kld/run.sh). They are rewritten after
# every step, so a run stopped at its time limit still returns what it measured.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${REPO}" || exit 2

QWENRT=build-cuda/qwenrt
LIBDIR=.carry/lib
SRC_TAR=.carry/llamacpp-src.tar.xz
FILES=35b-q4km,27b-q4km
LAYERS=0
DO_LLAMA=1
DO_QWENRT=1
BATCHED=0
REPEATS=5
LREPEATS=3
BACKEND=cuda
QWENRT_ARGS=""
QWENRT_TESTS="-p 512 -n 128"
DEPTH=512
QWENRT_DTESTS="-p 1 -n 128"
LLAMA_TESTS=""
KLD=0
KLD_TEXT=build-kld/heldout-stories.txt
KLD_CHUNKS=8
KLD_THREADS=8
KLD_DIR=/tmp/h200-kld
KLD_PYTHON=python3
LCUDA=on
LDIR=/tmp/h200-llamacpp
JOBS=""
GGUF_DIR=/tmp
WORK=/tmp/h200-work
RESULTS="${OUT:-}"
BUDGET=570
REV=""
ORIG_ARGS=("$@")

while [[ $# -gt 0 ]]; do
  case "$1" in
    --qwenrt) QWENRT="$2"; shift 2 ;;
    --lib) LIBDIR="$2"; shift 2 ;;
    --src) SRC_TAR="$2"; shift 2 ;;
    --files) FILES="$2"; shift 2 ;;
    --layers) LAYERS="$2"; shift 2 ;;
    --no-llamacpp) DO_LLAMA=0; shift ;;
    --no-qwenrt) DO_QWENRT=0; shift ;;
    --batched) BATCHED=1; shift ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --llama-repeats) LREPEATS="$2"; shift 2 ;;
    --backend) BACKEND="$2"; shift 2 ;;
    --qwenrt-args) QWENRT_ARGS="$2"; shift 2 ;;
    --qwenrt-tests) QWENRT_TESTS="$2"; shift 2 ;;
    --depth) DEPTH="$2"; shift 2 ;;
    --qwenrt-depth-tests) QWENRT_DTESTS="$2"; shift 2 ;;
    --kld) KLD=1; shift ;;
    --kld-text) KLD_TEXT="$2"; shift 2 ;;
    --kld-chunks) KLD_CHUNKS="$2"; shift 2 ;;
    --kld-threads) KLD_THREADS="$2"; shift 2 ;;
    --kld-dir) KLD_DIR="$2"; shift 2 ;;
    --kld-python) KLD_PYTHON="$2"; shift 2 ;;
    --llama-tests) LLAMA_TESTS="$2"; shift 2 ;;
    --llamacpp-cuda) LCUDA="$2"; shift 2 ;;
    --llamacpp-dir) LDIR="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --gguf-dir) GGUF_DIR="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --out) RESULTS="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --rev) REV="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ -n "${RESULTS}" ]] || { echo "run.sh: no \$OUT and no --out" >&2; exit 2; }
[[ "${DEPTH}" =~ ^[0-9]+$ ]] || { echo "run.sh: --depth ${DEPTH}: expected a number" >&2; exit 2; }
if [[ -z "${LLAMA_TESTS}" ]]; then
  LLAMA_TESTS="-p 512 -n 128 -d 0"
  [[ ${DEPTH} -gt 0 ]] && LLAMA_TESTS+=",${DEPTH}"
fi
[[ "${FILES}" == none ]] && FILES=""
if [[ ${KLD} == 1 ]]; then
  [[ ${DO_LLAMA} == 1 ]] || { echo "run.sh: --kld needs the llama.cpp build (no --no-llamacpp)" >&2; exit 2; }
  [[ -f "${KLD_TEXT}" ]] || { echo "run.sh: --kld: no text at ${KLD_TEXT} (--kld-text; carry it)" >&2; exit 2; }
  KLD_TEXT="$(cd "$(dirname "${KLD_TEXT}")" && pwd)/$(basename "${KLD_TEXT}")"
fi

T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
rm -rf "${WORK}"
mkdir -p "${WORK}/files" "${RESULTS}" "${GGUF_DIR}"
RUNLOG="${WORK}/run.log"
log() { echo "[$(date -u +%H:%M:%S) +$(elapsed)s] $*" | tee -a "${RUNLOG}" >&2; }
REPORT=(python3 "${REPO}/bench/h200/report.py")

case "${LIBDIR}" in /*) ;; *) LIBDIR="${REPO}/${LIBDIR}" ;; esac
export LD_LIBRARY_PATH="${LIBDIR}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
# The synthetic files and tensor tables come from qwenrt even in a llama.cpp-only run.
[[ -x "${QWENRT}" ]] || { log "error: no qwenrt at ${QWENRT} (--qwenrt)"; exit 2; }
QWENRT="$(cd "$(dirname "${QWENRT}")" && pwd)/$(basename "${QWENRT}")"

NCPU=$(nproc)
HAVE_TASKSET=0
command -v taskset > /dev/null && [[ ${NCPU} -ge 4 ]] && HAVE_TASKSET=1
QPIN=()    # qwenrt's cores while the build runs
BPIN=()    # the build's cores
if [[ ${HAVE_TASKSET} == 1 ]]; then
  QPIN=(taskset -c "0,1")
  BPIN=(taskset -c "2-$((NCPU - 1))")
fi
JOBS="${JOBS:-$((NCPU > 4 ? NCPU - 2 : NCPU))}"
HAVE_SMI=0
command -v nvidia-smi > /dev/null && HAVE_SMI=1

# --- meta ----------------------------------------------------------------------------------------
meta_set() {  # meta_set KEY JSON_VALUE
  python3 - "${WORK}/meta.json" "$1" "$2" << 'EOF'
import json, os, sys
p, k, v = sys.argv[1], sys.argv[2], sys.argv[3]
m = json.load(open(p)) if os.path.exists(p) else {}
m[k] = json.loads(v)
json.dump(m, open(p, "w"), indent=1)
EOF
}
jstr() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }
note() { log "note: $*"; NOTES+=("$*"); meta_set notes "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${NOTES[@]}")"; }
NOTES=()

if [[ -z "${REV}" ]] && git rev-parse --git-dir > /dev/null 2>&1; then
  REV="$(git log -1 --format='%h %s' 2> /dev/null)$(git diff --quiet HEAD 2> /dev/null || echo ' (+ uncommitted changes)')"
fi
meta_set command "$(jstr "bash bench/h200/run.sh ${ORIG_ARGS[*]}")"
meta_set started "$(jstr "$(date -u '+%Y-%m-%d %H:%M:%S')")"
meta_set git "$(jstr "${REV}")"
meta_set files "$(python3 -c 'import json,sys; print(json.dumps([x for x in sys.argv[1].split(",") if x]))' "${FILES}")"
meta_set depth "${DEPTH}"
meta_set kld "$([[ ${KLD} == 1 ]] && echo true || echo false)"
meta_set llamacpp "$(jstr "$([[ ${DO_LLAMA} == 1 ]] && echo on || echo off)")"
meta_set cpus "${NCPU}"
if [[ ${HAVE_SMI} == 1 ]]; then
  meta_set gpu "$(jstr "$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | head -1)")"
  nvidia-smi > "${WORK}/nvidia_smi.txt" 2>&1
fi
# Library paths inside the repository are written relative to it (results are committed).
ldd "${QWENRT}" 2>&1 | sed "s#${REPO}/#./#g" > "${WORK}/qwenrt_ldd.txt"
if grep -q "not found" "${WORK}/qwenrt_ldd.txt"; then
  log "error: qwenrt misses shared libraries (put them in ${LIBDIR}):"
  grep "not found" "${WORK}/qwenrt_ldd.txt" | tee -a "${RUNLOG}" >&2
  exit 2
fi
[[ ${HAVE_TASKSET} == 1 ]] || note "taskset missing or under 4 cores: qwenrt and the build are not pinned apart"

publish() {  # everything measured so far -> RESULTS (4 files; the KLD adds its own 3)
  meta_set finished "$(jstr "$(date -u '+%Y-%m-%d %H:%M:%S')")"
  [[ -f "${LDIR}/build.log" ]] && tail -c 4000 "${LDIR}/build.log" > "${WORK}/build_log_tail.txt"
  "${REPORT[@]}" collect "${WORK}" > "${RESULTS}/h200-results.json.part" 2>> "${RUNLOG}" &&
    mv "${RESULTS}/h200-results.json.part" "${RESULTS}/h200-results.json"
  "${REPORT[@]}" render "${RESULTS}/h200-results.json" --out "${RESULTS}/h200-report.md" 2>> "${RUNLOG}"
  local extra=()
  [[ -f "${LDIR}/build.log" ]] && cp "${LDIR}/build.log" "${WORK}/llamacpp-build.log" && extra=(llamacpp-build.log)
  [[ -d "${WORK}/kld" ]] && extra+=(kld)
  local txt=() x
  for x in "${WORK}"/*.txt; do [[ -f "${x}" ]] && txt+=("$(basename "${x}")"); done
  tar -C "${WORK}" -cJf "${RESULTS}/h200-raw.tar.xz.part" files meta.json "${extra[@]}" \
    "${txt[@]}" 2>> "${RUNLOG}" &&
    mv "${RESULTS}/h200-raw.tar.xz.part" "${RESULTS}/h200-raw.tar.xz"
  rm -f "${RESULTS}"/*.part
  cp "${RUNLOG}" "${RESULTS}/h200-run.log"
}

# --- measuring one process -----------------------------------------------------------------------
smi_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2> /dev/null; }

measure() {  # measure DIR STEM [PREFIX...] -- CMD...   (PREFIX: e.g. taskset; not shown in .cmd)
  local dir="$1" stem="$2"
  shift 2
  local pre=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do pre+=("$1"); shift; done
  shift
  local shown="$*"
  shown="${shown//"${QWENRT}"/qwenrt}"
  shown="${shown//"${LDIR}/build/bin/"/}"
  shown="${shown//"${GGUF_DIR}/"/}"
  echo "${shown}" > "${dir}/${stem}.cmd"
  [[ ${#pre[@]} -gt 0 ]] && echo "run under: ${pre[*]}" > "${dir}/${stem}.note"
  local spid=""
  if [[ ${HAVE_SMI} == 1 ]]; then
    smi_mem > "${dir}/${stem}.mem0"
    (while :; do smi_mem; sleep 0.5; done) > "${dir}/${stem}.mem" &
    spid=$!
  fi
  log "run ${stem}: ${shown}"
  date +%s.%N > "${dir}/${stem}.time"
  "${pre[@]}" "$@" > "${dir}/${stem}.out" 2> "${dir}/${stem}.err"
  local rc=$?
  date +%s.%N >> "${dir}/${stem}.time"
  echo "${rc}" > "${dir}/${stem}.rc"
  if [[ -n "${spid}" ]]; then kill "${spid}" 2> /dev/null; wait "${spid}" 2> /dev/null; fi
  log "  ${stem}: exit ${rc}, $(python3 -c 'import sys; a,b=open(sys.argv[1]).read().split(); print(f"{float(b)-float(a):.1f}")' "${dir}/${stem}.time") s"
  [[ ${rc} == 0 ]] || tail -n 5 "${dir}/${stem}.err" | sed 's/^/    /' | tee -a "${RUNLOG}" >&2
  return "${rc}"
}

# --- llama.cpp build in the background -----------------------------------------------------------
LB_BIN="${LDIR}/build/bin"
BUILD_PID=""
build_state() {  # none | running | ok | failed
  if [[ ${DO_LLAMA} == 0 ]]; then echo none
  elif [[ -f "${WORK}/llamacpp-build.rc" ]]; then
    [[ "$(cat "${WORK}/llamacpp-build.rc")" == 0 ]] && echo ok || echo failed
  else echo running; fi
}
build_llamacpp() {
  date +%s.%N > "${WORK}/llamacpp-build.time"
  local rc=0
  (
    if [[ ! -f "${LDIR}/llama.cpp/CMakeLists.txt" ]]; then
      mkdir -p "${LDIR}" && tar -xJf "${SRC_TAR}" -C "${LDIR}" || exit 1
    fi
    gen=()
    command -v ninja > /dev/null && gen=(-G Ninja)
    if [[ ! -f "${LDIR}/build/CMakeCache.txt" ]]; then
      cmake -S "${LDIR}/llama.cpp" -B "${LDIR}/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA="$([[ ${LCUDA} == on ]] && echo ON || echo OFF)" -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF || exit 1
    fi
    # shellcheck disable=SC2086
    nice -n 19 "${BPIN[@]}" cmake --build "${LDIR}/build" --target ${TARGETS} -j "${JOBS}" || exit 1
    for t in ${TARGETS}; do [[ -x "${LB_BIN}/${t}" ]] || exit 1; done
  ) >> "${LDIR}/build.log" 2>&1 || rc=1
  date +%s.%N >> "${WORK}/llamacpp-build.time"
  echo "${rc}" > "${WORK}/llamacpp-build.rc"
}
# Without files only llama-perplexity (the KLD) is needed.
TARGETS="llama-perplexity"
[[ -n "${FILES}" ]] && TARGETS="llama-bench llama-batched-bench llama-perplexity"
if [[ ${DO_LLAMA} == 1 ]]; then
  [[ -f "${SRC_TAR}" || -f "${LDIR}/llama.cpp/CMakeLists.txt" ]] ||
    { log "error: no llama.cpp sources at ${SRC_TAR} (bench/pack_llamacpp_src.sh)"; exit 2; }
  mkdir -p "${LDIR}"
  log "llama.cpp build starts in the background (${JOBS} jobs, ${BPIN[*]:-no pinning}, nice 19; log ${LDIR}/build.log)"
  build_llamacpp &
  BUILD_PID=$!
  meta_set llamacpp_build_cmd "$(jstr "cmake -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=$([[ ${LCUDA} == on ]] && echo ON || echo OFF) -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF; cmake --build --target ${TARGETS} -j ${JOBS}")"
fi

wait_build() {  # wait_build: until the build ends or the budget says stop; prints the state
  local s
  while :; do
    s="$(build_state)"
    [[ "${s}" != running ]] && break
    if [[ $(elapsed) -ge $((BUDGET - 60)) ]]; then
      echo timeout
      return
    fi
    sleep 2
  done
  echo "${s}"
}

# --- the files ----------------------------------------------------------------------------------
spec_of() {  # tag -> "like quant est_gb"
  case "$1" in
    35b-q4km) echo "Qwen3.6-35B-A3B Q4_K_M 20.41" ;;
    27b-q4km) echo "Qwen3.6-27B Q4_K_M 19.08" ;;
    35b-q8) echo "Qwen3.6-35B-A3B Q8_0 36.89" ;;
    27b-q8) echo "Qwen3.6-27B Q8_0 28.58" ;;
    *) return 1 ;;
  esac
}
gguf_of() { echo "${GGUF_DIR}/h200-$1.gguf"; }

qwenrt_bench_cmd() {  # extra args after the common ones
  # shellcheck disable=SC2086
  echo "${QWENRT}" bench -m "$1" --backend "${BACKEND}" "${@:2}" ${QWENRT_ARGS}
}

run_qwenrt() {  # run_qwenrt TAG SUFFIX [PREFIX...]: depth 0 ("qwenrt SUFFIX"), then --depth
  local tag="$1" suffix="$2"
  shift 2
  local f d
  f="$(gguf_of "${tag}")"
  d="${WORK}/files/${tag}"
  # shellcheck disable=SC2046
  # shellcheck disable=SC2086
  measure "${d}" "qwenrt${suffix}" "$@" -- $(qwenrt_bench_cmd "${f}" ${QWENRT_TESTS} -b 0 \
    -r "${REPEATS}" --json)
  publish
  if [[ ${DEPTH} -gt 0 ]]; then
    # shellcheck disable=SC2046
    # shellcheck disable=SC2086
    measure "${d}" "qwenrt-d${DEPTH}${suffix}" "$@" -- $(qwenrt_bench_cmd "${f}" ${QWENRT_DTESTS} \
      -d "${DEPTH}" -b 0 -r "${REPEATS}" --json)
    publish
  fi
}

run_quiet() {  # the measurements made with no build running, one file
  local tag="$1" f d
  f="$(gguf_of "${tag}")"
  d="${WORK}/files/${tag}"
  if [[ $(elapsed) -ge $((BUDGET - 40)) ]]; then
    note "time budget: no quiet run of ${tag} at +$(elapsed)s"
    return
  fi
  if [[ "$(build_state)" == ok ]]; then
    measure "${d}" llamacpp-load -- "${LB_BIN}/llama-bench" -m "${f}" -ngl 99 -fa 1 -p 1 -n 0 -r 1 \
      --no-warmup -o json
    # shellcheck disable=SC2086
    measure "${d}" llamacpp -- "${LB_BIN}/llama-bench" -m "${f}" -ngl 99 -fa 1 ${LLAMA_TESTS} \
      -r "${LREPEATS}" -o json
    if [[ ${BATCHED} == 1 ]]; then
      measure "${d}" llamacpp-batched -- "${LB_BIN}/llama-batched-bench" -m "${f}" -ngl 99 -fa on \
        -c 33000 -npp 256 -ntg 128 -npl 1,8,32,64 --output-format jsonl
    fi
    publish
  fi
  if [[ ${DO_QWENRT} == 1 ]]; then
    run_qwenrt "${tag}" ""
    if [[ ${BATCHED} == 1 ]]; then
      # shellcheck disable=SC2046
      measure "${d}" qwenrt-batched -- $(qwenrt_bench_cmd "${f}" -p 1 -n 128 -b 8,32,64 \
        -r "${REPEATS}" --json)
    fi
  fi
  publish
}

PENDING=()
finish_file() {  # measured on both sides (or given up): delete it
  rm -f "$(gguf_of "$1")"
  log "deleted $(gguf_of "$1")"
}
flush_pending() {
  [[ ${#PENDING[@]} -gt 0 ]] || return 0
  log "waiting for the llama.cpp build (pending: ${PENDING[*]})"
  local s p
  s="$(wait_build)"
  log "llama.cpp build: ${s}"
  [[ "${s}" == ok ]] || note "llama.cpp build ${s}: files ${PENDING[*]} measured with qwenrt only"
  for p in "${PENDING[@]}"; do
    run_quiet "${p}"
    finish_file "${p}"
  done
  PENDING=()
}

free_gb() { df -B1 --output=avail "${GGUF_DIR}" | tail -1 | awk '{printf "%.1f", $1 / 1e9}'; }

TAGS=()
[[ -n "${FILES}" ]] && IFS=, read -r -a TAGS <<< "${FILES}"
for tag in "${TAGS[@]}"; do
  spec="$(spec_of "${tag}")" || { note "unknown file tag ${tag} (skipped)"; continue; }
  read -r like quant est <<< "${spec}"
  if [[ $(elapsed) -ge $((BUDGET - 150)) ]]; then
    note "time budget: ${tag} not started at +$(elapsed)s"
    continue
  fi
  nl=64; [[ "${like}" == *35B* ]] && nl=40
  need=$(python3 -c "import sys; l,n,e=int(sys.argv[1]),int(sys.argv[2]),float(sys.argv[3]); print(round((e if l == 0 else 3 + e * l / n) + 2, 1))" "${LAYERS}" "${nl}" "${est}")
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$(free_gb)" "${need}"; then
    log "${tag}: needs ${need} GB, ${GGUF_DIR} has $(free_gb) GB free"
    flush_pending
    if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$(free_gb)" "${need}"; then
      note "${tag} skipped: needs ${need} GB, ${GGUF_DIR} has $(free_gb) GB free"
      continue
    fi
  fi
  d="${WORK}/files/${tag}"
  f="$(gguf_of "${tag}")"
  mkdir -p "${d}"
  layers_arg=()
  [[ ${LAYERS} -gt 0 ]] && layers_arg=(--layers "${LAYERS}")
  name="${like} ${quant}$([[ ${LAYERS} -gt 0 ]] && echo " (first ${LAYERS} layers)")"
  log "${tag}: qwenrt synth --like ${like} --quant ${quant} ${layers_arg[*]} -> ${f}"
  if ! "${QWENRT}" synth --like "${like}" --quant "${quant}" "${layers_arg[@]}" --out "${f}" \
    > "${d}/synth.log" 2>&1; then
    note "${tag}: synth failed ($(tail -n 1 "${d}/synth.log"))"
    rm -f "${f}"
    continue
  fi
  tail -n 1 "${d}/synth.log" | tee -a "${RUNLOG}" >&2
  python3 -c 'import json,sys; print(json.dumps(dict(zip(["name","like","quant","layers","file","file_bytes"], [sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])]))))' \
    "${name}" "${like}" "${quant}" "${LAYERS}" "$(basename "${f}")" "$(stat -c %s "${f}")" > "${d}/file.json"
  "${QWENRT}" info "${f}" --json 2> "${d}/info.err" | "${REPORT[@]}" tensors - > "${d}/tensors.json" ||
    note "${tag}: qwenrt info --json / report.py tensors failed (no weight figure)"
  publish
  state="$(build_state)"
  if [[ "${state}" == running ]]; then
    if [[ ${DO_QWENRT} == 1 ]]; then
      run_qwenrt "${tag}" -during-build "${QPIN[@]}"
    fi
    PENDING+=("${tag}")
  else
    run_quiet "${tag}"
    finish_file "${tag}"
  fi
done
flush_pending

# --- KL divergence (tools/kld/run.sh) ------------------------------------------------------------
run_kld() {
  local s left
  s="$(wait_build)"
  if [[ "${s}" != ok ]]; then
    note "KLD not run: llama.cpp build ${s}"
    return
  fi
  left=$((BUDGET - 10 - $(elapsed)))
  if [[ ${left} -lt 45 ]]; then
    note "KLD not run: ${left} s left of the time budget"
    return
  fi
  mkdir -p "${WORK}/kld"
  local cmd=(env BACKEND="${BACKEND}" THREADS="${KLD_THREADS}" LLAMA_ARGS="-ngl 99" CHUNKS="${KLD_CHUNKS}"
    TEXT="${KLD_TEXT}" RESULTS="${RESULTS}" PARALLEL=1 PYTHON="${KLD_PYTHON}"
    bash tools/kld/run.sh "${QWENRT}" "${LB_BIN}/llama-perplexity" "${KLD_DIR}")
  local shown
  shown="$(printf '%q ' "${cmd[@]}")"
  shown="${shown% }"
  shown="${shown//"${QWENRT}"/qwenrt}"
  shown="${shown//"${LB_BIN}/"/}"
  shown="${shown//"${REPO}/"/}"
  # The results folder as the device tool names it, not as this machine's path.
  [[ -n "${OUT:-}" && "${RESULTS}" == "${OUT}" ]] && shown="${shown//"RESULTS=${RESULTS}"/RESULTS=\$OUT}"
  echo "${shown}" > "${WORK}/kld/cmd.txt"
  log "KLD (stopped after ${left} s): ${shown}"
  rm -rf "${KLD_DIR}"
  rm -f "${RESULTS}"/kld-summary.json "${RESULTS}"/kld-summary.md "${RESULTS}"/kld-logs.tar.*
  date +%s.%N > "${WORK}/kld/time.txt"
  local rc=0
  timeout -k 5 "${left}" "${cmd[@]}" > "${WORK}/kld/run.log" 2>&1 || rc=$?
  date +%s.%N >> "${WORK}/kld/time.txt"
  echo "${rc}" > "${WORK}/kld/rc.txt"
  [[ -f "${KLD_DIR}/timings.txt" ]] && cp "${KLD_DIR}/timings.txt" "${WORK}/kld/timings.txt"
  for x in kld-summary.json kld-summary.md; do
    [[ -f "${RESULTS}/${x}" ]] && cp "${RESULTS}/${x}" "${WORK}/kld/${x}"
  done
  log "  KLD: exit ${rc}"
  [[ ${rc} == 0 ]] || { tail -n 5 "${WORK}/kld/run.log" | sed 's/^/    /' | tee -a "${RUNLOG}" >&2; }
}
if [[ ${KLD} == 1 ]]; then
  run_kld
  publish
fi
[[ -n "${BUILD_PID}" && "$(build_state)" == running ]] && note "llama.cpp build still running at the end"
log "done at +$(elapsed)s"
publish
