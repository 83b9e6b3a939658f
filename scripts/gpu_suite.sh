#!/usr/bin/env bash
# The GPU suite: on a machine with an NVIDIA GPU, build for that GPU, run every test (cpu, gpu and
# sanitizer labels) and the tour, and print a short summary last.
#   scripts/gpu_suite.sh                 # build dir build-gpu, arch of the GPU present
#   BUILD=b ARCH=90 scripts/gpu_suite.sh
# Extra CMake arguments go in CMAKE_ARGS (e.g. CMAKE_ARGS='-DFA_CHAPTERS=00_naive').
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
ARCH=${ARCH:-native}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$ARCH" ${CMAKE_ARGS:-} >"$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" 2>&1 | grep -E "error|warning|FAILED" ; build_rc=${PIPESTATUS[0]}
[ "$build_rc" -eq 0 ] || { echo "build failed"; exit 1; }

ctest --test-dir "$BUILD" -N -L sanitizer | grep -q "Total Tests: [1-9]" ||
  echo "!! no sanitizer tests registered: compute-sanitizer was not found at configure time"
ctest --test-dir "$BUILD" --output-on-failure -j "${CTEST_JOBS:-4}" >"$BUILD/ctest.log" 2>&1; test_rc=$?
grep -E "Test +#|tests passed|Failed|Not Run" "$BUILD/ctest.log" | grep -vE "^\s*$" | tail -60

scripts/tour.sh "$BUILD"; tour_rc=$?

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
grep -E "tests passed" "$BUILD/ctest.log"
echo "ctest exit $test_rc, tour exit $tour_rc"
[ "$test_rc" -eq 0 ] && [ "$tour_rc" -eq 0 ]
