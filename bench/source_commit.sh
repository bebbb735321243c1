#!/usr/bin/env bash
# The commit a benchmark measures, for its result file: HEAD of this source
# tree, with "-dirty" when tracked files differ from it. The results and the
# page rendered from them do not count: a run rewrites them as it goes.
cd "$(dirname "${BASH_SOURCE[0]}")/.." 2>/dev/null || { echo "unknown (no source tree)"; exit 0; }
head=$(git rev-parse --short=12 HEAD 2>/dev/null) || { echo "unknown (not a git checkout)"; exit 0; }
changed=$(git status --porcelain --untracked-files=no -- . ':(exclude)bench/results' ':(exclude)docs/benchmarks.md' 2>/dev/null)
echo "$head${changed:+-dirty}"
