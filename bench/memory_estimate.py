#!/usr/bin/env python3
"""The memory estimate against measured memory, GPT at a dozen layouts.

For each layout: `smp-launch --estimate-memory` (nothing trained), then the
same job for 3 steps; the measured figure is each rank's memory account in
summary.json (parameters + gradients + optimizer state, which the runtime
counts from the tensors it holds, + the step's peak allocation on the
executor thread, which LibTorch's allocator reports). Compared per rank with
the estimate for its pp coordinate.

  python3 bench/memory_estimate.py [--build build] [--out bench/results/memory-estimate.json]
"""
import argparse, json, os, subprocess, sys, tempfile

LAYOUTS = [
    ("serial", 1, []),
    ("dp2", 2, ["parallel.dp=2"]),
    ("dp2 zero1", 2, ["parallel.dp=2", "parallel.zero=1"]),
    ("dp2 zero2", 2, ["parallel.dp=2", "parallel.zero=2"]),
    ("dp2 zero3", 2, ["parallel.dp=2", "parallel.zero=3"]),
    ("dp4 zero3 m2", 4, ["parallel.dp=4", "parallel.zero=3", "parallel.microbatches=2"]),
    ("serial checkpoint", 1, ['memory.checkpoint=["transformer_layer"]']),
    ("pp2 1f1b m4", 2, ["parallel.pp=2", "parallel.microbatches=4"]),
    ("pp2 gpipe m4", 2, ["parallel.pp=2", "parallel.microbatches=4", "parallel.schedule=gpipe"]),
    ("pp2 1f1b m8 checkpoint", 2, ["parallel.pp=2", "parallel.microbatches=8", 'memory.checkpoint=["transformer_layer"]']),
    ("tp2", 2, ["parallel.tp=2"]),
    ("pp2 x tp2 m4", 4, ["parallel.pp=2", "parallel.tp=2", "parallel.microbatches=4"]),
    ("pp2 x dp2 zero2 m4", 4, ["parallel.pp=2", "parallel.dp=2", "parallel.zero=2", "parallel.microbatches=4"]),
    ("dp2 bf16 zero1", 2, ["parallel.dp=2", "parallel.zero=1", 'train.precision="bf16"']),
    ("serial attention core", 1, ['memory.checkpoint_attention_core=["transformer_layer"]']),
    ("dp2 bf16 zero3 attention core", 2, ["parallel.dp=2", "parallel.zero=3", 'train.precision="bf16"',
                                          'memory.checkpoint_attention_core=["transformer_layer"]']),
]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "configs", "gpt-bench.toml"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], help="extra override for every job")
    a = ap.parse_args()
    launch = os.path.join(a.build, "bin", "smp-launch")
    plugin = os.path.join(a.build, "lib", "smp", "plugins", "gpt.so")
    base = ["train.steps=3", "train.batch_size=16", "run.log_to_file=false", "run.threads=1"] + a.set
    rows = []
    for name, n, sets in LAYOUTS:
        sets = base + sets
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
        # World rank -> pp coordinate (placement pp,dp,tp: pp slowest).
        per_pp = world // summary["layout"]["pp"]
        worst = 0.0
        ranks = []
        for r in range(world):
            e = estimate["per_pp_rank"][r // per_pp]
            m = {k: acct[k][r] for k in ("parameters", "gradients", "optimizer_state", "step_peak", "total")}
            err = e["total"] / m["total"] - 1
            worst = max(worst, abs(err))
            ranks.append({"rank": r, "measured": m, "estimated": {k: e[k] for k in m}, "relative_error": err})
        rows.append({"layout": name, "nproc": n, "sets": sets, "ranks": ranks, "worst_relative_error": worst})
        print(f"{name:28s} measured {max(x['measured']['total'] for x in ranks)/1e6:8.2f} MB  "
              f"estimated {max(x['estimated']['total'] for x in ranks)/1e6:8.2f} MB  worst rank error {100*worst:+.1f}%  "
              f"(step peak measured {max(x['measured']['step_peak'] for x in ranks)/1e6:.2f} "
              f"est {max(x['estimated']['step_peak'] for x in ranks)/1e6:.2f})", flush=True)
    out = {"what": "smp-launch --estimate-memory vs the measured memory account (summary.json memory_bytes), per rank",
           "config": a.config, "overrides": base, "rows": rows,
           "worst_relative_error": max(r["worst_relative_error"] for r in rows)}
    print(f"worst relative error over every rank of every layout: {100*out['worst_relative_error']:.1f}%")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)

if __name__ == "__main__":
    main()
