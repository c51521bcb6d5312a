#!/usr/bin/env bash
# Sets everything up (packages, configure, build) and runs the whole test suite of one
# preset (default: release). Usage: scripts/test.sh [release|debug|asan|tsan]
# (tsan builds and runs only the suites that run ranks as threads, the worker pool or the
# HTTP connection threads).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
scripts/setup.sh "$preset"
ctest --preset "$preset" -j "$(nproc)"
