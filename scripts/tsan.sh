#!/usr/bin/env bash
# Builds tsan/ (clang, ThreadSanitizer) into build-tsan/ and runs tsan_races,
# what smp's threads share used from several threads at once: (1) the trace
# recorder, (2) one communicator, (3) the deferred expert weight-gradient pool
# with its exchanges and gradient hooks, (4) the asynchronous checkpoint
# writer. Exits non-zero when TSan reports a race (its report is printed).
#
#   bash scripts/tsan.sh               # this checkout
#   bash scripts/tsan.sh --at REV      # core/ and plugins/nn/ as of REV (say
#                                      # 3c17270^, before the races of checks 1
#                                      # and 2 were fixed): TSan must report
#   bash scripts/tsan.sh --break NAME  # this checkout with one synchronisation
#                                      # removed (below): TSan must report
#   bash scripts/tsan.sh --ci          # CI: skips, loudly, without clang's TSan
#
# --break NAME, into build-tsan-break/ (the check that must then fail):
#   pool-shared         the deferred gradient pool one for the process, not
#                       one per thread (3)
#   writer-no-snapshot  the checkpoint writer writes the live tensors instead
#                       of its snapshot copies (4)
#   writer-no-join      the checkpoint writer's wait() detaches its thread
#                       instead of joining it (4)
#
# Needs clang with its sanitizer runtimes (Debian: clang, libclang-rt-14-dev)
# and the packages scripts/setup.sh installs.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$repo/build-tsan
at="" brk="" ci=0
while (($#)); do
  case $1 in
    --at) at=$2; shift 2 ;;
    --break) brk=$2; shift 2 ;;
    --ci) ci=1; shift ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
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
  git -C "$repo" archive "$at" core plugins/nn 2>/dev/null | tar -x -C "$sources" ||
    git -C "$repo" archive "$at" core | tar -x -C "$sources"
  build=$repo/build-tsan-at
  echo "tsan.sh: core/ as of $(git -C "$repo" rev-parse --short "$at")"
elif [ -n "$brk" ]; then
  # A copy of core/ and plugins/nn/ (times kept: ninja rebuilds what changed)
  # with one line replaced; the replaced line must be there.
  case $brk in
    pool-shared) file=plugins/nn/include/smp_nn/deferred_grads.hpp
      from='static thread_local DeferredWeightGrads pool;' to='static DeferredWeightGrads pool;' ;;
    writer-no-snapshot) file=core/src/checkpoint/checkpoint.cpp
      from='std::vector<at::Tensor> copies = snapshot_.copy(live);' to='std::vector<at::Tensor> copies = live;' ;;
    writer-no-join) file=core/src/checkpoint/checkpoint.cpp
      from='if (thread_.joinable()) thread_.join();' to='if (thread_.joinable()) thread_.detach();' ;;
    *) echo "tsan.sh: --break: unknown name $brk (pool-shared, writer-no-snapshot, writer-no-join)" >&2; exit 2 ;;
  esac
  build=$repo/build-tsan-break
  sources=$build/src
  rm -rf "$sources"
  mkdir -p "$sources/plugins"
  cp -a "$repo/core" "$sources/"
  cp -a "$repo/plugins/nn" "$sources/plugins/"
  # Every file some --break changes, newer than what an earlier --break built.
  touch "$sources/plugins/nn/include/smp_nn/deferred_grads.hpp" "$sources/core/src/checkpoint/checkpoint.cpp"
  text=$(<"$sources/$file")
  if [[ $text != *"$from"* ]]; then
    echo "tsan.sh: --break $brk: '$from' is no longer in $file: update this script" >&2
    exit 2
  fi
  printf '%s\n' "${text//"$from"/"$to"}" >"$sources/$file"
  echo "tsan.sh: --break $brk: $file: '$from' -> '$to'"
fi
cmake -S "$repo/tsan" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$clangxx" -DSMP_TSAN_SOURCES="$sources" \
  </dev/null >/dev/null
cmake --build "$build" -j "${SMP_JOBS:-$(nproc)}" </dev/null
# halt_on_error=0: every race is reported; exitcode: the run then fails.
# suppressions: what is no race of smp's (tsan/suppressions.txt says why).
set +e
TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 suppressions=$repo/tsan/suppressions.txt ${TSAN_OPTIONS:-}" \
  "$build/tsan_races" 2>&1 | tee "$build/tsan_races.log"
rc=${PIPESTATUS[0]}
set -e
checks=$(sed -n 's/^tsan_races: \([0-9]*\) checks done$/\1/p' "$build/tsan_races.log")
if ((rc == 0)); then
  echo "=== TSAN: tsan_races ran its ${checks:-?} checks, no race reported ==="
else
  echo "=== TSAN: tsan_races FAILED (exit $rc$( ((rc == 66)) && echo ": ThreadSanitizer reported races, above")) ==="
fi
exit "$rc"
