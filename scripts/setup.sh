#!/usr/bin/env bash
# Sets smp up on Debian bookworm and builds it; by default then runs the default job.
#
#   bash scripts/setup.sh            # install what is missing, build, run the default job
#   bash scripts/setup.sh --no-job   # install what is missing, build (scripts/test.sh uses this)
#   SMP_TORCH=pip bash scripts/setup.sh --no-job    # the same against pip's torch (2.x, CUDA)
#
# Runs as root on a fresh machine (even without a compiler, CMake or git), with no
# stdin and CI=true. Idempotent: when every package is there it does not touch apt
# at all, and a rebuild with nothing changed takes seconds (Ninja + ccache).
#
# Environment:
#   SMP_BUILD_DIR    build folder (default: <repo>/build; <repo>/build-pip with
#                    SMP_TORCH=pip; <repo>/build-torch with Torch_DIR)
#   SMP_JOBS         parallel compile jobs (default: number of CPUs)
#   SMP_BUILD_TYPE   CMake build type for a fresh configure (default: Release)
#   SMP_TORCH        which LibTorch: debian (default: Debian's libtorch-dev 1.13,
#                    CPU) or pip (the one inside python3's `torch` wheel, installed
#                    with pip when missing or of another version; a CUDA wheel
#                    also needs the CUDA toolkit, nvcc, to configure)
#   SMP_TORCH_VERSION  the pip torch version (default 2.11.0)
#   SMP_TORCH_CUDA   with SMP_TORCH=pip: auto (default) builds with CUDA where the
#                    toolkit (nvcc) is, else on the wheel's CPU libraries alone
#                    (LibTorch 2.x on the CPU, no SMP_WITH_CUDA; default build
#                    folder <repo>/build-pip-cpu); 0 forces the latter, 1 the former
#   SMP_TEST_FAULTS  ON (default) or OFF: compile the fault points only the
#                    injected-fault tests switch on (OFF: a release build; CI's leg 2)
#   Torch_DIR        a LibTorch's CMake folder (<prefix>/share/cmake/Torch): build
#                    against it; neither libtorch-dev nor pip is then used
# A build folder remembers its LibTorch: one configured for another is
# configured again from scratch (its CMakeCache.txt is replaced).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
torch_kind=${SMP_TORCH:-debian}
torch_version=${SMP_TORCH_VERSION:-2.11.0}
torch_dir=${Torch_DIR:-}
jobs=${SMP_JOBS:-$(nproc 2>/dev/null || echo 2)}
build_type=${SMP_BUILD_TYPE:-Release}
run_job=1

usage() { sed -n '2,27s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

for arg in "$@"; do
  case $arg in
    --no-job) run_job=0 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$arg'" ;;
  esac
done

# Which LibTorch: Torch_DIR (explicit) > SMP_TORCH=pip > Debian's libtorch-dev.
case $torch_kind in
  debian|pip) ;;
  *) die "SMP_TORCH='$torch_kind': expected 'debian' or 'pip'" ;;
esac
if [[ -n $torch_dir ]]; then
  [[ -f $torch_dir/TorchConfig.cmake || -f $torch_dir/torch-config.cmake ]] ||
    die "Torch_DIR='$torch_dir' holds no TorchConfig.cmake (expected <libtorch>/share/cmake/Torch)"
  torch_dir=$(cd "$torch_dir" && pwd -P)
  torch_kind=dir
  default_build=$repo/build-torch
elif [[ $torch_kind == pip ]]; then
  # Without the CUDA toolkit a CUDA wheel's own CMake files cannot configure;
  # its CPU libraries alone can be built against (cmake/torch-wheel-cpu/).
  torch_cuda=${SMP_TORCH_CUDA:-auto}
  case $torch_cuda in
    0|1) ;;
    auto) if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then torch_cuda=1; else torch_cuda=0; fi ;;
    *) die "SMP_TORCH_CUDA='$torch_cuda': expected 'auto', '0' or '1'" ;;
  esac
  default_build=$repo/build-pip
  [[ $torch_cuda == 0 ]] && default_build=$repo/build-pip-cpu
else
  default_build=$repo/build
fi
build=${SMP_BUILD_DIR:-$default_build}

# ---------------------------------------------------------------------------
# >>> The text corpus the default GPT job trains on, as Debian packages.
# >>> (configs/gpt-*.toml read /usr/share/common-licenses, from base-files.)
# >>> Lead: change this when the default job's corpus changes.
SMP_CORPUS_PACKAGES=(base-files)
# ---------------------------------------------------------------------------

