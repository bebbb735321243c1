#!/usr/bin/env bash
# Builds smp (installing what is missing, like scripts/setup.sh, but without
# running the default job) and runs the whole test suite with CTest.
#
#   bash scripts/test.sh              # everything
#   bash scripts/test.sh -R Plugin    # extra arguments go to ctest
#
# Environment: SMP_BUILD_DIR, SMP_JOBS (see setup.sh); SMP_TEST_JOBS, tests run
# at once (default 2: multi-process tests start several ranks each).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${SMP_BUILD_DIR:-$repo/build}

bash "$repo/scripts/setup.sh" --no-job
exec ctest --test-dir "$build" --output-on-failure -j "${SMP_TEST_JOBS:-2}" "$@"
