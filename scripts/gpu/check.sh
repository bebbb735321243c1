#!/usr/bin/env bash
# The GPU check: builds smp against the machine's pip torch (CUDA) and the
# Debian packages carried in .gpu-deps/ (scripts/gpu/fetch-deps.sh), runs the
# tests labelled `cuda` and the GPU benchmark, and writes the results.
#
#   bash scripts/gpu/check.sh             # on a machine with a GPU, from anywhere
#   bash scripts/gpu/check.sh --dry-run   # here, without a GPU: steps a-d only
#   bash scripts/gpu/check.sh --system-deps   # the packages are installed: no .gpu-deps
#
# Steps (each timed; a failed step is recorded and the next one that can still
# run does; a failed configure or build ends the check):
#   a. python with torch (python3, then /opt/torch/.venv/bin/python), the GPU
#   b. unpack .gpu-deps/*.deb into a prefix (dpkg -x; ar + tar without dpkg)
#   c. configure against torch + the prefix, checking that every dependency
#      was found in the prefix (not in /usr)
#   d. build (all targets)
#   e. ctest -L cuda (JUnit to $OUT/ctest-cuda.xml)
#   f. the benchmark: smp-launch, 1 rank, bench/configs/gpt-1.3b-bf16.toml
#   g. $OUT/gpu-check.json: machine, versions, each step's status and seconds,
#      the ctest counts and failed tests, the benchmark's summary.json
# The log is $OUT/check.log. Exits non-zero when any step failed.
#
# Environment:
#   OUT                 where results go (default: <repo>/gpu-out)
#   BUILD               build folder (default: <repo>/build-gpu)
#   SMP_GPU_PREFIX      where the .deb files are unpacked (default /tmp/smp-prefix)
#   SMP_GPU_DEPS_DIR    the .deb files (default: <repo>/.gpu-deps)
#   SMP_GPU_PYTHON      the python to use (default: the first of python3,
#                       /opt/torch/.venv/bin/python that imports torch)
#   SMP_GPU_JOBS        build jobs (default: nproc)
#   SMP_GPU_TARGETS     ninja targets to build (default: all); `auto`: only the
#                       test programs labelled cuda (smp_add_test(... LABELS
#                       "...;cuda") in tests/), smp-launch, smp-worker and gpt
#   SMP_GPU_BUDGET_S    wall-time budget of the whole check in seconds (default
#                       570): ctest and the benchmark get at most what is left
#   SMP_GPU_BENCH_CONFIG  the benchmark's config (default bench/configs/gpt-1.3b-bf16.toml)
#   SMP_GPU_BENCH_RESERVE_S  seconds of the budget kept from ctest for the
#                       benchmark (default 250; it took 61-72 s on an H200)
#   SMP_GIT_COMMIT      the commit to record when there is no .git to ask
#   SMP_GPU_DRY_RUN=1   the same as --dry-run: steps e and f are skipped
#                       without a GPU; the JSON says so
#   SMP_GPU_DRY_BUILD=core  in a dry run, build only smp_core (default: all)
#   SMP_GPU_SYSTEM_DEPS=1  the same as --system-deps: use the spdlog, fmt, toml++,
#                       Boost, CLI11, nlohmann-json, GoogleTest and gloo headers
#                       installed on the machine (e.g. bookworm's packages, as
#                       scripts/setup.sh installs them); step b is skipped
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
t0=$(date +%s)

usage() { sed -n '2,46s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
say() { echo "check: $*"; }

dry=0
[[ ${SMP_GPU_DRY_RUN:-0} == 1 ]] && dry=1
system_deps=0
[[ ${SMP_GPU_SYSTEM_DEPS:-0} == 1 ]] && system_deps=1
for arg in "$@"; do
  case $arg in
    --dry-run) dry=1 ;;
    --system-deps) system_deps=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; echo "check: error: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