packages=(
  build-essential cmake ninja-build ccache git pkg-config
  libgloo-dev           # c10d's ProcessGroupGloo.hpp includes gloo/*.h
  libspdlog-dev libtomlplusplus-dev libboost-dev libboost-filesystem-dev
  libgtest-dev libcli11-dev nlohmann-json3-dev
  libopenblas0-openmp   # LibTorch's GEMM is ~15x slower on the reference BLAS
  libsentencepiece-dev sentencepiece   # smp-data's SentencePiece tokenizer; spm_encode
  "${SMP_CORPUS_PACKAGES[@]}"
)
case $torch_kind in
  # LibTorch 1.13.1 (CPU); python3-torch, Debian's python3 with that LibTorch,
  # runs the reference tests' Python (Megatron's own dataset reader).
  # python3-pip installs the reference packages below; iproute2's `ip` makes
  # the network namespaces of the partition test. Without them those checks
  # could only be skipped, and CI (SMP_REQUIRE_REFERENCES=1) fails on that.
  debian) packages+=(libtorch-dev python3-torch python3-pip iproute2) ;;
  pip)    # pip itself, when python3 has none (Debian's python3 then needs
          # --break-system-packages, below)
          python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip) ;;
esac

start=$(date +%s)

# ---- 1. Debian packages: only what is missing ----------------------------
command -v dpkg-query >/dev/null || die "dpkg-query not found: this script sets up Debian (bookworm)"
if [[ -r /etc/os-release ]] && ! grep -q '^VERSION_CODENAME=bookworm' /etc/os-release; then
  say "warning: not Debian bookworm; package names are bookworm's"
fi

missing_packages() {
  local installed
  installed=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${packages[@]}" 2>/dev/null |
              awk '$2 == "ii" {print $1}' || true)
  local p
  for p in "${packages[@]}"; do
    grep -qxF "$p" <<<"$installed" || echo "$p"
  done
}

