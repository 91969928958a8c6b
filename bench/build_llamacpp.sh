#!/usr/bin/env bash
# Build llama.cpp's CPU benchmark tools (llama-bench, llama-perplexity) for the side-by-side
# comparison (bench/cpu_compare.py, docs/bench.md).
#
#   nice -n 10 bash bench/build_llamacpp.sh [OUT_DIR]      # default OUT_DIR: build-llamacpp
#   LLAMACPP_SERVER=1 nice -n 10 bash bench/build_llamacpp.sh   # also llama-server (server_load.py)
#
# llama.cpp comes only from the pinned llama-cpp-python sdist on PyPI
# (tools/requirements-fixtures.txt), which vendors it under vendor/llama.cpp; the tarball's sha256
# is checked before it is unpacked. CPU only, tuned for this machine (GGML_NATIVE), OpenMP at
# llama.cpp's default, Release. Idempotent: a second run reuses the download, the unpacked tree
# and the build folder (an up-to-date build is a no-op).
#
# Results: OUT_DIR/build/bin/llama-bench and OUT_DIR/build/bin/llama-perplexity, and with
# LLAMACPP_SERVER=1 also OUT_DIR/build/bin/llama-server (bench/server_load.py).
# Environment: LLAMACPP_JOBS (parallel compile jobs, default: nproc), PYTHON (for pip download,
# default: python3), LLAMACPP_SERVER (1: also configure LLAMA_BUILD_SERVER=ON and build
# llama-server; reconfigures an existing build folder, which stays incremental).
set -euo pipefail

VERSION=0.3.36
# sha256 of llama_cpp_python-0.3.36.tar.gz as served by PyPI (same as tools/fixtures/llamacpp.py).
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
NAME="llama_cpp_python-${VERSION}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-${REPO}/build-llamacpp}"
mkdir -p "${OUT}"
OUT="$(cd "${OUT}" && pwd)"
PYTHON="${PYTHON:-python3}"
JOBS="${LLAMACPP_JOBS:-$(nproc)}"
SERVER="${LLAMACPP_SERVER:-0}"
TGZ="${OUT}/${NAME}.tar.gz"
SRC="${OUT}/${NAME}/vendor/llama.cpp"
BUILD="${OUT}/build"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ ! -f "${SRC}/CMakeLists.txt" ]]; then
  if [[ ! -f "${TGZ}" ]]; then
    echo "downloading the llama-cpp-python ${VERSION} sdist from PyPI" >&2
    if ! "${PYTHON}" -m pip download --no-deps --no-binary :all: "llama-cpp-python==${VERSION}" \
      -d "${OUT}" >&2; then
      echo "pip download failed; trying PyPI's JSON API" >&2
      url="$(curl -fsSL "https://pypi.org/pypi/llama-cpp-python/${VERSION}/json" |
        "${PYTHON}" -c 'import json,sys; print(next(u["url"] for u in json.load(sys.stdin)["urls"] if u["packagetype"] == "sdist"))')"
      curl -fSL -o "${TGZ}.part" "${url}"
      mv "${TGZ}.part" "${TGZ}"
    fi
  fi
  got="$(sha_of "${TGZ}")"
  if [[ "${got}" != "${SHA256}" ]]; then
    echo "error: ${TGZ}: sha256 ${got}, expected ${SHA256}" >&2
    exit 1
  fi
  rm -rf "${OUT:?}/${NAME}"
  tar -xzf "${TGZ}" -C "${OUT}"
  [[ -f "${SRC}/CMakeLists.txt" ]] || {
    echo "error: ${NAME} has no vendor/llama.cpp" >&2
    exit 1
  }
fi

if [[ ! -f "${BUILD}/CMakeCache.txt" ]]; then
  generator=()
  command -v ninja > /dev/null && generator=(-G Ninja)
  cmake -S "${SRC}" -B "${BUILD}" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF >&2
fi
targets=(llama-bench llama-perplexity)
if [[ "${SERVER}" == 1 ]]; then
  # llama-server lives under tools/ (LLAMA_BUILD_TOOLS) behind LLAMA_BUILD_SERVER; turning it on
  # in the existing cache keeps the CPU libraries already built.
  if ! grep -q '^LLAMA_BUILD_SERVER:BOOL=ON' "${BUILD}/CMakeCache.txt"; then
    cmake -S "${SRC}" -B "${BUILD}" -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >&2
  fi
  targets+=(llama-server)
fi
cmake --build "${BUILD}" --target "${targets[@]}" -j "${JOBS}" >&2

for t in "${targets[@]}"; do
  [[ -x "${BUILD}/bin/${t}" ]] || {
    echo "error: ${BUILD}/bin/${t} was not built" >&2
    exit 1
  }
done
echo "${BUILD}/bin"