out_default=0
if [[ -z ${OUT:-} ]]; then
  OUT=$repo/gpu-out
  out_default=1
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
build=${BUILD:-$repo/build-gpu}
[[ $build == /* ]] || build=$repo/$build
prefix=${SMP_GPU_PREFIX:-/tmp/smp-prefix}
[[ $prefix == /* ]] || prefix=$repo/$prefix
deps=${SMP_GPU_DEPS_DIR:-$repo/.gpu-deps}
[[ $deps == /* ]] || deps=$repo/$deps
jobs=${SMP_GPU_JOBS:-$(nproc 2>/dev/null || echo 4)}
budget=${SMP_GPU_BUDGET_S:-570}
bench_config=${SMP_GPU_BENCH_CONFIG:-bench/configs/gpt-1.3b-bf16.toml}
multiarch=x86_64-linux-gnu
libdir=$prefix/usr/lib/$multiarch
# Two packages get prefixes of their own, below the main one. Their headers
# must not share the include folder of the rest: that folder is an -isystem,
# which for some targets comes before LibTorch's (where Debian's /usr/include
# always comes last), and LibTorch bundles its own fmt (12), which the c10d
# boundary (core/src/comm/c10d_compat.cpp) must see rather than spdlog's fmt 9;
# gloo's folder is an -isystem of that same target (SMP_GLOO_INCLUDE_DIR).
fmt_prefix=$prefix/fmt
gloo_prefix=$prefix/gloo
subprefix_of() {
  case $1 in
    libfmt-dev|libfmt9) echo "$fmt_prefix" ;;
    libgloo-dev) echo "$gloo_prefix" ;;
    *) echo "$prefix" ;;
  esac
}

# Everything printed from here on also goes to the log.
log=$OUT/check.log
: >"$log"
exec > >(tee -a "$log") 2>&1
tee_pid=$!
((out_default)) && say "OUT is not set: results go to $OUT"
if ((system_deps)); then
  say "repo $repo, build $build, the system's packages, OUT $OUT, dry run: $dry, budget ${budget}s"
else
  say "repo $repo, build $build, prefix $prefix, OUT $OUT, dry run: $dry, budget ${budget}s"
fi

# Results, read by the JSON writer: one line per step (step, status, seconds,
# detail) and one per fact (key, value), tab-separated.
state=$(mktemp -d /tmp/smp-gpu-check.XXXXXX)
: >"$state/steps.tsv"
: >"$state/facts.tsv"
fact() { printf '%s\t%s\n' "$1" "${2//$'\n'/ }" >>"$state/facts.tsv"; }
failed=0
step_t0=0
step_begin() {
  step_t0=$(date +%s)
  echo
  say "==== $1 ($(($(date +%s) - t0)) s into the check) ===="
}
# step_end <step> <ok|failed|skipped> [detail]
step_end() {
  local secs=$(($(date +%s) - step_t0)) status=$2 detail=${3:-}
  [[ $status == failed ]] && failed=1
  printf '%s\t%s\t%s\t%s\n' "$1" "$status" "$secs" "${detail//$'\n'/ }" >>"$state/steps.tsv"
  say "---- $1: $status${detail:+: $detail} (${secs} s)"
  write_json || true
}
left() { echo $((budget - ($(date +%s) - t0))); }

py=
torch_dir=
gpu=0

# ---- g. the JSON (written after every step, so a killed check leaves one) --
write_json() {
  local writer=${py:-$(command -v python3 || true)}
  if [[ -z $writer ]]; then
    printf '{"status": "failed", "error": "no python to write this JSON", "date": "%s"}\n' \
      "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$OUT/gpu-check.json"
    return
  fi
  "$writer" - "$state" "$OUT" "$dry" <<'PY'
import json, os, sys, time
import xml.etree.ElementTree as ET

state, out, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"

def tsv(name):
    with open(os.path.join(state, name)) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]

facts = {}
for row in tsv("facts.tsv"):
    facts[row[0]] = row[1] if len(row) > 1 else ""

steps = {}
for row in tsv("steps.tsv"):
    step, status, secs = row[0], row[1], row[2]
    detail = row[3] if len(row) > 3 else ""
    steps[step] = {"status": status if not detail else f"{status}: {detail}", "seconds": int(secs)}

def num(key):
    try:
        return float(facts[key])
    except (KeyError, ValueError):
        return None

# ctest: counts from the JUnit file ctest wrote, failed tests by name.
ctest = None
junit = os.path.join(out, "ctest-cuda.xml")
if os.path.exists(junit):
    try:
        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        cases = [c for s in suites for c in s.iter("testcase")]
        failed_names, skipped_names, passed = [], [], 0
        for c in cases:
            name = c.get("name")
            if c.find("failure") is not None or c.find("error") is not None or c.get("status") == "fail":
                failed_names.append(name)
            elif c.find("skipped") is not None or c.get("status") in ("notrun", "disabled"):
                skipped_names.append(name)
            else:
                passed += 1
        ctest = {"tests": len(cases), "passed": passed, "failed": len(failed_names),
                 "skipped": len(skipped_names), "failed_tests": failed_names,
                 "skipped_tests": skipped_names}
    except Exception as e:  # a half-written file from a killed ctest
        ctest = {"error": f"cannot read {junit}: {e}"}
if ctest is not None and "ctest_exit" in facts:
    ctest["exit_code"] = int(facts["ctest_exit"])

# The benchmark: the fields of interest, and the whole summary.json.
bench = None
summary_path = facts.get("bench_summary")
if summary_path and os.path.exists(summary_path):
    with open(summary_path) as f:
        summary = json.load(f)
    unit = summary.get("throughput_unit", "tokens")
    keys = ["device", "precision", "step_seconds", "throughput_unit", unit + "_per_s", "mfu",
            "model_flops_per_step", "model_flops_per_s", "peak_flops_per_rank", "peak_flops_gemm",
            "peak_memory_bytes", "peak_activation_bytes", "final_loss", "skipped_steps",
            "phase_seconds", "layout"]
    bench = {k: summary[k] for k in keys if k in summary}
    if "model_flops_per_s" in summary:
        bench["model_tflops_per_s"] = summary["model_flops_per_s"] / 1e12
    mem = summary.get("peak_memory_bytes")
    if isinstance(mem, list) and mem:
        bench["peak_memory_gib_max"] = max(mem) / 2**30
    bench["config"] = facts.get("bench_config")
    bench["exit_code"] = int(facts["bench_exit"]) if "bench_exit" in facts else None
    bench["summary"] = summary
elif "bench_exit" in facts:
    bench = {"config": facts.get("bench_config"), "exit_code": int(facts["bench_exit"]),
             "error": "no summary.json", "log_tail": facts.get("bench_tail", "")}

found = {k[len("found."):]: v for k, v in facts.items() if k.startswith("found.")}
bad = [s for s, v in steps.items() if v["status"].startswith("failed")]
doc = {
    "date": facts.get("date") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "dry_run": dry,
    "status": "failed" if bad else "ok",
    "failed_steps": bad,
    "git_commit": facts.get("git_commit"),
    "git_dirty_files": int(facts["git_dirty"]) if facts.get("git_dirty", "").isdigit() else None,
    "source_digest": facts.get("source_digest"),
    "gpu": {"name": facts.get("gpu_name"), "count": int(facts["gpu_count"]) if facts.get("gpu_count", "").isdigit() else None,
            "driver": facts.get("gpu_driver"), "memory": facts.get("gpu_memory"),
            "torch_sees_cuda": facts.get("cuda_available") == "True"},
    "torch": {"version": facts.get("torch_version"), "cuda": facts.get("torch_cuda"),
              "cudnn": facts.get("torch_cudnn"), "nccl": facts.get("torch_nccl"),
              "dir": facts.get("torch_dir"), "python": facts.get("python")},
    "host": {"hostname": facts.get("hostname"), "cpus": facts.get("cpus"), "os": facts.get("os"),
             "cmake": facts.get("cmake_version"), "cxx": facts.get("cxx_version"), "nvcc": facts.get("nvcc_version")},
    "build": {"dir": facts.get("build_dir"), "deps": facts.get("deps"), "targets": facts.get("build_targets"), "jobs": facts.get("build_jobs"),
              "seconds": num("build_seconds"), "configure_seconds": num("configure_seconds"),
              "smp_with_cuda": facts.get("smp_with_cuda"), "nccl_in_core": facts.get("nccl_in_core"),
              "error_tail": facts.get("build_error")},
    "found": found,
    "steps": steps,
    "ctest_cuda": ctest,
    "bench": bench,
}
tmp = os.path.join(out, "gpu-check.json.tmp")
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.replace(tmp, os.path.join(out, "gpu-check.json"))
PY
}

finish() {
  write_json || true
  echo
  if ((failed)); then
    say "FAILED steps: $(awk -F'\t' '$2 == "failed" {printf "%s ", $1}' "$state/steps.tsv")(see $OUT/gpu-check.json and $log)"
  else
    say "all steps passed or were skipped ($(($(date +%s) - t0)) s); results in $OUT/gpu-check.json"
  fi
  rm -rf "$state"
  # Let tee write the last lines before the caller reads the log.
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null || true
  exit "$failed"
}

fact date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
fact hostname "$(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null || echo '?')"
fact cpus "$(nproc 2>/dev/null || echo '?')"
fact os "$(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-?}" || uname -sr)"
if commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null); then
  fact git_commit "$commit"
  fact git_dirty "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
else
  fact git_commit "${SMP_GIT_COMMIT:-unknown (no .git here; set SMP_GIT_COMMIT)}"
fi
# What was built, also without .git: a digest of the sources.
fact source_digest "$(find abi sdk core plugins adapters launcher examples bench tests cmake CMakeLists.txt \
  -type f \( -name '*.cpp' -o -name '*.c' -o -name '*.h' -o -name '*.hpp' -o -name '*.cmake' -o -name '*.in' \
  -o -name CMakeLists.txt -o -name '*.toml' \) -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0 sha256sum |
  sha256sum | cut -c1-16)"

# ---- a. python with torch, and the GPU --------------------------------------
step_begin "a. python with torch, the GPU"
candidates=()
[[ -n ${SMP_GPU_PYTHON:-} ]] && candidates+=("$SMP_GPU_PYTHON")
candidates+=(python3 /opt/torch/.venv/bin/python /opt/torch/.venv/bin/python3)
for c in "${candidates[@]}"; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' >/dev/null 2>&1; then
    py=$(command -v "$c")
    break
  fi
done
if [[ -z $py ]]; then
  step_end a_torch failed "no python that imports torch (tried: ${candidates[*]}); set SMP_GPU_PYTHON"
  finish
fi
info=$("$py" - <<'PY' 2>/dev/null
import os, torch
print("torch_dir", os.path.dirname(torch.__file__), sep="\t")
print("torch_version", torch.__version__, sep="\t")
print("torch_cuda", torch.version.cuda, sep="\t")
print("cuda_available", torch.cuda.is_available(), sep="\t")
try:
    print("torch_cudnn", torch.backends.cudnn.version(), sep="\t")
except Exception:
    pass
try:
    print("torch_nccl", ".".join(map(str, torch.cuda.nccl.version())), sep="\t")
except Exception:
    pass
if torch.cuda.is_available():
    print("gpu_count", torch.cuda.device_count(), sep="\t")
    print("gpu_name", torch.cuda.get_device_name(0), sep="\t")
PY
) || true
while IFS=$'\t' read -r k v; do [[ -n $k ]] && fact "$k" "$v"; done <<<"$info"
fact python "$py"
torch_dir=$(awk -F'\t' '$1 == "torch_dir" {print $2}' <<<"$info")
[[ $(awk -F'\t' '$1 == "cuda_available" {print $2}' <<<"$info") == True ]] && gpu=1
say "python: $py"
say "torch: $(awk -F'\t' '$1 == "torch_version" {print $2}' <<<"$info") at ${torch_dir:-?}, CUDA $(awk -F'\t' '$1 == "torch_cuda" {print $2}' <<<"$info"), torch.cuda.is_available(): $( ((gpu)) && echo True || echo False)"
if command -v nvidia-smi >/dev/null; then
  smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n1 || true)
  say "nvidia-smi: $smi"
  IFS=',' read -r smi_name smi_driver smi_mem <<<"$smi"
  [[ -n ${smi_driver:-} ]] && { fact gpu_driver "${smi_driver# }"; fact gpu_memory "${smi_mem# }"; }
  ((gpu)) || fact gpu_name "${smi_name:-}"
else
  say "nvidia-smi: not found"
fi
fact cmake_version "$(cmake --version 2>/dev/null | head -n1 || echo missing)"
fact cxx_version "$(c++ --version 2>/dev/null | head -n1 || echo missing)"
command -v nvcc >/dev/null || { [[ -x /usr/local/cuda/bin/nvcc ]] && export PATH=/usr/local/cuda/bin:$PATH; }
fact nvcc_version "$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' || echo missing)"
if [[ -z $torch_dir || ! -f $torch_dir/share/cmake/Torch/TorchConfig.cmake ]]; then
  step_end a_torch failed "torch at '${torch_dir:-?}' has no share/cmake/Torch/TorchConfig.cmake"
  finish
elif ((!gpu && !dry)); then
  step_end a_torch failed "torch.cuda.is_available() is False: no GPU to check (use --dry-run without one)"
else
  step_end a_torch ok "$(awk -F'\t' '$1 == "gpu_name" {print $2}' "$state/facts.tsv" | tail -n1)"
fi

# ---- b. unpack the .deb files into the prefix ---------------------------------
if ((system_deps)); then
  step_begin "b. the system's packages"
else
  step_begin "b. unpack $deps/*.deb into $prefix"
fi
unpack() {
  shopt -s nullglob
  local debs=("$deps"/*.deb)
  shopt -u nullglob
  if ((${#debs[@]} == 0)); then
    echo "no .deb files in $deps: run scripts/gpu/fetch-deps.sh on a Debian bookworm machine with network and carry .gpu-deps"
    return 1
  fi
  # Unpacked once per set of .deb files.
  local stamp
  stamp=layout2-$(cd "$deps" && sha256sum -- *.deb | sha256sum | cut -c1-16)
  if [[ -f $prefix/.smp-stamp && $(cat "$prefix/.smp-stamp") == "$stamp" ]]; then
    say "$prefix already holds these ${#debs[@]} packages"
    return 0
  fi
  # Only a folder this script made (or an empty one) is emptied.
  case $prefix in
    /|/usr|/usr/*|/opt|/home|/root|/tmp) echo "refusing to unpack into $prefix: name a folder of its own (SMP_GPU_PREFIX)"; return 1 ;;
  esac
  if [[ -d $prefix && ! -f $prefix/.smp-stamp && -n $(ls -A "$prefix") ]]; then
    echo "refusing to empty $prefix: not made by this script (no .smp-stamp); remove it or set SMP_GPU_PREFIX"
    return 1
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local d tmp data to
  for d in "${debs[@]}"; do
    to=$(subprefix_of "$(basename "${d%%_*}")")
    mkdir -p "$to"
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$d" "$to" || { echo "dpkg-deb -x $d failed"; return 1; }
    else
      command -v ar >/dev/null || { echo "neither dpkg-deb nor ar (binutils) to unpack $d"; return 1; }
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$d") || { echo "ar x $d failed"; rm -rf "$tmp"; return 1; }
      data=$(compgen -G "$tmp/data.tar*" | head -n1 || true)
      [[ -n $data ]] || { echo "$d holds no data.tar*"; rm -rf "$tmp"; return 1; }
      case $data in
        *.zst) zstd -dc "$data" | tar -x -C "$to" ;;
        *) tar -xf "$data" -C "$to" ;;
      esac || { echo "unpacking $data of $d failed"; rm -rf "$tmp"; return 1; }
      rm -rf "$tmp"
    fi
  done
  # Links to absolute paths (/usr/...) would leave the prefix: point them into
  # the prefix they were unpacked into.
  local l target root
  while IFS= read -r -d '' l; do
    target=$(readlink "$l")
    case $l in
      "$fmt_prefix"/*) root=$fmt_prefix ;;
      "$gloo_prefix"/*) root=$gloo_prefix ;;
      *) root=$prefix ;;
    esac
    ln -sfn "$root$target" "$l"
  done < <(find "$prefix" -type l -lname '/*' -print0)
  echo "$stamp" >"$prefix/.smp-stamp"
  say "unpacked ${#debs[@]} packages ($(du -sh "$prefix" | cut -f1))"
}
if ((system_deps)); then
  step_end b_unpack skipped "the system's packages (--system-deps)"
elif msg=$(unpack 2>&1); then
  [[ -n $msg ]] && echo "$msg"
  missing=()
  for f in usr/include/spdlog/spdlog.h fmt/usr/include/fmt/core.h usr/include/toml++/toml.h usr/include/boost/version.hpp \
           usr/include/boost/dll.hpp usr/include/CLI/CLI.hpp usr/include/nlohmann/json.hpp usr/include/gtest/gtest.h \
           gloo/usr/include/gloo/algorithm.h "fmt/usr/lib/$multiarch/libfmt.so.9" "usr/lib/$multiarch/libspdlog.so" \
           "usr/lib/$multiarch/libboost_filesystem.so" "usr/lib/$multiarch/libgtest.a"; do
    [[ -e $prefix/$f ]] || missing+=("$f")
  done
  [[ ! -e $prefix/usr/include/fmt ]] || missing+=("(fmt belongs in $fmt_prefix, not in $prefix/usr/include)")
  if ((${#missing[@]})); then
    step_end b_unpack failed "missing in $prefix after unpacking: ${missing[*]} (run scripts/gpu/fetch-deps.sh again)"
    finish
  fi
  step_end b_unpack ok "$(find "$deps" -maxdepth 1 -name '*.deb' | wc -l) packages"
else
  echo "$msg"
  step_end b_unpack failed "$(tail -n1 <<<"$msg")"
  finish
fi
((system_deps)) || export LD_LIBRARY_PATH=$libdir:$fmt_prefix/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- c. configure ----------------------------------------------------------------
step_begin "c. configure $build"
# torch's CMake files ignore CMAKE_CUDA_ARCHITECTURES (and say so); they read
# TORCH_CUDA_ARCH_LIST. H200 = compute capability 9.0.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# CMake 4 refuses config files that ask for policies older than 3.5.
export CMAKE_POLICY_VERSION_MINIMUM=${CMAKE_POLICY_VERSION_MINIMUM:-3.5}
# Each dependency's CMake folder named outright (the prefix wins over /usr even
# where CMake would not search lib/<multiarch> of a prefix by itself).
boost_cmake=$(compgen -G "$libdir/cmake/Boost-*" | head -n1 || true)
cmake_args=(
  -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
  "-DCMAKE_PREFIX_PATH=$torch_dir;$torch_dir/share/cmake;$prefix/usr"
  "-DTorch_DIR=$torch_dir/share/cmake/Torch"
  "-Dspdlog_DIR=$libdir/cmake/spdlog"
  "-Dfmt_DIR=$fmt_prefix/usr/lib/$multiarch/cmake/fmt"
  "-Dtomlplusplus_DIR=$libdir/cmake/tomlplusplus"
  "-DBoost_DIR=$boost_cmake"
  "-DBoost_NO_SYSTEM_PATHS=ON"
  "-DCLI11_DIR=$prefix/usr/share/cmake/CLI11"
  "-Dnlohmann_json_DIR=$prefix/usr/share/cmake/nlohmann_json"
  "-DGTest_DIR=$libdir/cmake/GTest"
  "-DSMP_GLOO_INCLUDE_DIR=$gloo_prefix/usr/include"
  -DCMAKE_CUDA_ARCHITECTURES=90
)
if ((system_deps)); then
  cmake_args=(
    -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=$torch_dir;$torch_dir/share/cmake"
    "-DTorch_DIR=$torch_dir/share/cmake/Torch"
    -DCMAKE_CUDA_ARCHITECTURES=90
  )
fi
fact build_dir "$build"
fact deps "$( ((system_deps)) && echo system || echo "$prefix")"
# A build folder configured for another torch or prefix starts again.
if [[ -f $build/CMakeCache.txt ]] &&
   ! grep -qxF "Torch_DIR:PATH=$torch_dir/share/cmake/Torch" "$build/CMakeCache.txt" &&
   ! grep -qxF "Torch_DIR:UNINITIALIZED=$torch_dir/share/cmake/Torch" "$build/CMakeCache.txt"; then
  say "$build was configured for another torch: removing its CMakeCache.txt"
  rm -f "$build/CMakeCache.txt"
elif ((system_deps)) && [[ -f $build/CMakeCache.txt ]] && grep -q "^spdlog_DIR:PATH=$prefix/" "$build/CMakeCache.txt"; then
  say "$build was configured against $prefix: removing its CMakeCache.txt"
  rm -f "$build/CMakeCache.txt"
fi
c_t0=$(date +%s)
if cmake "${cmake_args[@]}" </dev/null; then
  fact configure_seconds $(($(date +%s) - c_t0))
  # Where every dependency was found: all in the prefix, torch in torch's folder.
  cache=$build/CMakeCache.txt
  value() { sed -n "s/^$1:[A-Z]*=//p" "$cache" | head -n1; }
  outside=()
  for v in spdlog_DIR fmt_DIR tomlplusplus_DIR Boost_DIR boost_filesystem_DIR boost_headers_DIR boost_atomic_DIR \
           CLI11_DIR nlohmann_json_DIR GTest_DIR SMP_GLOO_INCLUDE_DIR; do
    p=$(value "$v")
    fact "found.$v" "$p"
    say "  $v = ${p:-(not in the cache)}"
    [[ -n $p ]] || continue  # not every one is cached (boost_atomic_DIR only when loaded)
    ((system_deps)) && continue
    [[ $(readlink -f "$p") == "$prefix"/* || $p == "$prefix"/* ]] || outside+=("$v=$p")
  done
  for v in Torch_DIR TORCH_LIBRARY; do
    p=$(value "$v")
    fact "found.$v" "$p"
    say "  $v = $p"
    [[ $(readlink -f "$p") == "$(readlink -f "$torch_dir")"/* ]] || outside+=("$v=$p")
  done
  if ((!system_deps)); then
    for v in spdlog_DIR Boost_DIR GTest_DIR SMP_GLOO_INCLUDE_DIR; do
      [[ -n $(value "$v") ]] || outside+=("$v unset")
    done
  fi
  if ((${#outside[@]})); then
    step_end c_configure failed "found outside $prefix / torch: ${outside[*]}"
    finish
  fi
  if ((system_deps)); then
    step_end c_configure ok "the system's packages, LibTorch from $torch_dir"
  else
    step_end c_configure ok "every dependency from $prefix, LibTorch from $torch_dir"
  fi
else
  step_end c_configure failed "cmake configure failed (see the log)"
  finish
fi

# ---- d. build ------------------------------------------------------------------------
targets=()
if ((dry)) && [[ ${SMP_GPU_DRY_BUILD:-} == core ]]; then
  targets=(smp_core)
elif [[ ${SMP_GPU_TARGETS:-} == auto ]]; then
  # What steps e and f run, and what they depend on (ninja builds the rest).
  mapfile -t targets < <("$py" - <<'PY'
import glob, re
for f in sorted(glob.glob("tests/**/CMakeLists.txt", recursive=True)):
    for m in re.finditer(r"smp_add_test\(\s*([A-Za-z0-9_.+-]+)([^)]*)\)", open(f).read(), re.S):
        labels = re.search(r'LABELS\s+("[^"]*"|[^\s)]+)', m.group(2))
        if labels and "cuda" in re.split(r'[;"\s]+', labels.group(1)):
            print(m.group(1))
PY
  )
  targets+=(smp-launch smp-worker gpt)
elif [[ -n ${SMP_GPU_TARGETS:-} ]]; then
  read -r -a targets <<<"$SMP_GPU_TARGETS"
fi
step_begin "d. build ${targets[*]:-all} with $jobs jobs"
fact build_targets "${targets[*]:-all}"
fact build_jobs "$jobs"
b_t0=$(date +%s)
set +e
ninja -C "$build" -j "$jobs" "${targets[@]}" 2>&1 | tee "$state/build.log"
rc=${PIPESTATUS[0]}
set -e
fact build_seconds $(($(date +%s) - b_t0))
if ((rc != 0)); then
  fact build_error "$(grep -m 12 -E 'error|Error|FAILED' "$state/build.log" | cut -c1-400 | tr '\n' ' ')"
  step_end d_build failed "ninja exited $rc (first errors in gpu-check.json build.error_tail)"
  finish
fi
# CUDA and NCCL compiled in: smp_core with SMP_WITH_CUDA=1, c10d's ProcessGroupNCCL used.
if grep -q -- '-DSMP_WITH_CUDA=1' "$build/build.ninja"; then with_cuda=yes; else with_cuda=no; fi
core=$(find "$build" -maxdepth 3 -name 'libsmp_core.so*' -type f | head -n1)
if [[ -z $core ]]; then
  nccl="not built"
elif nm -DC "$core" | grep 'ProcessGroupNCCL' >/dev/null; then
  nccl=yes
else
  nccl=no
fi
fact smp_with_cuda "$with_cuda"
fact nccl_in_core "$nccl"
build_s=$(($(date +%s) - b_t0))
if [[ $with_cuda == no || $nccl == no ]]; then
  step_end d_build failed "built in ${build_s} s, but SMP_WITH_CUDA=1: $with_cuda, ProcessGroupNCCL in libsmp_core: $nccl"
else
  step_end d_build ok "${build_s} s; SMP_WITH_CUDA=1: $with_cuda, ProcessGroupNCCL in libsmp_core: $nccl"
fi

# The environment of the programs and tests: the prefix's libraries, and the
# torch/prefix for any CMake project a test configures.
if ((system_deps)); then
  export CMAKE_PREFIX_PATH="$torch_dir:$torch_dir/share/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
else
  export CMAKE_PREFIX_PATH="$torch_dir:$torch_dir/share/cmake:$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
fi

# ---- e. the CUDA tests ----------------------------------------------------------------
step_begin "e. ctest -L cuda"
if ((!gpu)); then
  step_end e_ctest_cuda skipped "no GPU"
elif ((dry)) && [[ ${SMP_GPU_DRY_BUILD:-} == core ]]; then
  step_end e_ctest_cuda skipped "dry run built smp_core only"
else
  # The benchmark needs up to ~4 minutes: ctest gets what is left before that.
  limit=$(($(left) - ${SMP_GPU_BENCH_RESERVE_S:-250}))
  ((limit > 300)) && limit=300
  if ((limit < 30)); then
    step_end e_ctest_cuda failed "only $(left) s of the ${budget} s budget left"
  else
    say "ctest gets at most ${limit} s (budget)"
    set +e
    timeout --kill-after=10 "$limit" ctest --test-dir "$build" -L cuda --no-tests=error --output-on-failure \
      --timeout 120 --output-junit "$OUT/ctest-cuda.xml" -j 1 2>&1 | tee "$state/ctest.log"
    rc=${PIPESTATUS[0]}
    set -e
    fact ctest_exit "$rc"
    # A CUDA test skips only without a GPU: here, a skip means CUDA was not usable.
    skipped=$(grep -c '(Skipped)' "$state/ctest.log" || true)
    if ((rc == 0 && skipped > 0)); then
      step_end e_ctest_cuda failed "$skipped test(s) skipped on a machine with a GPU (CUDA not usable from smp?)"
    elif ((rc == 0)); then
      step_end e_ctest_cuda ok
    elif ((rc == 124 || rc == 137)); then
      step_end e_ctest_cuda failed "ctest stopped after ${limit} s (budget)"
    elif grep -q 'No tests were found' "$state/ctest.log"; then
      step_end e_ctest_cuda failed "no test labelled cuda in $build (were the test programs built?)"
    else
      step_end e_ctest_cuda failed "ctest exited $rc"
    fi
  fi
fi

# ---- f. the benchmark ------------------------------------------------------------------
step_begin "f. benchmark $bench_config"
if ((!gpu)); then
  step_end f_bench skipped "no GPU"
elif ((dry)) && [[ ${SMP_GPU_DRY_BUILD:-} == core ]]; then
  step_end f_bench skipped "dry run built smp_core only"
elif [[ ! -f $bench_config ]]; then
  step_end f_bench failed "$bench_config not found"
elif [[ ! -x $build/bin/smp-launch ]]; then
  step_end f_bench failed "$build/bin/smp-launch not built"
else
  limit=$(($(left) - 15))
  ((limit > 240)) && limit=240
  if ((limit < 30)); then
    step_end f_bench failed "only $(left) s of the ${budget} s budget left"
  else
    run_dir=$(mktemp -d /tmp/smp-bench.XXXXXX)
    extra=()
    # The corpus only feeds token ids; where the config's folder is missing, any text serves.
    data=$(sed -n 's/^data *= *"\(.*\)".*/\1/p' "$bench_config" | head -n1)
    if [[ -n $data && ! -e $data ]]; then
      cat core/src/*/*.cpp core/src/*/*.h >"$run_dir/corpus.txt"
      extra=(--set "model.data=$run_dir/corpus.txt")
      say "$data is missing here: the corpus is smp's own sources ($run_dir/corpus.txt)"
    fi
    fact bench_config "$bench_config"
    say "smp-launch gets at most ${limit} s (budget); run.dir=$run_dir"
    set +e
    timeout --kill-after=10 "$limit" "$build/bin/smp-launch" --nproc-per-node 1 --plugin gpt \
      --config "$bench_config" --set "run.dir=$run_dir" "${extra[@]}" 2>&1 | tee "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    set -e
    fact bench_exit "$rc"
    if [[ -f $run_dir/summary.json ]]; then
      cp "$run_dir/summary.json" "$OUT/bench-summary.json"
      fact bench_summary "$OUT/bench-summary.json"
    fi
    if ((rc == 0)) && [[ -f $run_dir/summary.json ]]; then
      step_end f_bench ok
    else
      fact bench_tail "$(tail -n 15 "$OUT/bench.log" | cut -c1-300)"
      if ((rc == 124 || rc == 137)); then
        step_end f_bench failed "smp-launch stopped after ${limit} s (budget)"
      elif ((rc == 0)); then
        step_end f_bench failed "no $run_dir/summary.json"
      else
        step_end f_bench failed "smp-launch exited $rc"
      fi
    fi
  fi
fi

finish
