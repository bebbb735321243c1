#!/usr/bin/env bash
# A/B of step times between two builds of smp on one machine, interleaved: GPT
# (bench/configs/gpt-bench.toml) on 1 rank, dp = 2 and pp = 2 (1F1B, 4
# microbatches), ROUNDS rounds, each round running every layout on both builds
# back to back (so drift hits both alike). Prints one line per round and
# layout and writes OUT (JSON: both commits, date, method, every step time,
# per-round B/A ratios and their medians).
#
#   git worktree add /tmp/base <commit> && cmake -S /tmp/base -B /tmp/base/build -G Ninja \
#       -DCMAKE_BUILD_TYPE=Release -DSMP_BUILD_TESTS=OFF && cmake --build /tmp/base/build \
#       --target smp-launch smp-worker gpt smp_nn smp_tp smp_partition
#   OUT=bench/results/ab-core3.json bench/ab_step_times.sh /tmp/base/build build
set -euo pipefail
A=$1 B=$2 ROUNDS=${ROUNDS:-10}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CFG="$HERE/configs/gpt-bench.toml" OUT=${OUT:-$HERE/results/ab-step-times.json}
commit_of() { git -C "$(dirname "$(realpath "$1")")" rev-parse --short HEAD 2>/dev/null || echo unknown; }
run() {  # build layout -> mean step seconds (first step excluded)
  local build=$1 layout=$2 dir n=1 extra=()
  case $layout in
    one) ;;
    dp2) n=2 extra=(--set parallel.dp=2) ;;
    pp2) n=2 extra=(--set parallel.pp=2 --set parallel.schedule=1f1b --set parallel.microbatches=4) ;;
  esac
  dir=$(mktemp -d)
  "$build/bin/smp-launch" --nproc-per-node "$n" --threads-per-rank 1 --plugin "$build/lib/smp/plugins/gpt.so" \
    --config "$CFG" --set run.threads=1 "${extra[@]}" --set train.steps=16 --set train.val_batches=0 \
    --set run.log_to_file=false --set run.dir="$dir" >/dev/null 2>&1
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step_seconds'])" "$dir/summary.json"
  rm -rf "$dir"
}
rows=()
for round in $(seq 1 "$ROUNDS"); do
  for layout in one dp2 pp2; do
    a=$(run "$A" $layout) b=$(run "$B" $layout)
    echo "round $round $layout: A $a s, B $b s, B/A $(python3 -c "print(round($b / $a, 4))")"
    rows+=("{\"round\": $round, \"layout\": \"$layout\", \"a\": $a, \"b\": $b}")
  done
done
python3 - "$OUT" "$(IFS=,; echo "${rows[*]}")" "$(commit_of "$A")" "$(commit_of "$B")" <<'PY'
import json, statistics, sys, time
out, rows, ca, cb = sys.argv[1], json.loads("[" + sys.argv[2] + "]"), sys.argv[3], sys.argv[4]
layouts = {}
for l in ("one", "dp2", "pp2"):
    rs = [r for r in rows if r["layout"] == l]
    ratios = [r["b"] / r["a"] for r in rs]
    layouts[l] = {"a_step_seconds": [r["a"] for r in rs], "b_step_seconds": [r["b"] for r in rs],
                  "b_over_a_per_round": ratios, "median_b_over_a": statistics.median(ratios)}
json.dump({"benchmark": "A/B of GPT step seconds between two builds, interleaved rounds on one machine",
           "a_commit": ca, "b_commit": cb, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "method": "bench/ab_step_times.sh: per round, each layout on A then B back to back; "
                     "bench/configs/gpt-bench.toml, train.steps=16 (mean of steps 2..16), 1 thread per rank; "
                     "one = 1 rank, dp2 = parallel.dp=2, pp2 = parallel.pp=2 1f1b 4 microbatches",
           "rounds": max(r["round"] for r in rows), "layouts": layouts}, open(out, "w"), indent=1)
for l, v in layouts.items():
    print(f"{l}: median B/A {v['median_b_over_a']:.4f} over {len(v['b_over_a_per_round'])} rounds")
PY
