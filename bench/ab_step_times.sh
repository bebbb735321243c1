#!/usr/bin/env bash
# A/B of step times between two builds of smp on one machine, interleaved:
# smp 1 rank and dp = 2 on the benchmark GPT, ROUNDS rounds, each round running
# both builds back to back (so drift hits both alike). Prints one line per
# round and build; bench/results/ab-vs-previous-commit.json was made from it.
#
#   git worktree add /tmp/base <commit> && cmake -S /tmp/base -B /tmp/base/build -G Ninja \
#       -DCMAKE_BUILD_TYPE=Release -DSMP_BUILD_TESTS=OFF && cmake --build /tmp/base/build \
#       --target smp-launch smp-worker gpt smp_nn smp_tp smp_partition
#   bench/ab_step_times.sh /tmp/base/build build
set -euo pipefail
A=$1 B=$2 ROUNDS=${ROUNDS:-6}
CFG="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/configs/gpt-bench.toml"
run() {  # build nproc -> mean step seconds (first step excluded)
  local build=$1 n=$2 dir
  dir=$(mktemp -d)
  "$build/bin/smp-launch" --nproc-per-node "$n" --threads-per-rank 1 --plugin "$build/lib/smp/plugins/gpt.so" \
    --config "$CFG" --set run.threads=1 --set parallel.dp="$n" --set train.steps=16 --set run.log_to_file=false \
    --set run.dir="$dir" >/dev/null 2>&1
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step_seconds'])" "$dir/summary.json"
  rm -rf "$dir"
}
for round in $(seq 1 "$ROUNDS"); do
  for build in "$A" "$B"; do
    one=$(run "$build" 1) two=$(run "$build" 2)
    echo "$round $build one=$one dp2=$two ratio=$(python3 -c "print(round($one / $two, 4))")"
  done
done
