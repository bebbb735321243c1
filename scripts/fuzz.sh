#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang, ASan + UBSan) into build-fuzz/
# and runs each for a bounded time from its seed corpus (fuzz/corpus/<name>)
# and its regressions (fuzz/regressions/<name>). What a run finds (crash,
# leak, timeout, out of memory) is copied into fuzz/regressions/<name>/, and
# the run exits non-zero. Writes a summary per harness to bench/results/fuzz.json.
#
#   bash scripts/fuzz.sh                   # every harness, 30 s each
#   bash scripts/fuzz.sh --seconds 600     # a long run
#   bash scripts/fuzz.sh --ci              # CI's bounded run (see below)
#   bash scripts/fuzz.sh manifest config   # some harnesses only
#
# Options: --seconds N (per harness), --jobs N (libFuzzer -jobs=N -workers=N:
# N processes on one harness), --parallel N (N harnesses at once), --json PATH,
# --build-only. --ci: 20 s per harness, as many harnesses at once as there
# are cores, the summary in build-fuzz/fuzz-ci.json (bench/results/fuzz.json
# stays the reference run's).
# Needs clang with libFuzzer (Debian: clang, libclang-rt-14-dev) and the
# packages scripts/setup.sh installs (LibTorch, nlohmann-json, toml++, spdlog,
# Boost, SentencePiece). docs/fuzzing.md says what each harness covers.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$repo/build-fuzz
all=(safetensors manifest indexed_dataset epoch_index bpe_json bpe_merges tokenizer_export sentencepiece config cluster plugin_descriptor elf_header hf_folder rendezvous)

seconds=30 jobs=1 parallel=1 json="" build_only=0 ci=0
names=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --jobs|--workers) jobs=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --ci) ci=1; shift ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
if ((ci)); then
  seconds=20 parallel=$(nproc)
  [ -n "$json" ] || json=$build/fuzz-ci.json
fi
[ -n "$json" ] || json=$repo/bench/results/fuzz.json
((${#names[@]})) || names=("${all[@]}")
for n in "${names[@]}"; do
  [[ " ${all[*]} " == *" $n "* ]] || { echo "fuzz.sh: no harness '$n' (harnesses: ${all[*]})" >&2; exit 2; }
done

# The biggest input each format gets: room for the seeds and their growth, small
# enough to keep executions fast.
max_len() {
  case $1 in
    bpe_json|bpe_merges|tokenizer_export) echo 16384 ;;
    manifest|sentencepiece|hf_folder) echo 8192 ;;
    safetensors|indexed_dataset|config|cluster|elf_header) echo 4096 ;;
    *) echo 1024 ;;
  esac
}

# clang with libFuzzer: installed when missing (as scripts/setup.sh installs
# its packages); where it cannot be had, --ci skips loudly, else it is an error.
have_libfuzzer() {
  clangxx=$(command -v clang++ || command -v clang++-14 || true)
  [ -n "$clangxx" ] && echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    "$clangxx" -fsanitize=fuzzer -x c++ - -o /dev/null >/dev/null 2>&1
}
if ! have_libfuzzer; then
  sudo=()
  ((EUID == 0)) || sudo=(sudo -n)
  if command -v apt-get >/dev/null; then
    echo "fuzz.sh: installing clang and libFuzzer (clang, libclang-rt-14-dev)"
    { "${sudo[@]}" apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 clang libclang-rt-14-dev ||
      { "${sudo[@]}" apt-get update -q -o Dpkg::Use-Pty=0 &&
        "${sudo[@]}" apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 clang libclang-rt-14-dev; }; } \
      </dev/null || true
  fi
  if ! have_libfuzzer; then
    if ((ci)); then
      echo "=== SKIPPED: fuzz: no clang with libFuzzer here, and apt-get could not install clang libclang-rt-14-dev ==="
      exit 0
    fi
    echo "fuzz.sh: no clang++ with libFuzzer (Debian: apt-get install clang libclang-rt-14-dev)" >&2
    exit 2
  fi
fi
start_build=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$clangxx" </dev/null
fi
targets=()
for n in "${names[@]}"; do targets+=("fuzz_$n"); done
cmake --build "$build" -j "${SMP_JOBS:-$(nproc)}" --target "${targets[@]}"
build_seconds=$(($(date +%s) - start_build))
echo "fuzz.sh: built ${#names[@]} harnesses in ${build_seconds} s"
((build_only)) && exit 0

