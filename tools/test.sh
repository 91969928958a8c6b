#!/usr/bin/env bash
# The whole test suite: sets up and builds (tools/setup.sh), then runs every test with ctest.
# When tests fail, the failed ones run once more and their failure lines end the output, so the
# tail of a CI log says what failed and why (and whether it failed twice).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
if ! ctest --test-dir build --output-on-failure -j"$(nproc)"; then
  echo "==== the failed tests, run again one at a time ===="
  ctest --test-dir build --rerun-failed --output-on-failure 2>&1 |
    grep -E "Failure|Expected|Which is|Value of|Actual:|  what\(\)|error:|Passed|\*\*\*Failed|Exception" |
    cut -c1-300 | tail -60 || true
  exit 8
fi