mapfile -t missing < <(missing_packages)
if ((${#missing[@]} == 0)); then
  say "all ${#packages[@]} Debian packages present (apt not needed)"
else
  say "installing missing packages: ${missing[*]}"
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root to install: ${missing[*]} (run as root, or install them)"
    sudo=(sudo -n)
  fi
  "${sudo[@]}" apt-get update -q -o Dpkg::Use-Pty=0 </dev/null
  "${sudo[@]}" apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" </dev/null
  mapfile -t still_missing < <(missing_packages)
  ((${#still_missing[@]} == 0)) || die "still missing after apt-get install: ${still_missing[*]}"
fi

# LibTorch links libblas.so.3 / liblapack.so.3 through Debian's alternatives:
# make sure they point at OpenBLAS (OpenMP flavour), not the reference BLAS.
if command -v update-alternatives >/dev/null; then
  while read -r alt; do
    [[ -n $alt ]] || continue
    current=$(update-alternatives --query "$alt" 2>/dev/null | awk '/^Value:/ {print $2}')
    [[ $current == *openblas* ]] && continue
    want=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas-openmp | head -n1 || true)
    [[ -n $want ]] || continue
    if [[ $(id -u) -eq 0 ]]; then
      say "pointing $alt at $want (was ${current:-unset})"
      update-alternatives --quiet --set "$alt" "$want"
    else
      say "warning: $alt is ${current:-unset}; LibTorch will be slow (as root: update-alternatives --set $alt $want)"
    fi
  done < <(update-alternatives --get-selections 2>/dev/null | awk '$1 ~ /^lib(blas|lapack)\.so\.3/ {print $1}')
fi

# ---- 2. LibTorch: pip's torch (installed when missing or another version) --
# torch_args: what configure passes; want_torch_dir: the Torch_DIR the build
# folder must have (empty: whatever Debian's libtorch-dev provides).
torch_args=()
want_torch_dir=
torch_prefix=
if [[ $torch_kind == pip ]]; then
  command -v python3 >/dev/null || die "python3 not found (SMP_TORCH=pip needs python3 with pip)"
  have=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null | tail -n1 || true)
  if [[ ${have%%+*} != "$torch_version" ]]; then
    say "python3 has torch '${have:-none}'; installing torch==$torch_version with pip (CUDA wheels: several GB)"
    pip_args=(install -q --progress-bar off --no-cache-dir "torch==$torch_version")
    # Debian's own python3 refuses pip installs outside a venv (PEP 668).
    if python3 -c 'import os, sys, sysconfig; sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
      pip_args+=(--break-system-packages)
    fi
    python3 -m pip "${pip_args[@]}" </dev/null || die "pip install torch==$torch_version failed (network? disk space?)"
    have=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null | tail -n1 || true)
    [[ ${have%%+*} == "$torch_version" ]] || die "after pip install, python3 imports torch '${have:-none}', not $torch_version"
  fi
  torch_prefix=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null | tail -n1)
  [[ -f $torch_prefix/share/cmake/Torch/TorchConfig.cmake ]] ||
    die "python3's torch $have at '$torch_prefix' has no share/cmake/Torch/TorchConfig.cmake"
  torch_prefix=$(cd "$torch_prefix" && pwd -P)
  want_torch_dir=$torch_prefix/share/cmake/Torch
  say "LibTorch: pip torch $have at $torch_prefix"
  if [[ $torch_cuda == 0 ]]; then
    # The wheel's CPU half through a config of ours, generated per build folder.
    abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null | tail -n1)
    nvidia_libs=$(cd "$torch_prefix/.." && pwd -P)/nvidia
    nvidia_libs=$(find "$nvidia_libs" -maxdepth 3 -name 'libcudart.so*' -printf '%h\n' 2>/dev/null | head -n1)
    want_torch_dir=$build/torch-cpu
    mkdir -p "$want_torch_dir"
    for f in TorchConfig TorchConfigVersion; do
      sed -e "s|@TORCH_WHEEL@|$torch_prefix|g" -e "s|@TORCH_VERSION@|${have%%+*}|g" -e "s|@CXX11_ABI@|${abi:-1}|g" \
          -e "s|@NVIDIA_LIBS@|${nvidia_libs:-$torch_prefix/lib}|g" "$repo/cmake/torch-wheel-cpu/$f.cmake.in" >"$want_torch_dir/$f.cmake"
    done
    want_torch_dir=$(cd "$want_torch_dir" && pwd -P)
    say "LibTorch: no CUDA toolkit (or SMP_TORCH_CUDA=0): the wheel's CPU libraries alone, through $want_torch_dir"
  fi
elif [[ $torch_kind == dir ]]; then
  torch_prefix=$(cd "$torch_dir/../../.." && pwd -P)  # what TorchConfig.cmake takes as its prefix
  want_torch_dir=$torch_dir
  say "LibTorch: Torch_DIR=$torch_dir"
fi
if [[ -n $want_torch_dir ]]; then
  # Torch's own prefix first: with the Torch_DIR alone, find_library still picks
  # Debian's /usr/lib libtorch.so when libtorch-dev is installed.
  torch_args=(-DTorch_DIR="$want_torch_dir" -DCMAKE_PREFIX_PATH="$torch_prefix;$torch_prefix/share/cmake")
  # A CUDA LibTorch's CMake files look for the CUDA toolkit (nvcc) at configure time.
  if [[ ${torch_cuda:-} != 0 ]] && compgen -G "$torch_prefix/lib/libtorch_cuda.so*" >/dev/null && ! command -v nvcc >/dev/null; then
    if [[ -x /usr/local/cuda/bin/nvcc ]]; then
      export PATH=/usr/local/cuda/bin:$PATH
    else
      die "the LibTorch at $torch_prefix is a CUDA build, and its CMake files need the CUDA toolkit: nvcc is not on PATH nor in /usr/local/cuda/bin (install the toolkit, or use a CPU LibTorch)"
    fi
  fi
  # No GPU to detect here: name the architecture (only torch's flags for .cu files use it).
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
fi

# ---- 2b. Test references in .pydeps/ --------------------------------------
# data_test checks the BPE tokenizer token for token against Hugging Face's
# `tokenizers`, and the indexed format against Megatron's own reader and writer
# (megatron-core, which needs numpy and torch); checkpoint_test reads the GPT-2
# export with Hugging Face's `safetensors`. Where pip is missing or PyPI is
# unreachable those tests say so (GTEST_SKIP) and are skipped. Not fatal.
pydeps=(tokenizers==0.23.3 megatron-core==0.16.1 numpy safetensors==0.8.0)
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1 &&
   ! PYTHONPATH=$repo/.pydeps python3 -c "import tokenizers, numpy, megatron, safetensors, sys; sys.exit(tokenizers.__version__ != '0.23.3')" 2>/dev/null; then
  pip_args=(install -q --progress-bar off --no-cache-dir --no-deps --upgrade --target "$repo/.pydeps" "${pydeps[@]}")
  if python3 -c 'import os, sys, sysconfig; sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
    pip_args+=(--break-system-packages)
  fi
  if python3 -m pip "${pip_args[@]}" </dev/null >/dev/null 2>&1; then
    say "installed ${pydeps[*]} into .pydeps/ (data_test's and checkpoint_test's references)"
  else
    say "warning: could not pip install ${pydeps[*]} into .pydeps/; data_test's reference checks will be skipped"
  fi
fi

# transformers (4.40.2, the last that runs on Debian's python3-torch 1.13) and
# its pure-Python dependencies in .pydeps-hf/, apart from .pydeps/ (its
# tokenizers is another version): checkpoint_test reads smp's Llama export
# with transformers' LlamaForCausalLM. Not fatal either.
pydeps_hf=(transformers==4.40.2 tokenizers==0.19.1 huggingface_hub==0.23.4 safetensors==0.4.3 regex tqdm filelock
           packaging pyyaml fsspec requests urllib3 idna charset_normalizer certifi typing_extensions)
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1 &&
   [[ ! -f $repo/.pydeps-hf/transformers-4.40.2.dist-info/METADATA ]]; then
  pip_args=(install -q --progress-bar off --no-cache-dir --no-deps --upgrade --target "$repo/.pydeps-hf" "${pydeps_hf[@]}")
  if python3 -c 'import os, sys, sysconfig; sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
    pip_args+=(--break-system-packages)
  fi
  if python3 -m pip "${pip_args[@]}" </dev/null >/dev/null 2>&1; then
    say "installed transformers 4.40.2 and its dependencies into .pydeps-hf/ (checkpoint_test's Llama reference)"
  else
    say "warning: could not pip install transformers into .pydeps-hf/; the Llama reference check will be skipped"
  fi
fi

# ---- 3. Configure (once per LibTorch) and build --------------------------
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -n1; }
fresh=()
if [[ -f $build/CMakeCache.txt ]]; then
  generator=$(cache_value CMAKE_GENERATOR)
  [[ $generator == Ninja ]] ||
    die "$build was configured with '$generator', not Ninja: remove it or set SMP_BUILD_DIR"
  # A build folder configured for another LibTorch is configured again from scratch.
  cached_torch_dir=$(cache_value Torch_DIR)
  [[ -n $cached_torch_dir && -d $cached_torch_dir ]] && cached_torch_dir=$(cd "$cached_torch_dir" && pwd -P)
  if [[ -n $want_torch_dir && $cached_torch_dir != "$want_torch_dir" ]] ||
     [[ -z $want_torch_dir && $cached_torch_dir != /usr/* ]]; then
    wanted=${want_torch_dir:-/usr/... (libtorch-dev)}
    say "$build was configured for the LibTorch at '${cached_torch_dir:-?}', not $wanted: configuring it again from scratch"
    fresh=(--fresh)
  fi
fi
if [[ ! -f $build/CMakeCache.txt || ${#fresh[@]} -gt 0 ]]; then
  if ((${#fresh[@]})) && ! cmake --help 2>/dev/null | grep -q -- '--fresh'; then
    rm -f "$build/CMakeCache.txt"; fresh=()  # CMake < 3.24
  fi
  say "configuring $build ($build_type)"
  cmake "${fresh[@]}" -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${torch_args[@]}" </dev/null
  if [[ -n $torch_prefix ]]; then
    found=$(cache_value TORCH_LIBRARY)
    [[ $(readlink -f "$found") == "$torch_prefix"/* ]] ||
      die "configure picked the libtorch '$found', not the one in $torch_prefix/lib (is another LibTorch on CMAKE_PREFIX_PATH?)"
  fi
fi
# The fault points only tests switch on (CMakeLists.txt, SMP_TEST_FAULTS).
if [[ -n ${SMP_TEST_FAULTS:-} && $(cache_value SMP_TEST_FAULTS) != "$SMP_TEST_FAULTS" ]]; then
  say "configuring $build with SMP_TEST_FAULTS=$SMP_TEST_FAULTS"
  cmake -DSMP_TEST_FAULTS="$SMP_TEST_FAULTS" "$build" </dev/null >/dev/null
fi
say "building with $jobs jobs"
cmake --build "$build" -j "$jobs" </dev/null
say "built in $build ($(($(date +%s) - start)) s)"

# ---- 4. The default job ---------------------------------------------------
if ((run_job)); then
  export SMP_BUILD_DIR=$build
  exec bash "$repo/scripts/run_default_job.sh"
fi
