#!/usr/bin/env bash
# Downloads, on a Debian bookworm machine with network, the .deb files that
# scripts/gpu/check.sh unpacks on a GPU machine that has no network: the build's
# C++ dependencies beyond LibTorch, CUDA, a compiler, CMake and ninja (which the
# GPU machine has). They land in <repo>/.gpu-deps/ (git-ignored; carry it).
#
#   bash scripts/gpu/fetch-deps.sh
#
# Nothing is installed: `apt-get download` only (`apt-get update` only when apt
# does not know a package yet). Idempotent: a .deb already there in the version
# apt offers is not downloaded again; another version of it is replaced.
# Fails if the folder ends up larger than SMP_GPU_DEPS_MAX_MIB (default 48).
#
# Environment:
#   SMP_GPU_DEPS_DIR       where the .deb files go (default: <repo>/.gpu-deps)
#   SMP_GPU_DEPS_MAX_MIB   size limit in MiB (default 48; the tree that travels is 64)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${SMP_GPU_DEPS_DIR:-$repo/.gpu-deps}
max_mib=${SMP_GPU_DEPS_MAX_MIB:-48}

usage() { sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
say() { echo "fetch-deps: $*"; }
die() { echo "fetch-deps: error: $*" >&2; exit 1; }

for arg in "$@"; do
  case $arg in
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$arg'" ;;
  esac
done

# ---------------------------------------------------------------------------
# Bookworm package names. Runtime libraries come with their -dev packages
# because the -dev packages hold only the .so link and CMake files.
# Boost: 1.81 (bookworm's newer Boost, kinder to a newer g++; the default
# build's libboost-dev is 1.74). Boost.Filesystem 1.81's CMake files load
# boost_atomic's (find_package), hence libboost-atomic1.81-dev and its library.
# GoogleTest: libgtest-dev only (no test uses gmock; its sources package
# `googletest` is not needed). Gloo: headers only (libgloo-dev, no libgloo0).
# LibTorch and CUDA are never fetched: the GPU machine has its own.
packages=(
  libspdlog-dev libspdlog1.10
  libfmt-dev libfmt9
  libtomlplusplus-dev libtomlplusplus3
  libboost1.81-dev
  libboost-filesystem1.81-dev libboost-filesystem1.81.0
  libboost-atomic1.81-dev libboost-atomic1.81.0
  libcli11-dev
  nlohmann-json3-dev
  libgtest-dev
  libgloo-dev
)
# ---------------------------------------------------------------------------

command -v apt-get >/dev/null || die "apt-get not found: run this on Debian bookworm (package names are bookworm's)"
if [[ -r /etc/os-release ]] && ! grep -q '^VERSION_CODENAME=bookworm' /etc/os-release; then
  say "warning: not Debian bookworm; the GPU build expects bookworm's versions (spdlog 1.10, fmt 9)"
fi
[[ $(dpkg --print-architecture 2>/dev/null || echo amd64) == amd64 ]] ||
  die "this machine is not amd64: the GPU machine is x86-64 (use -o APT::Architecture=amd64 by hand)"

# The versions apt would download ("package version" lines; one apt-cache call,
# it is slow), and the version of one package from them (empty when unknown).
candidates() {
  apt-cache policy "${packages[@]}" 2>/dev/null |
    awk '/^[^ ].*:$/ {p = substr($0, 1, length($0) - 1)} /^  Candidate:/ && $2 != "(none)" {print p, $2}'
}
versions=$(candidates)
candidate() { awk -v p="$1" '$1 == p {print $2}' <<<"$versions"; }

unknown=()
for p in "${packages[@]}"; do [[ -n $(candidate "$p") ]] || unknown+=("$p"); done
if ((${#unknown[@]})); then
  say "apt does not know ${unknown[*]}: running apt-get update"
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root for apt-get update (apt does not know: ${unknown[*]})"
    sudo=(sudo -n)
  fi
  "${sudo[@]}" apt-get update -q -o Dpkg::Use-Pty=0 </dev/null
  versions=$(candidates)
  for p in "${unknown[@]}"; do
    [[ -n $(candidate "$p") ]] || die "package '$p' not found by apt after apt-get update (bookworm main needed)"
  done
fi

mkdir -p "$dest"
cd "$dest"
# As root, apt fetches as user _apt, who cannot write here: download as root
# (what apt falls back to anyway, with a warning per file).
apt_opts=(-q -o Dpkg::Use-Pty=0)
[[ $(id -u) -ne 0 ]] || apt_opts+=(-o APT::Sandbox::User=root)
fetched=0 kept=0
for p in "${packages[@]}"; do
  v=$(candidate "$p")
  file_v=${v//:/%3a}   # apt-get download writes the epoch's ':' as %3a
  if compgen -G "${p}_${file_v}_*.deb" >/dev/null; then
    kept=$((kept + 1))
    continue
  fi
  # Another version of the same package (an older point release): replace it.
  for old in "${p}"_*.deb; do
    [[ -e $old ]] && { say "replacing $old"; rm -f -- "$old"; }
  done
  say "downloading $p $v"
  apt-get download "${apt_opts[@]}" "$p=$v" </dev/null ||
    die "apt-get download $p=$v failed (network? run apt-get update?)"
  compgen -G "${p}_${file_v}_*.deb" >/dev/null || die "apt-get download $p=$v wrote no ${p}_${file_v}_*.deb in $dest"
  fetched=$((fetched + 1))
done

# Anything else in the folder (a package dropped from the list) is left alone
# but named, since check.sh unpacks every .deb there.
for f in *.deb; do
  name=${f%%_*}
  printf '%s\n' "${packages[@]}" | grep -qxF "$name" || say "warning: $f is not in the list (check.sh unpacks it too)"
done

bytes=$(du -cb -- *.deb | awk 'END {print $1}')
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
say "$dest: $(ls -1 -- *.deb | wc -l) .deb files, $mib MiB ($fetched downloaded, $kept already there)"
awk -v b="$bytes" -v m="$max_mib" 'BEGIN {exit !(b <= m * 1048576)}' ||
  die "$dest is $mib MiB, over the limit of $max_mib MiB (SMP_GPU_DEPS_MAX_MIB)"
