#!/usr/bin/env bash
# The GPU check: builds smp for the machine's GPU against its pip torch (CUDA)
# and the Debian packages carried in .gpu-deps/ (scripts/gpu/fetch-deps.sh),
# runs the tests labelled `cuda`, measures smp against PyTorch on the same GPT,
# runs every layout on two ranks sharing the GPU, and writes one JSON.
#
#   bash scripts/gpu/check.sh             # on a machine with a GPU, from anywhere
#   bash scripts/gpu/check.sh --dry-run   # without a GPU: the same logic on the CPU
#   bash scripts/gpu/check.sh --system-deps   # the packages are installed: no .gpu-deps
#
# Steps (each timed and under its own time limit, all within SMP_GPU_BUDGET_S;
# a failed step is recorded and the next one that can still run does; a failed
# configure or build ends the check):
#   a. python with torch (python3, then /opt/torch/.venv/bin/python), the GPU:
#      its compute capability, nvidia-smi's name, clocks and power limit
#   b. unpack .gpu-deps/*.deb into a prefix (dpkg -x; ar + tar without dpkg)
#   c. configure against torch + the prefix for the present GPU only
#      (TORCH_CUDA_ARCH_LIST / CMAKE_CUDA_ARCHITECTURES from its compute
#      capability), checking that every dependency was found in the prefix
#   d. build (the cuda test programs, smp-launch, smp-worker, gpt)
#   e. ctest -L cuda (JUnit to $OUT/ctest-cuda.xml)
#   f. smp against PyTorch eager on bench/configs/gpt-1.3b-bf16.toml, interleaved:
#      smp, eager, smp, eager (smp-launch, 1 rank; bench/gpu/peer_gpt.py, the
#      same GPT written nanoGPT's way: bf16 autocast, SDPA, AdamW(fused=True))
#   g. the layouts on two ranks sharing the GPU over Gloo (bench/gpu/layouts.py):
#      gpipe, 1f1b, interleaved-1f1b (v 2), zb-h1 at pp 2 and ZeRO-3 at dp 2
#      against the serial run; a checkpoint saved and resumed, bit for bit
#   h. torch.compile's peer (per block), if time remains
#   $OUT/gpu-check.json (rewritten after every step, so a killed check leaves
#   one): the GPU, clocks, power limit, versions, each step's status and
#   seconds, MFU (datasheet and measured peak), smp/eager and smp/compile
#   tokens/s (medians), max_memory_allocated, the phases, the layouts, the
#   goals (MFU >= 55% of datasheet, smp/eager >= 1.0, smp/compile >= 0.9).
# The log is $OUT/check.log. Exits non-zero when any step failed.
#
# The dry run (--dry-run) runs steps a and e-h on the CPU with a tiny GPT
# (2 layers, hidden 64, sequence 64) and an existing build folder (BUILD,
# default build/; nothing is configured or built), in well under a minute;
# every field the GPU would fill says "not run: no GPU". CTest runs it
# (tests/gpu: GpuCheck.DryRunWritesEveryField).
#
# Environment:
#   OUT                 where results go (default: <repo>/gpu-out)
#   BUILD               build folder (default: <repo>/build-gpu; dry run: <repo>/build)
#   SMP_GPU_PREFIX      where the .deb files are unpacked (default /tmp/smp-prefix)
#   SMP_GPU_DEPS_DIR    the .deb files (default: <repo>/.gpu-deps)
#   SMP_GPU_PYTHON      the python to use (default: the first of python3,
#                       /opt/torch/.venv/bin/python that imports torch)
#   SMP_GPU_JOBS        build jobs (default: nproc)
#   SMP_GPU_TARGETS     ninja targets to build (default: auto, only the test
#                       programs labelled cuda (smp_add_test(... LABELS
#                       "...;cuda") in tests/), smp-launch, smp-worker and gpt;
#                       `all`: everything)
#   SMP_GPU_ARCH        the compute capability to build for (default: the GPU's,
#                       e.g. 9.0; 9.0 without a GPU)
#   SMP_GPU_BUDGET_S    wall-time budget of the whole check in seconds (default
#                       540: 9 minutes); every step gets at most what is left
#   SMP_GPU_BENCH_CONFIG  the benchmark's config (default bench/configs/gpt-1.3b-bf16.toml)
#   SMP_GPU_BENCH_RESERVE_S  seconds of the budget kept from ctest for the
#                       steps after it (default 300)
#   SMP_GIT_COMMIT      the commit to record when there is no .git to ask
#   SMP_GPU_DRY_RUN=1   the same as --dry-run
#   SMP_GPU_DRY_BUILD=core|all  in a dry run, unpack, configure and build as on a
#                       GPU machine (smp_core only, or everything) instead of
#                       reusing BUILD
#   SMP_GPU_SYSTEM_DEPS=1  the same as --system-deps: use the spdlog, fmt, toml++,
#                       Boost, CLI11, nlohmann-json, GoogleTest and gloo headers
#                       installed on the machine (e.g. bookworm's packages, as
#                       scripts/setup.sh installs them); step b is skipped
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
t0=$(date +%s)

