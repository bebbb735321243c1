#!/usr/bin/env bash
# GpuCheck.DryRunWritesEveryField: scripts/gpu/check.sh --dry-run on the CPU
# with the build folder CTest runs from (nothing is built), then its
# gpu-check.json checked field by field (validate_gpu_check.py --dry-run).
# Exits 77 (CTest: skipped) where python3 cannot import torch: the check's
# peers and JSON writer need it.
#
#   bash tests/gpu/dry_run_test.sh <build dir> <scratch dir>
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${1:?build dir}
scratch=${2:?scratch dir}
py=${SMP_GPU_PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "SKIPPED: GpuCheck.DryRunWritesEveryField: no $py on PATH"
  exit 77
fi
if ! why=$("$py" -c 'import torch' 2>&1); then
  echo "SKIPPED: GpuCheck.DryRunWritesEveryField: $py cannot import torch${why:+ ($(tail -n1 <<<"$why"))}"
  exit 77
fi
rm -rf "$scratch"
mkdir -p "$scratch"
start=$(date +%s)
OUT=$scratch BUILD=$build SMP_GPU_PYTHON=$(command -v "$py") bash "$repo/scripts/gpu/check.sh" --dry-run >"$scratch/console.log" 2>&1
rc=$?
secs=$(($(date +%s) - start))
grep '^check:' "$scratch/console.log"
if ((rc != 0)); then
  echo "FAILED: the dry run exited $rc after ${secs} s; the last lines of its log:"
  tail -n 40 "$scratch/console.log"
  exit 1
fi
"$py" "$here/validate_gpu_check.py" "$scratch/gpu-check.json" --dry-run || exit 1
echo "the dry run took ${secs} s"
