#!/usr/bin/env bash
# CI leg 2: smp against the LibTorch inside pip's `torch` wheel (2.x, a CUDA
# build) instead of Debian's libtorch-dev 1.13 (leg 1, scripts/test.sh).
#
#   bash scripts/ci_pip_torch.sh            # .ci/run calls it after scripts/test.sh
#   bash scripts/ci_pip_torch.sh -R Config  # extra arguments go to ctest
#
# 1. Skips (exit 0, with a loud `=== SKIPPED: ... ===` line) when the wheel
#    cannot be had: torch==$SMP_TORCH_VERSION is not installed and the package
#    index is unreachable.
# 2. `SMP_TORCH=pip bash scripts/setup.sh --no-job`: installs the wheel when
#    missing, configures and builds <repo>/build-pip. Where there is no CUDA
#    toolkit (nvcc), whose files the wheel's CMake config needs, it builds
#    <repo>/build-pip-cpu against the wheel's CPU libraries alone
#    (cmake/torch-wheel-cpu): LibTorch 2.x on the CPU either way, so the fp16
#    tests, which Debian's 1.13 cannot run on the CPU, run on every CI machine.
#    SMP_TORCH_CUDA=0 forces the CPU-only build.
# 3. With the toolkit, checks that CUDA and NCCL are compiled in: smp_core
#    built with SMP_WITH_CUDA=1, and libsmp_core.so refers to c10d's
#    ProcessGroupNCCL. Without it, that smp_core was built without CUDA.
# 4. Runs the test suite in build-pip on the CPU (no GPU here: the CUDA tests
#    skip themselves), the subset in `ctest_subset` below.
# Any build, check or test failure exits non-zero.
#
# Environment: SMP_TORCH_VERSION (default 2.11.0), SMP_BUILD_DIR (default
# <repo>/build-pip, or <repo>/build-pip-cpu without CUDA), SMP_TORCH_CUDA
# (auto, 0 or 1; see setup.sh), SMP_JOBS (see setup.sh), SMP_TEST_JOBS (default 2).
set -euo pipefail

# ---------------------------------------------------------------------------
# Which tests leg 2 runs (ctest arguments). Empty: the whole suite, as leg 1.
# Leg 2 is about the other LibTorch (c10d, Gloo, autograd, DLPack, the ABI,
# CUDA skips) and is a release build (-DSMP_TEST_FAULTS=OFF), so it leaves out
# what only repeats leg 1's arithmetic or tests smp's own tools: the adapters'
# learning tests, job-error messages, all but a few multi-rank equivalence
# runs (cp and the Llama layouts too), the planner's calibration, the KV
# cache's layouts, greedy generation against transformers (a reference check
# leg 1 runs), activation checkpointing's equalities, the checkpoint crash
# loop, restarts, errors, tool and resharding runs, the launcher's options,
# the prepared-data formats and the memory-estimate runs; it keeps checkpoint
# resume and precision (fp16 runs on the CPU only with LibTorch 2), ZeRO + pp
# + tp on 8 ranks, the out-of-tree SDK build (the installed CMake package
# finding pip's torch) and InjectedFaults (here: that SMP_TEST_FAULT is
# refused; leg 1 injects the faults). Also left out: the network partition,
# the GPU check's dry run (a script and Python over the same binaries; leg 1
# runs it) and the documented commands. An exclusion list: new tests run in
# both legs.
ctest_subset=(-E '^(Bert|Roberta|EncoderAdapters|Ncf|JobErrors|BertEquivalence|RobertaEquivalence|TowersEquivalence|NcfEquivalence|ContextEquivalence|ExpertsEquivalence|OptimizerEquivalence|CheckpointCrash|CheckpointReshard|CheckpointRestart|CheckpointErrors|CheckpointTool|LaunchTest|PreparedData|MemoryEstimate|NetworkPartition|GpuCheck)\.|^Docs\.EveryShellCommandRuns$|^MoeEquivalence\.CapacityDrops|^GptEquivalence\.(Pipeline|ShardedDataParallel$|TensorAndDataParallel|PaddedVocabulary|MaskedLoss|TheTutorials|SequenceParallel|PlainSgd|ContextParallel|LlamaArch)|^Plan\.Calibrate|^Generate\.(TheKvCache|GreedyEquals)|^ActivationCheckpointing\.')
# ---------------------------------------------------------------------------

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SMP_TORCH=pip
export SMP_TORCH_VERSION=${SMP_TORCH_VERSION:-2.11.0}

