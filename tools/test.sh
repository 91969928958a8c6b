#!/usr/bin/env bash
# The whole test suite: sets up and builds (tools/setup.sh), then runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
