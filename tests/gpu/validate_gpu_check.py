#!/usr/bin/env python3
"""Checks a gpu-check.json of scripts/gpu/check.sh: every field a reader
compares is there, holding a value or saying why it has none ("not run: ...",
"not judged: ...", "not in summary.json ...", "not known: ..."), never null.

  python3 tests/gpu/validate_gpu_check.py gpu-out/gpu-check.json [--dry-run]

--dry-run also requires what the dry run must have exercised: every step ok or
skipped, smp and the eager peer twice each and the compile peer once (or
skipped for a torch without torch.compile), every layout case ok, the goals not
judged, and the GPU's fields "not run: no GPU". Exits 1 naming each problem.
"""
import json
import sys

NO_GPU = "not run: no GPU"
REASONS = ("not run", "not judged", "not in summary.json", "not known")

REQUIRED = [
    "date", "dry_run", "status", "failed_steps", "git_commit", "source_digest",
    "gpu.name", "gpu.count", "gpu.compute_capability", "gpu.driver", "gpu.memory", "gpu.torch_sees_cuda",
    "gpu.clocks_max_sm_mhz", "gpu.clocks_sm_mhz", "gpu.power_limit_w",
    "torch.version", "torch.python",
    "build.dir", "build.cuda_arch", "build.targets",
    "goals.mfu_datasheet.value", "goals.mfu_datasheet.target", "goals.mfu_datasheet.met",
    "goals.smp_over_eager.value", "goals.smp_over_eager.target", "goals.smp_over_eager.met",
    "goals.smp_over_compile.value", "goals.smp_over_compile.target", "goals.smp_over_compile.met",
    "mfu.datasheet", "mfu.measured_peak", "mfu.datasheet_peak_flops", "mfu.measured_peak_flops", "mfu.source",
    "throughput.smp.median_tokens_per_s", "throughput.eager.median_tokens_per_s", "throughput.compile.tokens_per_s",
    "throughput.smp_over_eager", "throughput.smp_over_compile", "throughput.smp.runs", "throughput.eager.runs",
    "throughput.compile.status",
    "max_memory_allocated.smp", "max_memory_allocated.eager", "max_memory_allocated.compile",
    "phases.phase_seconds", "phases.phase_device_seconds",
    "layouts", "ctest_cuda",
] + [f"steps.{s}.{k}" for s in ("a_torch", "b_unpack", "c_configure", "d_build", "e_ctest_cuda", "f_bench",
                                "g_layouts", "h_compile") for k in ("status", "seconds")]

LAYOUT_CASES = ["serial", "pp2-gpipe", "pp2-1f1b", "pp2-interleaved-1f1b-v2", "pp2-zb-h1", "dp2-zero3",
                "checkpoint-resume-dp2-zero3"]


def get(doc, path):
    node = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    dry = "--dry-run" in sys.argv
    if len(args) != 1:
        sys.exit(__doc__)
    with open(args[0]) as f:
        doc = json.load(f)
    problems = []

    def need(cond, msg):
        if not cond:
            problems.append(msg)

    for path in REQUIRED:
        try:
            v = get(doc, path)
        except KeyError:
            problems.append(f"{path}: missing")
            continue
        need(v is not None, f"{path}: null (a value, or a string saying why there is none)")
        if isinstance(v, str) and v.startswith("not "):
            need(v.startswith(REASONS), f"{path}: {v!r} is neither a value nor a known reason")

    if dry:
        need(doc.get("dry_run") is True, "dry_run is not true")
        need(doc.get("status") == "ok", f"status {doc.get('status')!r}, failed steps {doc.get('failed_steps')}")
        for path in ("gpu.name", "gpu.compute_capability", "gpu.clocks_max_sm_mhz", "gpu.clocks_sm_mhz",
                     "gpu.power_limit_w", "mfu.datasheet", "max_memory_allocated.smp",
                     "max_memory_allocated.eager", "build.cuda_arch"):
            try:
                need(get(doc, path) == NO_GPU, f"{path}: {get(doc, path)!r}, expected {NO_GPU!r} without a GPU")
            except KeyError:
                pass
        for name, steps in (("smp", 2), ("eager", 2)):
            try:
                runs = get(doc, f"throughput.{name}.runs")
                need(len(runs) == steps and all(r.get("status") == "ok" and r.get("tokens_per_s", 0) > 0 for r in runs),
                     f"throughput.{name}.runs: expected {steps} runs ok with tokens_per_s, got {runs}")
            except KeyError:
                pass
        try:
            comp = get(doc, "throughput.compile")
            need(comp.get("status") == "ok" and comp.get("tokens_per_s", 0) > 0
                 or str(comp.get("status")).startswith("not run: torch"),
                 f"throughput.compile: neither ran nor was skipped for its torch: {comp.get('status')!r}")
            for r in ("smp_over_eager",):
                need(isinstance(get(doc, f"throughput.{r}"), float), f"throughput.{r}: not a number")
            for g in ("mfu_datasheet", "smp_over_eager", "smp_over_compile"):
                need(str(get(doc, f"goals.{g}.met")).startswith("not judged: dry run"),
                     f"goals.{g}.met: {get(doc, f'goals.{g}.met')!r} in a dry run")
            cases = get(doc, "layouts.cases")
            for c in LAYOUT_CASES:
                need(c in cases and cases[c].get("status") == "ok",
                     f"layouts.cases.{c}: {cases.get(c, {}).get('status', 'missing')}")
            need(isinstance(get(doc, "phases.phase_seconds"), dict), "phases.phase_seconds: not smp's phases")
        except KeyError as e:
            problems.append(f"{e.args[0]}: missing")

    if problems:
        print(f"{args[0]}: {len(problems)} problem(s):")
        for p in problems:
            print("  - " + p)
        sys.exit(1)
    print(f"{args[0]}: every field present ({len(REQUIRED)} checked{', dry run' if dry else ''})")


if __name__ == "__main__":
    main()
