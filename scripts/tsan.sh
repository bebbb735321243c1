#!/usr/bin/env bash
# Builds tsan/ (clang, ThreadSanitizer) into build-tsan/ and runs tsan_races:
# the trace recorder and one communicator used from several threads at once.
# Exits non-zero when TSan reports a race (its report is printed).
#
#   bash scripts/tsan.sh             # this checkout
#   bash scripts/tsan.sh --at REV    # core/ as of REV (say 3c17270^, before
#                                    # the races were fixed): TSan must report
#   bash scripts/tsan.sh --ci        # CI: skips, loudly, without clang's TSan
#
# Needs clang with its sanitizer runtimes (Debian: clang, libclang-rt-14-dev)
# and the packages scripts/setup.sh installs.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$repo/build-tsan
at="" ci=0
while (($#)); do
  case $1 in
    --at) at=$2; shift 2 ;;
    --ci) ci=1; shift ;;
    -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "tsan.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
# clang with TSan's runtime (libclang-rt-14-dev, which scripts/fuzz.sh installs
# for libFuzzer): where it is missing, --ci skips loudly, other runs fail.
have_tsan() {
  clangxx=$(command -v clang++ || command -v clang++-14 || true)
  [ -n "$clangxx" ] && echo 'int main() { return 0; }' |
    "$clangxx" -fsanitize=thread -x c++ - -o /dev/null >/dev/null 2>&1
}
if ! have_tsan; then
  if ((ci)); then
    echo "=== SKIPPED: ThreadSanitizer checks: clang++ with ThreadSanitizer is not installed (clang, libclang-rt-14-dev) ==="
    exit 0
  fi
  echo "tsan.sh: clang++ with ThreadSanitizer not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi
sources=$repo
if [ -n "$at" ]; then
  sources=$(mktemp -d)
  trap 'rm -rf "$sources"' EXIT
  git -C "$repo" archive "$at" core | tar -x -C "$sources"
  build=$repo/build-tsan-at
  echo "tsan.sh: core/ as of $(git -C "$repo" rev-parse --short "$at")"
fi
cmake -S "$repo/tsan" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$clangxx" -DSMP_TSAN_SOURCES="$sources" \
  </dev/null >/dev/null
cmake --build "$build" -j "${SMP_JOBS:-$(nproc)}" </dev/null
# halt_on_error=0: every race is reported; exitcode: the run then fails.
rc=0
TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" "$build/tsan_races" || rc=$?
if ((rc == 0)); then
  echo "=== TSAN: tsan_races ran its 2 checks, no race reported ==="
else
  echo "=== TSAN: tsan_races FAILED (exit $rc$( ((rc == 66)) && echo ": ThreadSanitizer reported races, above")) ==="
fi
exit "$rc"
