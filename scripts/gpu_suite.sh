#!/usr/bin/env bash
# The GPU suite: on a machine with an NVIDIA GPU, build for that GPU, run every test (labels cpu, gpu
# and sanitizer) and the tour, and print a short summary last. It fails if any test fails or is not
# run: on a GPU machine a skipped GPU or sanitizer test (no device seen, compute-sanitizer missing)
# means the kernels were not tested.
#   scripts/gpu_suite.sh                 build folder build-gpu, the architecture of the GPU present
#   BUILD=b ARCH=90 scripts/gpu_suite.sh
# Extra CMake arguments go in CMAKE_ARGS (e.g. CMAKE_ARGS='-DFA_CHAPTERS=00_naive'). Logs are written
# in the build folder. Exit 0 all passed, 1 a failure (or no GPU), 2 bad usage.
set -uo pipefail
usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "") ;;
  *) echo "gpu_suite.sh: takes no arguments (got '$1'); see --help" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
ARCH=${ARCH:-native}

if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "gpu_suite.sh: no NVIDIA GPU found (nvidia-smi lists none). This suite tests the kernels on a GPU;" >&2
  echo "without one, build and run the CPU tests as in README.md (Quick start) or .ci/run." >&2
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p "$BUILD"

echo "== step 1/4: configure ($BUILD, CUDA architectures $ARCH)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CUDA_ARCHITECTURES="$ARCH" ${CMAKE_ARGS:-} >"$BUILD/configure.log" 2>&1 ||
  { tail -30 "$BUILD/configure.log"; echo "configure failed (full log: $BUILD/configure.log)"; exit 1; }
echo "== step 2/4: build"
cmake --build "$BUILD" -j "$(nproc)" >"$BUILD/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$BUILD/build.log" | head -30; echo "build failed (full log: $BUILD/build.log)"; exit 1; }
grep -E "warning" "$BUILD/build.log" | head -10

echo "== step 3/4: ctest (cpu, gpu, sanitizer; log $BUILD/ctest.log)"
ctest --test-dir "$BUILD" --output-on-failure -j "${CTEST_JOBS:-4}" >"$BUILD/ctest.log" 2>&1; test_rc=$?
grep -E "Test +#|tests passed|Failed|Not Run|Skipped" "$BUILD/ctest.log" | tail -80
# ctest lists each test that did not run once, as "  NN - name (Skipped)" (or Disabled, Not Run).
not_run=$(grep -cE "^\s+[0-9]+ - .* \((Skipped|Disabled|Not Run|Not Available)\)" "$BUILD/ctest.log")

echo "== step 4/4: tour"
scripts/tour.sh "$BUILD"; tour_rc=$?

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
grep -E "tests passed" "$BUILD/ctest.log"
if [ "$not_run" -gt 0 ]; then
  echo "!! $not_run test(s) not run on a GPU machine (listed above): a GPU test that sees no device, or a"
  echo "   sanitizer test without compute-sanitizer (install it with the CUDA toolkit and re-configure)"
fi
echo "ctest exit $test_rc, not run $not_run, tour exit $tour_rc"
[ "$test_rc" -eq 0 ] && [ "$not_run" -eq 0 ] && [ "$tour_rc" -eq 0 ]