say() { echo "ci-leg2: $*"; }
die() { echo "ci-leg2: error: $*" >&2; exit 1; }
skip() {
  echo
  echo "=== SKIPPED: CI leg 2 (pip torch CUDA build): $* ==="
  echo
  exit 0
}

# ---- 1. Can leg 2 run here? ----------------------------------------------
have=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null | tail -n1 || true)
if [[ ${have%%+*} == "$SMP_TORCH_VERSION" ]]; then
  say "python3 already has torch $have (no download needed)"
else
  # The index pip would use (a mirror when PIP_INDEX_URL names one).
  index=${PIP_INDEX_URL:-https://pypi.org/simple}
  url=${index%/}/torch/
  say "python3 has torch '${have:-none}'; checking that $url is reachable"
  if command -v curl >/dev/null; then
    err=$(curl -sSf -m 20 -I -o /dev/null "$url" 2>&1) ||
      skip "the package index is unreachable ($url: ${err//$'\n'/ }), and torch==$SMP_TORCH_VERSION is not installed"
  elif command -v python3 >/dev/null; then
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=20)' "$url" 2>/dev/null ||
      skip "the package index is unreachable ($url), and torch==$SMP_TORCH_VERSION is not installed"
  else
    skip "neither curl nor python3 to reach the package index, and torch==$SMP_TORCH_VERSION is not installed"
  fi
fi
cuda=${SMP_TORCH_CUDA:-auto}
if [[ $cuda == auto ]]; then
  if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then cuda=1; else cuda=0; fi
fi
export SMP_TORCH_CUDA=$cuda
if ((!cuda)); then
  say "no CUDA toolkit (nvcc on PATH or in /usr/local/cuda/bin) or SMP_TORCH_CUDA=0: building on the wheel's CPU libraries alone"
fi
export SMP_BUILD_DIR=${SMP_BUILD_DIR:-$repo/build-pip$( ((cuda)) || echo -cpu)}
build=$SMP_BUILD_DIR

# ---- 2. Install (if needed), configure, build ----------------------------
# A release build: without the fault points only tests switch on (leg 1 runs
# the injected-fault tests; here InjectedFaults checks that the setting is refused).
SMP_TEST_FAULTS=OFF bash "$repo/scripts/setup.sh" --no-job

# ---- 3. CUDA and NCCL compiled in -----------------------------------------
core=$(find "$build" -maxdepth 3 -name 'libsmp_core.so*' -type f 2>/dev/null | head -n1)
[[ -n $core ]] || die "no libsmp_core.so under $build"
if [[ $cuda == 0 ]]; then
  ! grep -q -- '-DSMP_WITH_CUDA=1' "$build/build.ninja" || die "a CPU-only build compiled smp_core with SMP_WITH_CUDA=1"
  echo "=== CI leg 2: built against pip torch $have on its CPU libraries alone (no CUDA toolkit here): SMP_WITH_CUDA off ==="
fi
if [[ $cuda == 1 ]]; then
  grep -q -- '-DSMP_WITH_CUDA=1' "$build/build.ninja" ||
    die "smp_core was compiled without SMP_WITH_CUDA=1 ($build/build.ninja): CMake did not see torch_cuda"
  nccl_syms=$(nm -DC "$core" | grep -c 'ProcessGroupNCCL' || true)
  ((nccl_syms > 0)) || die "$core refers to no c10d::ProcessGroupNCCL symbol: NCCL is not compiled in (USE_C10D_NCCL?)"
  torch_line=$(python3 -c '
  import torch
  nccl = ".".join(map(str, torch.cuda.nccl.version()))
  print("torch %s, CUDA %s, NCCL %s" % (torch.__version__, torch.version.cuda, nccl))' 2>/dev/null | tail -n1 || true)
  echo "=== CI leg 2: built against pip ${torch_line:-torch $have}: SMP_WITH_CUDA=1, $(basename "$core") refers to ProcessGroupNCCL ($nccl_syms symbols) ==="
fi

# ---- 4. The tests, on the CPU ---------------------------------------------
# A test that configures CMake projects of its own (sdk_out_of_tree_test)
# must find this torch, not Debian's libtorch-dev in /usr: the environment's
# CMAKE_PREFIX_PATH comes before the system folders.
torch_prefix=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null | tail -n1)
export CMAKE_PREFIX_PATH="$torch_prefix:$torch_prefix/share/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
[[ $cuda == 0 ]] || command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
say "ctest in $build${ctest_subset[*]:+ (subset: ${ctest_subset[*]})}"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "${SMP_TEST_JOBS:-2}" \
  --output-junit "$build/Testing/ctest-results.xml" "${ctest_subset[@]}" "$@"
