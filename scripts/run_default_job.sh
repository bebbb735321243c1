#!/usr/bin/env bash
# Runs smp's default job (called by scripts/setup.sh after the build).
# Placeholder until the GPT training job lands.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${SMP_BUILD_DIR:-$repo/build}
echo "default job not yet available (build: $build)"
exit 0
