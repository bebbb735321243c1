#!/usr/bin/env bash
# Builds smp-bench (and what its jobs need) if needed, then runs every
# benchmark whose results docs/benchmarks.md renders (all but the one-off A/B
# comparisons of two commits, ab-*.json and *-ab.json), writing
# bench/results/*.json. Targets count only on >= 10 interleaved pairs, so the
# compared benchmarks run 10 repeats by default.
#
#   bench/run_all.sh
#   BUILD=build GPT_REPEAT=8 bench/run_all.sh
#   MAX_LOAD=1.5 WAIT=300 bench/run_all.sh   # wait for a quiet machine first
set -euo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$SRC/build-bench}"
GPT_REPEAT="${GPT_REPEAT:-10}"    # plain vs smp differ by a few %: many back-to-back pairs
PIPE_REPEAT="${PIPE_REPEAT:-2}"
TP_REPEAT="${TP_REPEAT:-3}"
MAX_LOAD="${MAX_LOAD:-1.5}"
WAIT="${WAIT:-300}"
JOBS="${JOBS:-2}"
OUT="${OUT:-$SRC/bench/results}"

if [[ ! -f "$BUILD/build.ninja" && ! -f "$BUILD/Makefile" ]]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja
fi
cmake --build "$BUILD" -j"$JOBS" --target smp-bench smp-launch smp-worker smp-data smp-generate smp-checkpoint gpt moe bert roberta ncf smp_nn smp_tp smp_partition smp_optim

mkdir -p "$OUT"
BENCH="$BUILD/bin/smp-bench"
wait_args=(--max-load "$MAX_LOAD" --wait "$WAIT")
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$BENCH" gpt      --repeat "$GPT_REPEAT"  "${wait_args[@]}" --out "$OUT/gpt.json"
"$BENCH" pipeline --repeat "$PIPE_REPEAT" "${wait_args[@]}" --out "$OUT/pipeline.json"
"$BENCH" tp       --repeat "$TP_REPEAT"   "${wait_args[@]}" --out "$OUT/tp.json"
# dp = 2 weak scaling against two independent one-rank jobs at once (the machine's bound).
"$BENCH" dp-scaling --repeat "${DP_REPEAT:-15}" "${wait_args[@]}" --out "$OUT/dp-scaling.json"
# The same gpt comparison with glibc's default heap settings (see bench/README.md, "Allocator").
"$BENCH" --default-malloc gpt --repeat 3 "${wait_args[@]}" --out "$OUT/gpt-default-malloc.json"
# Diagnostics used in the findings of docs/benchmarks.md.
MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TOP_PAD_=268435456 "$BENCH" zb-probe --micro-batch 4 --layers 2 --reps 7 > "$OUT/zb-probe.json"
"$BENCH" allreduce-probe --reps 7 > "$OUT/allreduce-probe.json"
# Against two PyTorch-eager loops, last: it needs /usr/bin/python3 with
# python3-torch. Its goals count only on the median of >= 10 interleaved pairs.
"$BENCH" eager --repeat "${EAGER_REPEAT:-10}" "${wait_args[@]}" --out "$OUT/eager.json"
# The other adapters against their plain loops, the schedule simulator against
# traced runs, op-by-op profiles, ZeRO step times and the memory estimate.
"$BENCH" ncf      --repeat "${MODEL_REPEAT:-10}" "${wait_args[@]}" --out "$OUT/ncf.json"
"$BENCH" bert     --repeat "${MODEL_REPEAT:-10}" "${wait_args[@]}" --out "$OUT/bert.json"
"$BENCH" roberta  --repeat "${MODEL_REPEAT:-10}" "${wait_args[@]}" --out "$OUT/roberta.json"
"$BENCH" pipeline-sim --repeat 7 "${wait_args[@]}" --out "$OUT/pipeline-sim.json"
"$BENCH" op-profile "${wait_args[@]}" --out "$OUT/op-profile.json"
python3 "$SRC/bench/zero_step_times.py" --build "$BUILD" --rounds 10 --out "$OUT/zero-step-times.json"
python3 "$SRC/bench/memory_estimate.py" --build "$BUILD" --out "$OUT/memory-estimate.json"
# Checkpoints: save and load times against the disk's write throughput, the async stall.
"$BENCH" checkpoint --repeat "${CKPT_REPEAT:-10}" "${wait_args[@]}" --out "$OUT/checkpoint.json"
# Generation: smp-generate vs a plain LibTorch KV-cache loop; Hugging Face export/import vs the disk.
"$BENCH" generate --repeat "${GEN_REPEAT:-10}" "${wait_args[@]}" --out "$OUT/generate.json"
# MoE: ep 2 vs ep 1, one rank vs a PyTorch-eager MoE, grouped GEMM, the preset vs its dense twin.
"$BENCH" moe --repeat "${MOE_REPEAT:-10}" "${wait_args[@]}" --out "$OUT/moe.json"
# Prepared data: smp-data prepare against spm_encode, the data share of the step, SentencePiece vs bytes.
python3 "$SRC/bench/data_bench.py" --build "$BUILD" --rounds 5 --out "$OUT/data.json"
# Pipeline sends through shared memory against Gloo; dp = 2 gradient buckets
# reduced during backward against one reduction after it.
python3 "$SRC/bench/ab.py" --build "$BUILD" --bench pp2 --a-set comm.shm_mb=0 --b-set comm.shm_mb=16 \
  --label "pipeline sends through shared memory (B) against Gloo (A)" --out "$OUT/p2p-transport.json"
python3 "$SRC/bench/ab.py" --build "$BUILD" --bench dp2 --a-set train.bucket_mb=4 --b-set train.bucket_mb=0 \
  --label "one gradient reduction after backward (B) against buckets reduced during it (A)" \
  --out "$OUT/dp2-overlap-ab.json"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
