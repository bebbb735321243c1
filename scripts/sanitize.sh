#!/usr/bin/env bash
# Builds smp with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-sanitize/ and runs the whole test suite under them. Any report fails
# the test that triggered it (halt_on_error; -fno-sanitize-recover).
#
#   bash scripts/sanitize.sh               # everything
#   bash scripts/sanitize.sh -R Plugin     # extra arguments go to ctest
#
# Suppressions (scripts/sanitize/*.supp) cover reports inside LibTorch only,
# each with the reason next to it. Run scripts/setup.sh --no-job once first
# (it installs the packages).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${SMP_SANITIZE_BUILD_DIR:-$repo/build-sanitize}
supp=$repo/scripts/sanitize

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSMP_SANITIZE=address,undefined </dev/null
fi
cmake --build "$build" -j "${SMP_JOBS:-$(nproc)}"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1:detect_odr_violation=0:suppressions=$supp/asan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
exec ctest --test-dir "$build" --output-on-failure -j "${SMP_TEST_JOBS:-2}" "$@"
