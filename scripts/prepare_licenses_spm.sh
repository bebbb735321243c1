#!/usr/bin/env bash
# The corpus configs/gpt-small-spm.toml trains on: Debian's licence texts
# (/usr/share/common-licenses, package base-files) tokenized by a SentencePiece
# unigram model of 2000 pieces trained on them, prepared in Megatron's format.
#   bash scripts/prepare_licenses_spm.sh [OUT_DIR]   (default: data/, beside configs/)
# writes OUT_DIR/licenses-spm.model (.vocab) and OUT_DIR/licenses-spm.bin (.idx).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build=${SMP_BUILD_DIR:-$repo/build}
out=${1:-$repo/data}
tool=$build/bin/smp-data
[[ -x $tool ]] || { echo "prepare_licenses_spm.sh: $tool not found (build first, or set SMP_BUILD_DIR)" >&2; exit 1; }
mkdir -p "$out"
"$tool" tokenizer --type unigram --vocab 2000 --input /usr/share/common-licenses --output-prefix "$out/licenses-spm"
"$tool" prepare --input /usr/share/common-licenses --tokenizer sentencepiece \
  --tokenizer-model "$out/licenses-spm.model" --output-prefix "$out/licenses-spm"
