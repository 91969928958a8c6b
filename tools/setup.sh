#!/usr/bin/env bash
# Installs what qwenrt needs on a Debian machine (if missing), makes the Python environment
# .venv for the test tools, and builds into build/ (Release). Safe to run again.
#   bash tools/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ clang libclang-rt-14-dev libgtest-dev libgmock-dev libbenchmark-dev
          libfmt-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libboost-dev
          libcurl4-openssl-dev libssl-dev python3 python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# (Re)make .venv when tools/requirements.txt changed since it was made.
stamp=$(sha256sum tools/requirements.txt | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/requirements.sha256 2>/dev/null)" != "$stamp" ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r tools/requirements.txt
  echo "$stamp" > .venv/requirements.sha256
fi

# The CUDA backend builds wherever nvcc is (on PATH or in the toolkit's usual place); no GPU needed.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C build
