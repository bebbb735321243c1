#!/usr/bin/env bash
# Sets smp up on Debian bookworm and builds it; by default then runs the default job.
#
#   bash scripts/setup.sh            # install what is missing, build, run the default job
#   bash scripts/setup.sh --no-job   # install what is missing, build (scripts/test.sh uses this)
#
# Runs as root on a fresh machine (even without a compiler, CMake or git), with no
# stdin and CI=true. Idempotent: when every package is there it does not touch apt
# at all, and a rebuild with nothing changed takes seconds (Ninja + ccache).
#
# Environment:
#   SMP_BUILD_DIR    build folder (default: <repo>/build)
#   SMP_JOBS         parallel compile jobs (default: number of CPUs)
#   SMP_BUILD_TYPE   CMake build type for a fresh configure (default: Release)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${SMP_BUILD_DIR:-$repo/build}
jobs=${SMP_JOBS:-$(nproc 2>/dev/null || echo 2)}
build_type=${SMP_BUILD_TYPE:-Release}
run_job=1

usage() { sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

for arg in "$@"; do
  case $arg in
    --no-job) run_job=0 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$arg'" ;;
  esac
done

# ---------------------------------------------------------------------------
# >>> The text corpus the default GPT job trains on, as Debian packages.
# >>> (configs/gpt-*.toml read /usr/share/common-licenses, from base-files.)
# >>> Lead: change this when the default job's corpus changes.
SMP_CORPUS_PACKAGES=(base-files)
# ---------------------------------------------------------------------------

packages=(
  build-essential cmake ninja-build ccache git pkg-config
  libtorch-dev          # LibTorch 1.13.1 (CPU)
  libgloo-dev           # c10d's ProcessGroupGloo.hpp includes gloo/*.h
  libspdlog-dev libtomlplusplus-dev libboost-dev libboost-filesystem-dev
  libgtest-dev libcli11-dev nlohmann-json3-dev
  libopenblas0-openmp   # LibTorch's GEMM is ~15x slower on the reference BLAS
  "${SMP_CORPUS_PACKAGES[@]}"
)

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

# ---- 2. Configure (once) and build ---------------------------------------
if [[ -f $build/CMakeCache.txt ]]; then
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
  [[ $generator == Ninja ]] ||
    die "$build was configured with '$generator', not Ninja: remove it or set SMP_BUILD_DIR"
else
  say "configuring $build ($build_type)"
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" </dev/null
fi
say "building with $jobs jobs"
cmake --build "$build" -j "$jobs" </dev/null
say "built in $build ($(($(date +%s) - start)) s)"

# ---- 3. The default job ---------------------------------------------------
if ((run_job)); then
  export SMP_BUILD_DIR=$build
  exec bash "$repo/scripts/run_default_job.sh"
fi