usage() { sed -n '2,69s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
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
# A dry run reuses a build folder (nothing is configured or built) unless
# SMP_GPU_DRY_BUILD asks for the GPU machine's unpack, configure and build.
dry_build=${SMP_GPU_DRY_BUILD:-}
reuse=0
((dry)) && [[ -z $dry_build ]] && reuse=1
if ((reuse)); then
  build=${BUILD:-$repo/build}
else
  build=${BUILD:-$repo/build-gpu}
fi
[[ $build == /* ]] || build=$repo/$build
prefix=${SMP_GPU_PREFIX:-/tmp/smp-prefix}
[[ $prefix == /* ]] || prefix=$repo/$prefix
deps=${SMP_GPU_DEPS_DIR:-$repo/.gpu-deps}
[[ $deps == /* ]] || deps=$repo/$deps
jobs=${SMP_GPU_JOBS:-$(nproc 2>/dev/null || echo 4)}
budget=${SMP_GPU_BUDGET_S:-540}
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
            "phase_seconds", "phase_device_seconds", "mfu_measured_peak", "peak_flops_datasheet_per_rank",
            "peak_basis", "device_name", "parameter_count", "max_memory_allocated", "layout"]
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

# ---- what users compare: smp against PyTorch, MFU, memory, phases, layouts, goals
import statistics

gpu = facts.get("cuda_available") == "True"
NO_GPU = "not run: no GPU"
gpu_name = facts.get("gpu_name") or ""

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError, TypeError):
        return None

def median(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None

# Dense peaks from the datasheets (no sparsity), FLOP/s, by compute dtype; the
# first entry whose name is in the device's name counts. Used only where
# summary.json does not state MFU against the datasheet itself.
DATASHEET = [
    ("GH200", {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 66.9e12}),
    ("H200 NVL", {"bf16": 835.5e12, "fp16": 835.5e12, "fp32": 60.3e12}),
    ("H200", {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 66.9e12}),
    ("H100 NVL", {"bf16": 835.5e12, "fp16": 835.5e12, "fp32": 60.3e12}),
    ("H100 PCIe", {"bf16": 756.5e12, "fp16": 756.5e12, "fp32": 51.2e12}),
    ("H100", {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 66.9e12}),
    ("B200", {"bf16": 2250e12, "fp16": 2250e12, "fp32": 75e12}),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
]

def datasheet_peak(name, precision):
    for key, peaks in DATASHEET:
        if key.lower() in name.lower():
            return peaks.get(precision or "fp32")
    return None

def smp_run(i):
    status = facts.get(f"smp_status_{i}", "not run")
    summary = load(facts.get(f"smp_summary_{i}"))
    run = {"status": status}
    if not summary:
        return run, None
    warm = int(facts.get("bench_warmup", "2"))
    each = summary.get("step_seconds_each") or []
    timed = each[warm:] if len(each) > warm else each
    tokens = summary.get("items_per_step") or (summary.get("tokens_per_s", 0) * summary.get("step_seconds", 0))
    if timed and tokens:
        mean = sum(timed) / len(timed)
        run.update({"tokens_per_step": tokens, "timed_steps": len(timed), "step_ms": statistics.median(timed) * 1e3,
                    "step_ms_each": [x * 1e3 for x in timed], "tokens_per_s": tokens / mean})
    for k in ("tokens_per_s", "mfu", "mfu_measured_peak", "peak_basis", "model_flops_per_s", "peak_flops_per_rank",
              "peak_flops_datasheet_per_rank", "parameter_count", "final_loss", "precision", "device",
              "max_memory_allocated"):
        if k in summary:
            run["summary_" + k] = summary[k]
    mem = summary.get("memory_bytes") or {}
    if isinstance(mem.get("total"), list) and mem["total"]:
        run["memory_bytes_total"] = max(mem["total"])
    return run, summary

def peer_run(name):
    status = facts.get(f"peer_status_{name}", "not run")
    j = load(facts.get(f"peer_{name}"))
    run = {"status": status}
    if j:
        for k in ("tokens_per_s", "step_ms", "step_ms_each", "timed_steps", "timer", "warmup_seconds",
                  "max_memory_allocated", "model_flops_per_s", "attention", "optimizer", "autocast", "compile",
                  "parameters", "device", "torch", "data", "shape"):
            if k in j:
                run[k] = j[k]
    return run

smp_runs, summaries = [], []
for i in (1, 2):
    run, summary = smp_run(i)
    smp_runs.append(run)
    if summary:
        summaries.append(summary)
eager_runs = [peer_run("eager-1"), peer_run("eager-2")]
compile_run = peer_run("compile")
bench_ran = "f_bench" in steps and not steps["f_bench"]["status"].startswith("skipped")

def not_run(step, what):
    if step in steps and steps[step]["status"].startswith("skipped"):
        return "not run: " + steps[step]["status"].split(": ", 1)[-1].replace("not run: ", "")
    if not gpu and not dry:
        return NO_GPU
    return f"not run: {what}"

smp_tps = median([r.get("tokens_per_s") for r in smp_runs])
eager_tps = median([r.get("tokens_per_s") for r in eager_runs])
compile_tps = compile_run.get("tokens_per_s")

def ratio(a, b, step, what):
    if a is not None and b:
        return a / b
    return not_run(step, what)

throughput = {
    "unit": "tokens/s: tokens per step / mean step time after %s warm-up steps; medians over the runs" % facts.get("bench_warmup", "2"),
    "config": facts.get("bench_config"),
    "order": "smp, eager, smp, eager, then compile",
    "smp": {"median_tokens_per_s": smp_tps if smp_tps is not None else not_run("f_bench", "no smp run finished"),
            "runs": smp_runs},
    "eager": {"median_tokens_per_s": eager_tps if eager_tps is not None else not_run("f_bench", "no eager run finished"),
              "runs": eager_runs},
    "compile": dict(compile_run, tokens_per_s=compile_tps if compile_tps is not None else
                    (compile_run["status"] if compile_run["status"].startswith("not run") else not_run("h_compile", compile_run["status"]))),
    "smp_over_eager": ratio(smp_tps, eager_tps, "f_bench", "smp or eager did not finish"),
    "smp_over_compile": ratio(smp_tps, compile_tps, "h_compile", compile_run["status"]),
}

# MFU: summary.json's own figures. Where it has mfu_measured_peak, its mfu is
# against the datasheet peak when peak_flops_datasheet_per_rank is a number
# (else against the measured GEMM peak, as is mfu in summaries without
# mfu_measured_peak); where summary.json has no datasheet figure the check's
# table above gives it: model_flops_per_s / (peak x ranks).
def mfu_of(summary):
    world = (summary.get("layout") or {}).get("world", 1) or 1
    ds_peak = summary.get("peak_flops_datasheet_per_rank")
    if "mfu_measured_peak" in summary:
        measured = summary["mfu_measured_peak"]
        if isinstance(ds_peak, (int, float)) and ds_peak > 0:
            return summary.get("mfu"), measured, "summary.json: mfu (datasheet peak) and mfu_measured_peak"
        src = "summary.json: mfu_measured_peak"
    else:
        measured = summary.get("mfu")
        src = "summary.json: mfu (against its measured GEMM peak)"
    if not gpu:
        return NO_GPU, measured, src
    peak = datasheet_peak(gpu_name, summary.get("precision"))
    fps = summary.get("model_flops_per_s")
    if peak and fps:
        return fps / (peak * world), measured, src + "; datasheet: model_flops_per_s / the check's table"
    return f"not known: no datasheet peak for '{gpu_name}' in the check's table", measured, src

if summaries:
    figures = [mfu_of(x) for x in summaries]
    ds = [f[0] for f in figures]
    mp = [f[1] for f in figures]
    mfu = {"datasheet": median(ds) if median(ds) is not None else ds[0],
           "measured_peak": median(mp) if median(mp) is not None else NO_GPU,
           "source": figures[0][2],
           "datasheet_peak_flops": next((x[k] for x in summaries for k in ("peak_flops_datasheet_per_rank",)
                                         if isinstance(x.get(k), (int, float))), None)
                                   or (datasheet_peak(gpu_name, summaries[0].get("precision")) if gpu else NO_GPU),
           "measured_peak_flops": summaries[0].get("peak_flops_per_rank"),
           "peak_basis": summaries[0].get("peak_basis", "not in summary.json"),
           "device_name": summaries[0].get("device_name", "not in summary.json"),
           "model_flops_per_s": median([x.get("model_flops_per_s") for x in summaries])}
    if mfu["datasheet_peak_flops"] is None:
        mfu["datasheet_peak_flops"] = f"not known: no datasheet peak for '{gpu_name}' in the check's table"
else:
    mfu = {k: not_run("f_bench", "no smp run finished") for k in
           ("datasheet", "measured_peak", "source", "datasheet_peak_flops", "measured_peak_flops", "peak_basis",
            "device_name", "model_flops_per_s")}

def smp_device_bytes():
    if not gpu:
        return NO_GPU
    for x in summaries:
        if "max_memory_allocated" in x:
            return {"bytes": x["max_memory_allocated"], "source": "summary.json max_memory_allocated"}
    totals = [r["memory_bytes_total"] for r in smp_runs if "memory_bytes_total" in r]
    if totals:
        return {"bytes": max(totals), "source": "summary.json memory_bytes.total: smp's account (parameters, "
                "gradients, optimizer state and the CUDA allocator's peak over a step)"}
    return not_run("f_bench", "no smp run finished")

def peer_bytes(runs, step):
    vals = [r.get("max_memory_allocated") for r in runs if isinstance(r.get("max_memory_allocated"), (int, float))]
    if vals:
        return {"bytes": max(vals), "source": "torch.cuda.max_memory_allocated over the timed steps"}
    return NO_GPU if not gpu else not_run(step, "no run finished")

memory = {"smp": smp_device_bytes(), "eager": peer_bytes(eager_runs, "f_bench"),
          "compile": peer_bytes([compile_run], "h_compile")}

# The phases of the last smp run (the GPU warm): host clocks, and device clocks where smp has them.
phases = {}
last = summaries[-1] if summaries else None
if last:
    phases["phase_seconds"] = last.get("phase_seconds", "not in summary.json")
    phases["phase_device_seconds"] = last.get("phase_device_seconds",
                                              "not in summary.json (this smp times its phases on the host only)")
    for k, v in last.items():
        if k.startswith("phase_") and k not in phases:
            phases[k] = v
else:
    phases = {"phase_seconds": not_run("f_bench", "no smp run finished"),
              "phase_device_seconds": not_run("f_bench", "no smp run finished")}

lay = load(facts.get("layouts_json"))
layouts = {"device": lay.get("device"), "shared_gpu_over_gloo": lay.get("shared_gpu_over_gloo"),
           "cases": {k: {kk: vv for kk, vv in v.items() if kk not in ("losses_whole", "losses_resumed", "losses")}
                     for k, v in lay.get("cases", {}).items()}} if lay else not_run("g_layouts", "layouts.py wrote nothing")

# nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv
def smi():
    header = [h.strip() for h in facts.get("smi_header", "").split(",")]
    row = [c.strip() for c in facts.get("smi_row", "").split(",")]
    if len(row) < 4 or not facts.get("smi_row"):
        why = NO_GPU if not gpu else "not known: nvidia-smi gave nothing"
        return {k: why for k in ("name", "clocks_max_sm_mhz", "clocks_sm_mhz", "power_limit_w")}
    def number(x):
        try:
            return float(x.split()[0])
        except (ValueError, IndexError):
            return x  # "[N/A]" and the like, as nvidia-smi wrote it
    return {"name": row[0], "clocks_max_sm_mhz": number(row[1]), "clocks_sm_mhz": number(row[2]),
            "power_limit_w": number(row[3]), "nvidia_smi": dict(zip(header, row))}

def goal(value, target, op):
    if dry:
        met = "not judged: dry run (CPU, tiny GPT)"
    elif not isinstance(value, (int, float)):
        met = value if isinstance(value, str) else "not run"
    else:
        met = value >= target
    return {"value": value, "target": f"{op} {target}", "met": met}

goals = {
    "mfu_datasheet": goal(mfu["datasheet"], 0.55, ">="),
    "smp_over_eager": goal(throughput["smp_over_eager"], 1.0, ">="),
    "smp_over_compile": goal(throughput["smp_over_compile"], 0.9, ">="),
}

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
    "gpu": dict({"name": facts.get("gpu_name") or NO_GPU,
                 "count": int(facts["gpu_count"]) if facts.get("gpu_count", "").isdigit() else (0 if not gpu else None),
                 "compute_capability": facts.get("gpu_capability") or facts.get("smi_capability") or NO_GPU,
                 "driver": facts.get("gpu_driver") or (NO_GPU if not gpu else "not known: nvidia-smi gave nothing"),
                 "memory": facts.get("gpu_memory") or (NO_GPU if not gpu else "not known: nvidia-smi gave nothing"),
                 "torch_sees_cuda": gpu}, **{k: v for k, v in smi().items() if k != "name"},
                smi_name=smi()["name"]),
    "torch": {"version": facts.get("torch_version"), "cuda": facts.get("torch_cuda"),
              "cudnn": facts.get("torch_cudnn"), "nccl": facts.get("torch_nccl"),
              "dir": facts.get("torch_dir"), "python": facts.get("python")},
    "host": {"hostname": facts.get("hostname"), "cpus": facts.get("cpus"), "os": facts.get("os"),
             "cmake": facts.get("cmake_version"), "cxx": facts.get("cxx_version"), "nvcc": facts.get("nvcc_version")},
    "build": {"dir": facts.get("build_dir"), "cuda_arch": facts.get("cuda_arch", NO_GPU if not gpu else None), "deps": facts.get("deps"), "targets": facts.get("build_targets"), "jobs": facts.get("build_jobs"),
              "seconds": num("build_seconds"), "configure_seconds": num("configure_seconds"),
              "smp_with_cuda": facts.get("smp_with_cuda"), "nccl_in_core": facts.get("nccl_in_core"),
              "error_tail": facts.get("build_error")},
    "found": found,
    "goals": goals,
    "mfu": mfu,
    "throughput": throughput,
    "max_memory_allocated": memory,
    "phases": phases,
    "layouts": layouts,
    "steps": steps,
    "ctest_cuda": ctest if ctest is not None else not_run("e_ctest_cuda", "ctest did not run"),
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
fact source_digest "$(find abi sdk core trainer plugins adapters plan convert tools examples bench tests cmake CMakeLists.txt \
  -type f \( -name '*.cpp' -o -name '*.c' -o -name '*.h' -o -name '*.hpp' -o -name '*.cmake' -o -name '*.in' \
  -o -name CMakeLists.txt -o -name '*.toml' \) -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0 sha256sum |
  sha256sum | cut -c1-16)"

# ---- a. python with torch, and the GPU --------------------------------------
step_begin "a. python with torch, the GPU"
if ((dry)); then
  # The dry run is the CPU's, also on a machine with a GPU (its build may be CPU-only).
  export CUDA_VISIBLE_DEVICES=
  say "dry run: CUDA_VISIBLE_DEVICES is empty, torch and smp see no GPU"
fi
candidates=()
[[ -n ${SMP_GPU_PYTHON:-} ]] && candidates+=("$SMP_GPU_PYTHON")
candidates+=(python3 /opt/torch/.venv/bin/python /opt/torch/.venv/bin/python3)
# What torch says (one import: it takes seconds); the first candidate that imports it is used.
torch_info() {
  "$1" - <<'PY' 2>/dev/null
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
print("torch_has_compile", hasattr(torch, "compile"), sep="\t")
if torch.cuda.is_available():
    print("gpu_count", torch.cuda.device_count(), sep="\t")
    print("gpu_name", torch.cuda.get_device_name(0), sep="\t")
    print("gpu_capability", "%d.%d" % torch.cuda.get_device_capability(0), sep="\t")
PY
}
info=
for c in "${candidates[@]}"; do
  if command -v "$c" >/dev/null 2>&1 && info=$(torch_info "$c"); then
    py=$(command -v "$c")
    break
  fi
done
if [[ -z $py ]]; then
  step_end a_torch failed "no python that imports torch (tried: ${candidates[*]}); set SMP_GPU_PYTHON"
  finish
fi
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
  # What the figures depend on: the SM clock the GPU may reach and has now, and the power cap.
  smi_q=$(nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv 2>&1 | head -n2 || true)
  say "nvidia-smi: $(tr '\n' ';' <<<"$smi_q")"
  fact smi_header "$(sed -n 1p <<<"$smi_q")"
  fact smi_row "$(sed -n 2p <<<"$smi_q")"
  smi_cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ' || true)
  [[ $smi_cap =~ ^[0-9]+\.[0-9]+$ ]] && fact smi_capability "$smi_cap"
else
  say "nvidia-smi: not found"
fi
fact cmake_version "$(cmake --version 2>/dev/null | head -n1 || echo missing)"
fact cxx_version "$(c++ --version 2>/dev/null | head -n1 || echo missing)"
command -v nvcc >/dev/null || { [[ -x /usr/local/cuda/bin/nvcc ]] && export PATH=/usr/local/cuda/bin:$PATH; }
fact nvcc_version "$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' || echo missing)"
if ((!reuse)) && [[ -z $torch_dir || ! -f $torch_dir/share/cmake/Torch/TorchConfig.cmake ]]; then
  step_end a_torch failed "torch at '${torch_dir:-?}' has no share/cmake/Torch/TorchConfig.cmake"
  finish
elif ((!gpu && !dry)); then
  step_end a_torch failed "torch.cuda.is_available() is False: no GPU to check (use --dry-run without one)"
elif ((gpu)); then
  step_end a_torch ok "$(awk -F'\t' '$1 == "gpu_name" {print $2}' "$state/facts.tsv" | tail -n1)"
else
  step_end a_torch ok "torch $(awk -F'\t' '$1 == "torch_version" {print $2}' <<<"$info"), no GPU (dry run)"
fi
# The compute capability to build for: the GPU's (torch's answer, else nvidia-smi's).
arch=${SMP_GPU_ARCH:-$(awk -F'\t' '$1 == "gpu_capability" || $1 == "smi_capability" {print $2; exit}' "$state/facts.tsv")}
arch_source=device
if [[ -n ${SMP_GPU_ARCH:-} ]]; then
  arch_source=SMP_GPU_ARCH
elif [[ -z $arch ]]; then
  arch=9.0
  arch_source="no GPU: the default"
fi

# ---- b-d. a dry run reuses a build folder -------------------------------------------
if ((reuse)); then
  step_begin "b-d. reuse $build (dry run: nothing is configured or built)"
  fact build_dir "$build"
  fact build_targets "none (dry run reuses $build)"
  fact cuda_arch "not run: no GPU"
  step_end b_unpack skipped "dry run: reuses $build"
  step_end c_configure skipped "dry run: reuses $build"
  step_t0=$(date +%s)
  if [[ -x $build/bin/smp-launch && -x $build/bin/smp-worker ]]; then
    if grep -q -- '-DSMP_WITH_CUDA=1' "$build/build.ninja" 2>/dev/null; then fact smp_with_cuda yes; else fact smp_with_cuda no; fi
    step_end d_build skipped "dry run: reuses $build (smp-launch and smp-worker there)"
  else
    step_end d_build failed "dry run: $build/bin/smp-launch or smp-worker is not built (build it, or set BUILD)"
    finish
  fi
else
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
# For the present GPU only (step a: its compute capability, e.g. 9.0 for an
# H100/H200): torch's CMake files ignore CMAKE_CUDA_ARCHITECTURES (and say so);
# they read TORCH_CUDA_ARCH_LIST.
export TORCH_CUDA_ARCH_LIST=$arch
cuda_arch=${arch//./}
fact cuda_arch "$arch ($arch_source): TORCH_CUDA_ARCH_LIST=$arch, CMAKE_CUDA_ARCHITECTURES=$cuda_arch"
say "building for compute capability $arch ($arch_source)"
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
  "-DCMAKE_CUDA_ARCHITECTURES=$cuda_arch"
)
if ((system_deps)); then
  cmake_args=(
    -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=$torch_dir;$torch_dir/share/cmake"
    "-DTorch_DIR=$torch_dir/share/cmake/Torch"
    "-DCMAKE_CUDA_ARCHITECTURES=$cuda_arch"
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
if timeout --kill-after=10 120 cmake "${cmake_args[@]}" </dev/null; then
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
if ((dry)) && [[ $dry_build == core ]]; then
  targets=(smp_core)
elif [[ ${SMP_GPU_TARGETS:-} == all ]] || ((dry)); then
  targets=()
elif [[ ${SMP_GPU_TARGETS:-auto} == auto ]]; then
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
# The build may take what the steps after it do not need (they need ~300 s).
limit=$(($(left) - 300))
((limit > 360)) && limit=360
((limit < 120)) && limit=120
say "the build gets at most ${limit} s"
set +e
timeout --kill-after=10 "$limit" ninja -C "$build" -j "$jobs" "${targets[@]}" 2>&1 | tee "$state/build.log"
rc=${PIPESTATUS[0]}
set -e
fact build_seconds $(($(date +%s) - b_t0))
if ((rc == 124 || rc == 137)); then
  step_end d_build failed "ninja stopped after ${limit} s (its time limit)"
  finish
elif ((rc != 0)); then
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
fi  # reuse

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
  n=$(ctest --test-dir "$build" -N -L cuda 2>/dev/null | sed -n 's/^Total Tests: *//p' || true)
  step_end e_ctest_cuda skipped "not run: no GPU (${n:-?} tests labelled cuda in $build)"
elif ((dry)) && [[ $dry_build == core ]]; then
  step_end e_ctest_cuda skipped "dry run built smp_core only"
else
  # The steps after it need ~5 minutes: ctest gets what is left before that.
  limit=$(($(left) - ${SMP_GPU_BENCH_RESERVE_S:-300}))
  ((limit > 150)) && limit=150
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

# ---- f. smp and PyTorch eager, interleaved ---------------------------------------------
# The same config and --set values for both; the dry run shrinks the GPT and runs on the CPU.
warmup=2
bench_sets=()
peer_args=(--warmup "$warmup")
if ((dry)); then
  bench_sets=(model.layers=2 model.hidden=64 model.heads=4 model.seq_len=64 model.vocab=256 train.batch_size=4
              train.steps=5 'run.device="cpu"')
  peer_args+=(--device cpu)
  cap_smp=60 cap_peer=60
else
  peer_args+=(--device cuda)
  cap_smp=150 cap_peer=120
fi
bench_root=$(mktemp -d /tmp/smp-bench.XXXXXX)
# The corpus only feeds token ids; where the config's folder is missing, any text serves.
data=$(sed -n 's/^data *= *"\(.*\)".*/\1/p' "$bench_config" 2>/dev/null | head -n1)
if [[ -n $data && ! -e $data ]]; then
  cat core/src/*/*.cpp core/src/*/*.h >"$bench_root/corpus.txt"
  bench_sets+=("model.data=\"$bench_root/corpus.txt\"")
  say "$data is missing here: the corpus is smp's own sources ($bench_root/corpus.txt)"
fi
steps_cfg=$(sed -n 's/^steps *= *\([0-9]*\).*/\1/p' "$bench_config" 2>/dev/null | head -n1)
for kv in "${bench_sets[@]}"; do [[ $kv == train.steps=* ]] && steps_cfg=${kv#train.steps=}; done
peer_args+=(--steps $(( ${steps_cfg:-8} > warmup ? ${steps_cfg:-8} - warmup : 1 )))
set_args=()
for kv in "${bench_sets[@]}"; do set_args+=(--set "$kv"); done
fact bench_config "$bench_config${bench_sets[*]:+ with ${bench_sets[*]}}"
fact bench_warmup "$warmup"

# run_smp <i>: one smp-launch run; its summary.json becomes $OUT/smp-summary-<i>.json.
run_smp() {
  local i=$1 limit rc dir=$bench_root/smp-$1
  limit=$(($(left) - 20))
  ((limit > cap_smp)) && limit=$cap_smp
  if ((limit < 30)); then
    fact "smp_status_$i" "not run: only $(left) s of the ${budget} s budget left"
    return 1
  fi
  say "smp run $i gets at most ${limit} s; run.dir=$dir"
  set +e
  timeout --kill-after=10 "$limit" "$build/bin/smp-launch" --nproc-per-node 1 --plugin gpt \
    --config "$bench_config" "${set_args[@]}" --set "run.dir=\"$dir\"" 2>&1 | tee "$OUT/smp-$i.log"
  rc=${PIPESTATUS[0]}
  set -e
  fact "smp_exit_$i" "$rc"
  if [[ -f $dir/summary.json ]]; then
    cp "$dir/summary.json" "$OUT/smp-summary-$i.json"
    fact "smp_summary_$i" "$OUT/smp-summary-$i.json"
    if [[ $i == 1 ]]; then
      cp "$dir/summary.json" "$OUT/bench-summary.json"
      fact bench_summary "$OUT/bench-summary.json"
      fact bench_exit "$rc"
    fi
  fi
  if ((rc == 0)) && [[ -f $dir/summary.json ]]; then
    fact "smp_status_$i" ok
    return 0
  fi
  ((rc == 124 || rc == 137)) && fact "smp_status_$i" "failed: stopped after ${limit} s" ||
    fact "smp_status_$i" "failed: smp-launch exited $rc: $(tail -n 3 "$OUT/smp-$i.log" | cut -c1-200 | tr '\n' ' ')"
  return 1
}

# run_peer <name> <cap> [peer args...]: bench/gpu/peer_gpt.py; its JSON becomes $OUT/peer-<name>.json.
run_peer() {
  local name=$1 cap=$2 limit rc
  shift 2
  limit=$(($(left) - 10))
  ((limit > cap)) && limit=$cap
  if ((limit < 20)); then
    fact "peer_status_$name" "not run: only $(left) s of the ${budget} s budget left"
    return 1
  fi
  say "peer $name gets at most ${limit} s"
  set +e
  timeout --kill-after=10 "$limit" "$py" bench/gpu/peer_gpt.py --config "$bench_config" "${set_args[@]}" \
    "${peer_args[@]}" "$@" --out "$OUT/peer-$name.json" 2>&1 | tee "$OUT/peer-$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  fact "peer_exit_$name" "$rc"
  if ((rc == 0)) && [[ -f $OUT/peer-$name.json ]]; then
    fact "peer_$name" "$OUT/peer-$name.json"
    fact "peer_status_$name" ok
    return 0
  fi
  rm -f "$OUT/peer-$name.json"
  ((rc == 124 || rc == 137)) && fact "peer_status_$name" "failed: stopped after ${limit} s" ||
    fact "peer_status_$name" "failed: exited $rc: $(grep -v Warning "$OUT/peer-$name.log" | tail -n 2 | cut -c1-200 | tr '\n' ' ')"
  return 1
}

step_begin "f. smp and PyTorch eager on $bench_config, interleaved, twice each"
if ((!gpu && !dry)); then
  step_end f_bench skipped "not run: no GPU"
elif ((dry)) && [[ $dry_build == core ]]; then
  step_end f_bench skipped "dry run built smp_core only"
elif [[ ! -f $bench_config ]]; then
  step_end f_bench failed "$bench_config not found"
elif [[ ! -x $build/bin/smp-launch ]]; then
  step_end f_bench failed "$build/bin/smp-launch not built"
else
  ok_runs=0
  for i in 1 2; do
    run_smp "$i" && ok_runs=$((ok_runs + 1))
    write_json || true
    run_peer "eager-$i" "$cap_peer" && ok_runs=$((ok_runs + 1))
    write_json || true
  done
  if ((ok_runs == 4)); then
    step_end f_bench ok "smp 2 runs, eager 2 runs"
  else
    step_end f_bench failed "$ok_runs of 4 runs passed (see runs in gpu-check.json)"
  fi
fi

# ---- g. the layouts on two ranks sharing the GPU ---------------------------------------
step_begin "g. every schedule at pp 2, ZeRO-3 at dp 2, checkpoint resume: two ranks$( ((gpu)) && echo " sharing the GPU over Gloo")"
if ((!gpu && !dry)); then
  step_end g_layouts skipped "not run: no GPU"
elif ((dry)) && [[ $dry_build == core ]]; then
  step_end g_layouts skipped "dry run built smp_core only"
else
  limit=$(($(left) - 15))
  ((limit > 150)) && limit=150
  if ((limit < 30)); then
    step_end g_layouts failed "only $(left) s of the ${budget} s budget left"
  else
    say "the layouts get at most ${limit} s"
    set +e
    timeout --kill-after=10 "$limit" "$py" bench/gpu/layouts.py --bin "$build/bin" \
      --device "$( ((gpu)) && echo cuda || echo cpu)" --steps "$( ((gpu)) && echo 4 || echo 3)" \
      --budget-s $((limit - 25)) --job-timeout-s 60 \
      --out "$OUT/layouts.json" 2>&1 | tee "$OUT/layouts.log"
    rc=${PIPESTATUS[0]}
    set -e
    [[ -f $OUT/layouts.json ]] && fact layouts_json "$OUT/layouts.json"
    if ((rc == 0)); then
      step_end g_layouts ok "$(tail -n1 "$OUT/layouts.log" | sed 's/^layouts: //')"
    elif ((rc == 124 || rc == 137)); then
      step_end g_layouts failed "stopped after ${limit} s (budget)"
    else
      step_end g_layouts failed "$(tail -n1 "$OUT/layouts.log" | sed 's/^layouts: //' | cut -c1-300)"
    fi
  fi
fi

# ---- h. torch.compile's peer, if time remains ------------------------------------------
step_begin "h. torch.compile's peer"
if ((!gpu && !dry)); then
  step_end h_compile skipped "not run: no GPU"
elif ((dry)) && [[ $dry_build == core ]]; then
  step_end h_compile skipped "dry run built smp_core only"
elif [[ $(awk -F'\t' '$1 == "torch_has_compile" {print $2}' "$state/facts.tsv") != True ]]; then
  fact peer_status_compile "not run: torch $(awk -F'\t' '$1 == "torch_version" {print $2}' "$state/facts.tsv") has no torch.compile"
  step_end h_compile skipped "torch has no torch.compile"
elif (($(left) < ( dry ? 20 : 90 ))); then
  fact peer_status_compile "not run: only $(left) s of the ${budget} s budget left"
  step_end h_compile skipped "only $(left) s left"
else
  # Each block compiled (regional compilation: the 24 identical blocks share one
  # compile). The dry run traces with dynamo only (backend eager): no code generation.
  if ((dry)); then cargs=(--compile regional --compile-backend eager); else cargs=(--compile regional); fi
  if run_peer compile 300 "${cargs[@]}"; then
    step_end h_compile ok "${cargs[*]}"
  else
    step_end h_compile failed "$(awk -F'\t' '$1 == "peer_status_compile" {v = $2} END {print v}' "$state/facts.tsv")"
  fi
fi
rm -rf "$bench_root"

finish
