#!/usr/bin/env bash
# Builds smp-bench (and what its jobs need) if needed, then runs the three
# benchmarks, writing bench/results/{gpt,pipeline,tp}.json.
#
#   bench/run_all.sh                 # build dir build-bench, 2 repeats per job
#   BUILD=build REPEAT=3 bench/run_all.sh
#   MAX_LOAD=1.5 WAIT=300 bench/run_all.sh   # wait for a quiet machine first
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$SRC/build-bench}"
REPEAT="${REPEAT:-2}"
MAX_LOAD="${MAX_LOAD:-1.5}"
WAIT="${WAIT:-180}"
JOBS="${JOBS:-2}"
OUT="${OUT:-$SRC/bench/results}"

if [[ ! -f "$BUILD/build.ninja" && ! -f "$BUILD/Makefile" ]]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja
fi
cmake --build "$BUILD" -j"$JOBS" --target smp-bench smp-launch smp-worker gpt smp_nn smp_tp smp_partition

mkdir -p "$OUT"
BENCH="$BUILD/bin/smp-bench"
common=(--repeat "$REPEAT" --max-load "$MAX_LOAD" --wait "$WAIT")
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$BENCH" gpt      "${common[@]}" --out "$OUT/gpt.json"
"$BENCH" pipeline "${common[@]}" --out "$OUT/pipeline.json"
"$BENCH" tp       "${common[@]}" --out "$OUT/tp.json"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
