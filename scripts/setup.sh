#!/usr/bin/env bash
# Installs what dcp needs from Debian's packages (only when missing), then configures and
# builds one CMake preset (default: release). Usage: scripts/setup.sh [release|debug|asan|tsan|fuzz]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"

packages=(g++ cmake ninja-build pkg-config libgtest-dev libgmock-dev libbenchmark-dev
          libcli11-dev nlohmann-json3-dev libopenblas-dev libopenmpi-dev openmpi-bin libpcre2-dev
          libcpp-httplib-dev curl python3
          pybind11-dev python3-dev python3-numpy python3-pytest python3-torch
          python3-sentencepiece python3-jinja2)
# The sanitizer and fuzz presets build with clang (its ASan + UBSan build compiles several times
# faster than GCC's) and the fuzz preset links its libFuzzer runtime, only a recommendation of
# clang's, so named here.
case "$preset" in asan|tsan|fuzz) packages+=(clang libclang-rt-14-dev) ;; esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
