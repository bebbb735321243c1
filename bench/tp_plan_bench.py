#!/usr/bin/env python3
"""Tensor parallelism by a plan on unmodified layers against the same model
written with the SDK's tp layers (issue 54): tp 2 under smp-launch, one
thread per rank, bench/tp_plan_worker.cpp (4 blocks of d 256 -> 1024 -> 256,
batch 32, SGD). Interleaved pairs in alternating order; per pair the
throughput ratio sdk / plan of the median step seconds (goal >= 0.97): each
run's median over its steps (after the first) is robust to the bursts of a
shared 2-core VM, which moved whole-loop times by a quarter either way. The
loop's total seconds are kept beside them.

  python3 bench/tp_plan_bench.py --build build --pairs 10 --steps 200 --out bench/results/tp-plan.json
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import tempfile

import re
import sys

from program_bench import loadavg, source_commit, start
from validity import Validity


def run(build, kinds, steps):
    d = tempfile.mkdtemp(prefix="smp-tp-plan-bench-")
    cmd = [os.path.join(build, "bin", "smp-launch"), "--nproc-per-node", "2", "--threads-per-rank", "1",
           "--master-port", "0", "--worker", os.path.join(build, "bin", "tp_plan_worker"), "--", "--kinds", kinds,
           "--steps", str(steps), "parallel.tp=2", "run.threads=1", "run.log_to_file=false", f"run.dir={d}"]
    p = start(cmd)
    out, _ = p.communicate()
    if p.returncode != 0:
        sys.exit(f"tp_plan_worker --kinds {kinds} failed ({p.returncode})\n{out[-3000:]}")
    total = re.search(r"train seconds ([0-9.eE+-]+)", out)
    median = re.search(r"median step seconds ([0-9.eE+-]+)", out)
    if not total or not median:
        sys.exit(f"tp_plan_worker --kinds {kinds}: no 'train seconds' / 'median step seconds' line\n{out[-3000:]}")
    return {"median_step_seconds": float(median.group(1)), "loop_seconds": float(total.group(1))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    load_start = loadavg()
    run(build, "sdk", 5), run(build, "plan", 5)  # warm the page cache
    validity = Validity()
    pairs = []
    for k, s, p in validity.alternating_pairs(a.pairs, "sdk layers", lambda: run(build, "sdk", a.steps),
                                              "plan", lambda: run(build, "plan", a.steps)):
        r = s["median_step_seconds"] / p["median_step_seconds"]
        pairs.append({"sdk_median_step_seconds": s["median_step_seconds"], "plan_median_step_seconds":
                      p["median_step_seconds"], "sdk_loop_seconds": s["loop_seconds"],
                      "plan_loop_seconds": p["loop_seconds"], "plan_over_sdk_throughput": r,
                      "loop_ratio": s["loop_seconds"] / p["loop_seconds"]})
        print(f"pair {k + 1}: median step sdk {1e3 * s['median_step_seconds']:.3f} ms, plan "
              f"{1e3 * p['median_step_seconds']:.3f} ms, throughput ratio {r:.3f} (loops {pairs[-1]['loop_ratio']:.3f})",
              flush=True)
    ratios = [p["plan_over_sdk_throughput"] for p in pairs]
    result = {
        "benchmark": "tp 2: a plan on unmodified torch::nn::Linear layers against the SDK's tp layers",
        "commit": source_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_start": load_start,
                    "load_at_end": loadavg()},
        "method": (f"{a.steps} steps of bench/tp_plan_worker.cpp (4 MLP blocks 256 -> 1024 -> 256, batch 32, SGD) "
                   "at tp 2 under smp-launch, one thread per rank; each run's median step seconds (steps after "
                   f"the first, the first rank line printed). {a.pairs} interleaved pairs, order alternating; ratio = sdk median / "
                   "plan median; median of the per-pair ratios. Loop seconds kept as loop_ratio. Not run on a GPU."),
        "pairs": pairs,
        "ratios": ratios,
        "plan_over_sdk_throughput_median": statistics.median(ratios),
        "loop_ratio_median": statistics.median(p["loop_ratio"] for p in pairs),
        "goal": 0.97,
        "validity": validity.json(),
    }
    print(f"plan / sdk throughput, median {result['plan_over_sdk_throughput_median']:.3f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