load=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# Reports stop the run (halt_on_error), and libFuzzer keeps the input.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# One harness: its working corpus (new inputs land there, not in fuzz/corpus;
# kept from run to run), its findings copied into fuzz/regressions/<name>/,
# its numbers in result.env.
run_one() {
  local n=$1 dir=$build/runs/$1
  rm -rf "$dir/artifacts" "$dir/log" "$dir/result.env" "$dir"/fuzz-*.log
  mkdir -p "$dir/artifacts" "$dir/corpus" "$repo/fuzz/regressions/$n"
  local seeds=("$repo/fuzz/corpus/$n")
  [ -n "$(ls -A "$repo/fuzz/regressions/$n" 2>/dev/null)" ] && seeds+=("$repo/fuzz/regressions/$n")
  # A dictionary of the format's keywords, where the format has them.
  local dict=$repo/fuzz/dicts/$n.dict extra=()
  case $n in bpe_json|bpe_merges|tokenizer_export) dict=$repo/fuzz/dicts/bpe.dict ;; esac
  [ -f "$dict" ] && extra+=("-dict=$dict")
  ((jobs > 1)) && extra+=("-jobs=$jobs" "-workers=$jobs")
  local t0 rc=0
  t0=$(date +%s.%N)
  (cd "$dir" && "$build/fuzz_$n" "$dir/corpus" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len="$(max_len "$n")" -print_final_stats=1 \
      -artifact_prefix="$dir/artifacts/" "${extra[@]}" \
      >"$dir/log" 2>&1) || rc=$?
  local wall execs=0 rate=0 crashes=()
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  # One stats block per process (several with --jobs): their sums.
  for log in "$dir/log" "$dir"/fuzz-*.log; do
    [ -f "$log" ] || continue
    execs=$((execs + $(awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}' "$log")))
    rate=$((rate + $(awk '/stat::average_exec_per_sec/ {s += $2} END {print s + 0}' "$log")))
  done
  for f in "$dir"/artifacts/*; do
    [ -f "$f" ] || continue
    case $(basename "$f") in crash-*|leak-*|timeout-*|oom-*) ;; *) continue ;; esac
    cp "$f" "$repo/fuzz/regressions/$n/"
    crashes+=("$(basename "$f")")
  done
  local units
  units=$(find "$dir/corpus" -type f | wc -l)
  {
    echo "execs=$execs"
    echo "rate=$rate"
    echo "wall=$wall"
    echo "rc=$rc"
    echo "corpus=$units"
    echo "crashes=${crashes[*]:-}"
  } >"$dir/result.env"
  if ((${#crashes[@]})); then
    echo "fuzz.sh: $n FOUND ${#crashes[@]}: ${crashes[*]} (copied to fuzz/regressions/$n/; log $dir/log)"
  elif ((rc != 0)); then
    echo "fuzz.sh: $n exited $rc without an artifact (log $dir/log)"
  else
    echo "fuzz.sh: $n: $execs executions in $wall s ($rate/s), corpus $units inputs"
  fi
}

start_run=$(date +%s)
running=0
for n in "${names[@]}"; do
  run_one "$n" &
  running=$((running + 1))
  if ((running >= parallel)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
run_seconds=$(($(date +%s) - start_run))

# The summary, one entry per harness.
failed=0
mkdir -p "$(dirname "$json")"
{
  echo "{"
  echo "  \"tool\": \"scripts/fuzz.sh\","
  echo "  \"commit\": \"$commit\","
  echo "  \"date\": \"$date\","
  echo "  \"machine\": {\"cores\": $(nproc), \"loadavg_at_start\": \"$load\"},"
  echo "  \"seconds_per_harness\": $seconds, \"jobs\": $jobs, \"parallel\": $parallel,"
  echo "  \"build_seconds\": $build_seconds, \"run_seconds\": $run_seconds,"
  echo "  \"harnesses\": {"
  i=0
  for n in "${names[@]}"; do
    execs=0 rate=0 wall=0 rc=1 corpus=0 crashes=""
    # shellcheck disable=SC1090
    [ -f "$build/runs/$n/result.env" ] && . "$build/runs/$n/result.env"
    list=""
    count=0
    for c in $crashes; do
      list+="${list:+, }\"$c\""
      count=$((count + 1))
    done
    if ((count > 0 || rc != 0)); then failed=1; fi
    i=$((i + 1))
    sep=$( ((i < ${#names[@]})) && echo "," || echo "")
    echo "    \"$n\": {\"executions\": $execs, \"seconds\": $wall, \"exec_per_second\": $rate, \"corpus_inputs\": $corpus,"
    echo "      \"seed_inputs\": $(find "$repo/fuzz/corpus/$n" -type f | wc -l)," \
         "\"regression_inputs\": $(find "$repo/fuzz/regressions/$n" -type f 2>/dev/null | wc -l)," \
         "\"max_len\": $(max_len "$n"), \"exit\": $rc,"
    echo "      \"new_crashes\": $count, \"crash_files\": [$list]}$sep"
  done
  echo "  }"
  echo "}"
} >"$json"
echo "fuzz.sh: build ${build_seconds} s, run ${run_seconds} s; summary in $json"
# One line for CI's summary (scripts/ci_summary.py reads it).
python3 - "$json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
h = d["harnesses"]
execs = sum(v["executions"] for v in h.values())
found = sum(v["new_crashes"] for v in h.values()) + sum(1 for v in h.values() if v["exit"] != 0 and v["new_crashes"] == 0)
print(f"=== FUZZ: {len(h)} harnesses, {execs} executions, {d['seconds_per_harness']} s each, {found} findings ===")
PY
exit "$failed"
