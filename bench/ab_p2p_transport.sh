#!/usr/bin/env bash
# Pipeline sends through shared memory (ShmMailbox, comm.shm_mb > 0) against
# Gloo (comm.shm_mb = 0), interleaved: pp = 2, 1F1B, batch 16, m = 4 and 8 on
# the benchmark GPT, ROUNDS rounds, each running both transports back to back
# (so drift hits both alike). Prints one line per round and m and writes
# results/p2p-transport.json with the per-round ratios and their medians.
# (comm.shm_mb = 0 also sends the step's small all-reduces, the tied embedding's
# gradient and the loss, through Gloo: 0.26 MB a step against the pipeline's
# 16 MB of activations and gradients.)
#
#   bench/ab_p2p_transport.sh [build]
set -euo pipefail
BUILD=${1:-build} ROUNDS=${ROUNDS:-5}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CFG="$HERE/configs/gpt-bench.toml" OUT="$HERE/results/p2p-transport.json"
run() {  # shm_mb microbatches -> mean step ms (first step excluded)
  local dir
  dir=$(mktemp -d)
  "$BUILD/bin/smp-launch" --nproc-per-node 2 --threads-per-rank 1 --plugin "$BUILD/lib/smp/plugins/gpt.so" \
    --config "$CFG" --set run.threads=1 --set parallel.pp=2 --set parallel.microbatches="$2" \
    --set parallel.schedule=1f1b --set comm.shm_mb="$1" --set train.batch_size=16 --set train.steps=8 \
    --set train.val_batches=0 --set run.log_to_file=false --set run.dir="$dir" >/dev/null 2>&1
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step_seconds'] * 1000)" "$dir/summary.json"
  rm -rf "$dir"
}
rows=()
for round in $(seq 1 "$ROUNDS"); do
  for m in 4 8; do
    shm=$(run 16 "$m") gloo=$(run 0 "$m")
    echo "round $round m $m: shm $shm ms, gloo $gloo ms, shm/gloo $(python3 -c "print(round($shm / $gloo, 3))")"
    rows+=("{\"round\": $round, \"microbatches\": $m, \"shm_ms\": $shm, \"gloo_ms\": $gloo}")
  done
done
commit=$(bash "$HERE/source_commit.sh")
python3 - "$OUT" "$(IFS=,; echo "${rows[*]}")" "$commit" <<'PY'
import json, statistics, sys, time
rows = json.loads("[" + sys.argv[2] + "]")
summary = {}
for m in sorted({r["microbatches"] for r in rows}):
    ratios = [r["shm_ms"] / r["gloo_ms"] for r in rows if r["microbatches"] == m]
    summary[f"m{m}"] = {"median_shm_over_gloo": statistics.median(ratios), "per_round": ratios}
json.dump({"what": "pp=2 1F1B step time, pipeline sends through shared memory vs Gloo (comm.shm_mb 16 vs 0), "
                   "interleaved rounds", "commit": sys.argv[3], "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "rows": rows, "summary": summary}, open(sys.argv[1], "w"), indent=1)
print(json.dumps(summary))
PY
