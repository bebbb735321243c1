#!/usr/bin/env bash
# Builds smp (installing what is missing, like scripts/setup.sh, but without
# running the default job) and runs the whole test suite with CTest.
#
#   bash scripts/test.sh              # everything
#   bash scripts/test.sh -R Plugin    # extra arguments go to ctest
#
# Environment: SMP_BUILD_DIR, SMP_JOBS, SMP_TORCH, Torch_DIR (see setup.sh); SMP_TEST_JOBS, tests run
# at once (default 2: multi-process tests start several ranks each).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The folder setup.sh builds: build/, or build-pip/ with SMP_TORCH=pip, build-torch/ with Torch_DIR.
if [[ -n ${Torch_DIR:-} ]]; then
  default_build=$repo/build-torch
elif [[ ${SMP_TORCH:-debian} == pip ]]; then
  default_build=$repo/build-pip
else
  default_build=$repo/build
fi
build=${SMP_BUILD_DIR:-$default_build}

bash "$repo/scripts/setup.sh" --no-job
# The JUnit file keeps each test's output (CI's summary reads skip reasons from it).
exec ctest --test-dir "$build" --output-on-failure -j "${SMP_TEST_JOBS:-2}" \
  --output-junit "$build/Testing/ctest-results.xml" "$@"
