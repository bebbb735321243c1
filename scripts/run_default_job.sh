#!/usr/bin/env bash
# The default job (run by scripts/setup.sh after the build): a tiny GPT learning
# the licence texts every Debian system ships (/usr/share/common-licenses,
# package base-files), data-parallel over 2 ranks. About 10 s on 2 cores.
# Extra arguments go to smp-launch's worker, e.g. --set train.steps=50.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${SMP_BUILD_DIR:-$repo/build}
cd "$repo"
"$build/bin/smp-launch" --nproc-per-node 2 \
  --plugin gpt --config configs/gpt-tiny.toml --set parallel.dp=2 "$@"
echo "summary: $repo/runs/gpt-tiny/summary.json (the loss should end well below the data's unigram entropy, printed at start)"
