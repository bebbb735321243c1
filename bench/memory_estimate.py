#!/usr/bin/env python3
"""The memory estimate against measured memory, GPT at every layout of
bench/configs/memory-layouts.json (the ctest MemoryEstimate.EveryBenchmarkLayoutWithinTenPercent
checks the same layouts on the test model).

For each layout: `smp-launch --estimate-memory` (nothing trained), then the
same job for 3 steps; the measured figure is each rank's memory account in
summary.json (parameters + gradients + optimizer state, which the runtime
counts from the tensors it holds, + the step's peak allocation on the
executor thread, which LibTorch's allocator reports). Compared per rank with
the estimate for its pp coordinate; exits 1 naming every layout and rank
outside the file's tolerance (after writing --out).

  python3 bench/memory_estimate.py [--build build] [--out bench/results/memory-estimate.json]
"""
import argparse, time, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(__file__)


def source_commit():
    """The source tree's commit (bench/source_commit.sh): which code was measured."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(["bash", os.path.join(here, "source_commit.sh")], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--config", default=os.path.join(HERE, "configs", "gpt-bench.toml"))
    ap.add_argument("--layouts", default=os.path.join(HERE, "configs", "memory-layouts.json"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], help="extra override for every job")
    a = ap.parse_args()
    launch = os.path.join(a.build, "bin", "smp-launch")
    plugin = os.path.join(a.build, "lib", "smp", "plugins", "gpt.so")
    spec = json.load(open(a.layouts))
    tolerance = spec["tolerance"]
    base = ["train.steps=3", "run.log_to_file=false", "run.threads=1"] + spec["overrides"] + a.set
    rows, outside = [], []
    for layout in spec["layouts"]:
        name, n = layout["name"], layout["nproc"]
        sets = base + layout["overrides"]
        args = [launch, "--nproc-per-node", str(n), "--threads-per-rank", "1"]
        job = ["--plugin", plugin, "--config", a.config] + sum((["--set", s] for s in sets), [])
        est = subprocess.run(args + ["--estimate-memory"] + job, capture_output=True, text=True)
        if est.returncode != 0:
            sys.exit(f"{name}: estimate failed:\n{est.stdout}\n{est.stderr}")
        estimate = json.loads(est.stdout.strip().splitlines()[-1])
        with tempfile.TemporaryDirectory() as d:
            run = subprocess.run(args + ["--master-port", "0"] + job + ["--set", f"run.dir={d}"], capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"{name}: job failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
            summary = json.load(open(os.path.join(d, "summary.json")))
        acct = summary["memory_bytes"]
        world = summary["layout"]["world"]
        # World rank -> pp coordinate: the default placement (pp,dp,tp) puts pp slowest.
        if not summary["layout"]["placement"].startswith("pp"):
            sys.exit(f"{name}: placement {summary['layout']['placement']}: expected pp slowest")
        per_pp = world // summary["layout"]["pp"]
        worst = 0.0
        ranks = []
        for r in range(world):
            e = estimate["per_pp_rank"][r // per_pp]
            m = {k: acct[k][r] for k in ("parameters", "gradients", "optimizer_state", "step_peak", "total")}
            err = e["total"] / m["total"] - 1
            worst = max(worst, abs(err))
            if abs(err) > tolerance:
                outside.append(f"{name} rank {r}: estimated {e['total']:.0f} B, measured {m['total']:.0f} B ({100*err:+.1f}%)")
            ranks.append({"rank": r, "measured": m, "estimated": {k: e[k] for k in m}, "relative_error": err})
        rows.append({"layout": name, "nproc": n, "sets": sets, "ranks": ranks, "worst_relative_error": worst})
        print(f"{name:28s} measured {max(x['measured']['total'] for x in ranks)/1e6:8.2f} MB  "
              f"estimated {max(x['estimated']['total'] for x in ranks)/1e6:8.2f} MB  worst rank error {100*worst:+.1f}%  "
              f"(step peak measured {max(x['measured']['step_peak'] for x in ranks)/1e6:.2f} "
              f"est {max(x['estimated']['step_peak'] for x in ranks)/1e6:.2f})", flush=True)
    out = {"commit": source_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "what": "smp-launch --estimate-memory vs the measured memory account (summary.json memory_bytes), per rank",
           "config": a.config, "layouts": a.layouts, "overrides": base, "rows": rows,
           "worst_relative_error": max(r["worst_relative_error"] for r in rows),
           "tolerance": tolerance, "met": not outside}
    print(f"worst relative error over every rank of every layout: {100*out['worst_relative_error']:.1f}%")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    if outside:
        sys.exit(f"outside +-{100*tolerance:.0f}%:\n  " + "\n  ".join(outside))

if __name__ == "__main__":
    main()
