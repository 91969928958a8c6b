#!/usr/bin/env bash
# Pack a trimmed copy of the pinned llama.cpp sources for a CUDA build of llama-bench,
# llama-batched-bench and llama-perplexity on a machine that cannot download anything (the lent
# H200: bench/h200/run.sh, docs/bench.md "H200 side by side"; llama-perplexity for tools/kld/run.sh).
#
#   bash bench/pack_llamacpp_src.sh [OUT_TARBALL]     # default: .carry/llamacpp-src.tar.xz
#
# llama.cpp comes only from the pinned llama-cpp-python sdist (the same version and sha256 as
# bench/build_llamacpp.sh and tools/fixtures/llamacpp.py), its vendor/llama.cpp. The sdist is
# reused from build-llamacpp/ (where bench/build_llamacpp.sh downloads it) or downloaded there with
# `pip download --no-binary`. What is kept: the top-level CMake files, cmake/, include/, src/,
# common/, vendor/, ggml/ with only the CPU and CUDA backends (ggml/src/ggml-cuda complete, its
# template-instances included), tools/llama-bench, tools/batched-bench and tools/perplexity, the
# licenses. Dropped: the other ggml backends, docs, models, tests, examples, gguf-py, scripts, the
# other tools, app/. One file is rewritten: tools/CMakeLists.txt adds only the three kept tools (the
# original adds every tool unconditionally). No source file is changed.
#
# Configure the unpacked tree with at least -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
# -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF (their folders are gone) and -DLLAMA_CURL=OFF.
# The tarball unpacks to llama.cpp/; llama.cpp/PACKED.txt says where it came from.
#
# Environment: PYTHON (for pip download, default: python3), SDIST_DIR (where the sdist is looked
# for and downloaded, default: build-llamacpp).
set -euo pipefail

VERSION=0.3.36
# sha256 of llama_cpp_python-0.3.36.tar.gz as served by PyPI (same as bench/build_llamacpp.sh).
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
NAME="llama_cpp_python-${VERSION}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO}"
OUT_TAR="${1:-.carry/llamacpp-src.tar.xz}"
SDIST_DIR="${SDIST_DIR:-build-llamacpp}"
PYTHON="${PYTHON:-python3}"
TGZ="${SDIST_DIR}/${NAME}.tar.gz"

# The default output folder is never committed: ignore it through .git/info/exclude.
if [[ "${OUT_TAR}" == .carry/* ]]; then
  exclude="$(git rev-parse --git-path info/exclude)"
  mkdir -p "$(dirname "${exclude}")"
  grep -qxF '/.carry/' "${exclude}" 2> /dev/null || echo '/.carry/' >> "${exclude}"
fi

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "${SDIST_DIR}"
if [[ ! -f "${TGZ}" ]]; then
  echo "downloading the llama-cpp-python ${VERSION} sdist from PyPI" >&2
  "${PYTHON}" -m pip download --no-deps --no-binary :all: "llama-cpp-python==${VERSION}" \
    -d "${SDIST_DIR}" >&2
fi
got="$(sha_of "${TGZ}")"
if [[ "${got}" != "${SHA256}" ]]; then
  echo "error: ${TGZ}: sha256 ${got}, expected ${SHA256}" >&2
  exit 1
fi

STAGE="$(mktemp -d)"
trap 'rm -rf "${STAGE}"' EXIT
tar -xzf "${TGZ}" -C "${STAGE}" "${NAME}/vendor/llama.cpp"
SRC="${STAGE}/${NAME}/vendor/llama.cpp"
DST="${STAGE}/llama.cpp"
mkdir -p "${DST}"

# Top level: CMake files and licenses only.
for f in CMakeLists.txt CMakePresets.json LICENSE AUTHORS; do
  [[ -e "${SRC}/${f}" ]] && cp -a "${SRC}/${f}" "${DST}/"
done
for d in cmake include src common vendor licenses; do
  [[ -e "${SRC}/${d}" ]] && cp -a "${SRC}/${d}" "${DST}/"
done

# ggml: everything except the backends other than CPU and CUDA (HIP and MUSA build from the CUDA
# sources through their own folders, which are dropped too).
mkdir -p "${DST}/ggml/src"
cp -a "${SRC}/ggml/CMakeLists.txt" "${SRC}/ggml/cmake" "${SRC}/ggml/include" "${DST}/ggml/"
for p in "${SRC}"/ggml/src/*; do
  b="$(basename "${p}")"
  if [[ -d "${p}" && "${b}" == ggml-* && "${b}" != ggml-cpu && "${b}" != ggml-cuda ]]; then
    continue
  fi
  cp -a "${p}" "${DST}/ggml/src/"
done

# tools: llama-bench, batched-bench and perplexity, and a tools/CMakeLists.txt that adds only them.
mkdir -p "${DST}/tools"
cp -a "${SRC}/tools/llama-bench" "${SRC}/tools/batched-bench" "${SRC}/tools/perplexity" "${DST}/tools/"
cat > "${DST}/tools/CMakeLists.txt" << 'EOF'
# Trimmed by qwenrt's bench/pack_llamacpp_src.sh: only the two benchmark tools and perplexity are
# packed.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
add_subdirectory(perplexity)
EOF

[[ -d "${DST}/ggml/src/ggml-cuda/template-instances" ]] || {
  echo "error: ggml/src/ggml-cuda/template-instances missing from the packed tree" >&2
  exit 1
}

cat > "${DST}/PACKED.txt" << EOF
vendor/llama.cpp of ${NAME}.tar.gz (PyPI sdist, sha256 ${SHA256}),
trimmed by qwenrt's bench/pack_llamacpp_src.sh for a CUDA/CPU build of llama-bench,
llama-batched-bench and llama-perplexity. Kept: CMake files, cmake/, include/, src/, common/,
vendor/, licenses, ggml/ with the CPU and CUDA backends only, tools/llama-bench,
tools/batched-bench, tools/perplexity.
Rewritten: tools/CMakeLists.txt (adds only the three tools). No source file changed.
Configure with -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
-DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF.
EOF

mkdir -p "$(dirname "${OUT_TAR}")"
# Deterministic order and owners, so that a re-pack of the same sdist gives the same bytes.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00:00' \
  -C "${STAGE}" -cf - llama.cpp | xz -9 -T1 > "${OUT_TAR}.part"
mv "${OUT_TAR}.part" "${OUT_TAR}"
echo "${OUT_TAR}: $(stat -c %s "${OUT_TAR}") bytes, $(du -sh "${DST}" | cut -f1) unpacked" >&2
echo "${OUT_TAR}"
